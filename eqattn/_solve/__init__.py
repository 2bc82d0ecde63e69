from ._adjoints import (
    AbstractAdjoint as AbstractAdjoint,
    ImplicitAdjoint as ImplicitAdjoint,
    JacobianFree as JacobianFree,
    JaxoptImplicit as JaxoptImplicit,
    Phantom as Phantom,
    SharedInverse as SharedInverse,
    Unrolled as Unrolled,
)
from ._backends import ForwardSolve as ForwardSolve, JaxoptSolver as JaxoptSolver
from ._equilibrium import RESULTS as RESULTS, Equilibrium as Equilibrium
from ._fixed_point import fixed_point as fixed_point
from ._jacobian import jacobian_frobenius as jacobian_frobenius, spectral_radius as spectral_radius
from ._linear import (
    GMRES as GMRES,
    AbstractKrylov as AbstractKrylov,
    BiCGStab as BiCGStab,
    NormalCG as NormalCG,
)
from ._solvers import (
    AbstractFixedPointSolver as AbstractFixedPointSolver,
    Anderson as Anderson,
    Broyden as Broyden,
    Picard as Picard,
)
