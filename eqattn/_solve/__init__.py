"""Fixed points and their derivatives: `fixed_point`, eqattn's solvers (one shared loop), the
backends that run other libraries' solvers, the adjoints and the `Equilibrium` result.

The names below are the public API (re-exported by `eqattn`) and, after it, this package's
internal interface for the other floors of eqattn (`nn`, `train`, the tasks); nothing outside this
package imports its modules.
"""

from ._adjoints import (
    AbstractAdjoint as AbstractAdjoint,
    ImplicitAdjoint as ImplicitAdjoint,
    JacobianFree as JacobianFree,
    JaxoptImplicit as JaxoptImplicit,
    Phantom as Phantom,
    SharedInverse as SharedInverse,
    Unrolled as Unrolled,
)
from ._backends import (
    ForwardSolve as ForwardSolve,
    JaxoptSolver as JaxoptSolver,
    Solver as Solver,
    solver_backend as solver_backend,
    tolerances as tolerances,
)
from ._equilibrium import (
    RESULTS as RESULTS,
    Equilibrium as Equilibrium,
    choose as choose,
    status as status,
)
from ._fixed_point import default_adjoint as default_adjoint, fixed_point as fixed_point
from ._jacobian import jacobian_frobenius as jacobian_frobenius, spectral_radius as spectral_radius
from ._named import (
    ADJOINTS as ADJOINTS,
    SOLVERS as SOLVERS,
    named_adjoint as named_adjoint,
    named_solver as named_solver,
)
from ._precision import precision_rtol as precision_rtol
from ._solvers import (
    AbstractFixedPointSolver as AbstractFixedPointSolver,
    Anderson as Anderson,
    Broyden as Broyden,
    Picard as Picard,
)
