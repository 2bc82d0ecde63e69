"""eqattn: equilibrium attention in JAX."""

import importlib.metadata

from . import nn as nn
from ._attention import (
    attention as attention,
    attention_weights as attention_weights,
    attention_with_lse as attention_with_lse,
    log_normalizer as log_normalizer,
    merge_heads as merge_heads,
    split_heads as split_heads,
)
from ._core import Tiling as Tiling
from ._hopfield import hopfield_energy as hopfield_energy, hopfield_update as hopfield_update
from ._implementation import select_implementation as select_implementation
from ._measures import (
    AbstractCarrier as AbstractCarrier,
    Discrete as Discrete,
    Gaussian as Gaussian,
    GaussianMixture as GaussianMixture,
)
from ._renorm import renormalize as renormalize, standardize_tokens as standardize_tokens
from ._solve import (
    GMRES as GMRES,
    RESULTS as RESULTS,
    AbstractAdjoint as AbstractAdjoint,
    AbstractFixedPointSolver as AbstractFixedPointSolver,
    AbstractKrylov as AbstractKrylov,
    Anderson as Anderson,
    BiCGStab as BiCGStab,
    Broyden as Broyden,
    Equilibrium as Equilibrium,
    Forward as Forward,
    ImplicitAdjoint as ImplicitAdjoint,
    JacobianFree as JacobianFree,
    JaxoptImplicit as JaxoptImplicit,
    JaxoptSolver as JaxoptSolver,
    NormalCG as NormalCG,
    Phantom as Phantom,
    Picard as Picard,
    SharedInverse as SharedInverse,
    Unrolled as Unrolled,
    fixed_point as fixed_point,
    jacobian_frobenius as jacobian_frobenius,
    spectral_radius as spectral_radius,
)

__version__ = importlib.metadata.version("eqattn")
