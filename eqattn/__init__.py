"""eqattn: equilibrium attention in JAX."""

import importlib.metadata

from . import nn as nn
from ._attention import (
    Tiling as Tiling,
    attention as attention,
    attention_weights as attention_weights,
    attention_with_lse as attention_with_lse,
    log_normalizer as log_normalizer,
    merge_heads as merge_heads,
    select_implementation as select_implementation,
    split_heads as split_heads,
)
from ._errors import GraphError as GraphError
from ._graph import (
    Graph as Graph,
    check_graph as check_graph,
    graph_attention as graph_attention,
    graph_attention_with_lse as graph_attention_with_lse,
    segment_logsumexp as segment_logsumexp,
    segment_softmin as segment_softmin,
    soft_shortest_paths as soft_shortest_paths,
)
from ._hopfield import hopfield_energy as hopfield_energy, hopfield_update as hopfield_update
from ._info import info as info
from ._measures import (
    AbstractCarrier as AbstractCarrier,
    Discrete as Discrete,
    Gaussian as Gaussian,
    GaussianMixture as GaussianMixture,
)
from ._renorm import renormalize as renormalize, standardize_tokens as standardize_tokens
from ._solve import (
    RESULTS as RESULTS,
    AbstractAdjoint as AbstractAdjoint,
    AbstractFixedPointSolver as AbstractFixedPointSolver,
    Anderson as Anderson,
    Broyden as Broyden,
    Equilibrium as Equilibrium,
    ForwardSolve as ForwardSolve,
    ImplicitAdjoint as ImplicitAdjoint,
    JacobianFree as JacobianFree,
    JaxoptImplicit as JaxoptImplicit,
    JaxoptSolver as JaxoptSolver,
    Phantom as Phantom,
    Picard as Picard,
    SharedInverse as SharedInverse,
    Unrolled as Unrolled,
    fixed_point as fixed_point,
    jacobian_frobenius as jacobian_frobenius,
    spectral_radius as spectral_radius,
)


def _version() -> str:
    """The installed distribution's version; for a source tree on `PYTHONPATH` that was never
    installed (no metadata), its `pyproject.toml`'s with the local label `+source`."""
    try:
        return importlib.metadata.version("eqattn")
    except importlib.metadata.PackageNotFoundError:
        import pathlib
        import tomllib

        pyproject = pathlib.Path(__file__).parent.parent / "pyproject.toml"
        if not pyproject.is_file():
            return "0+unknown"
        return tomllib.loads(pyproject.read_text())["project"]["version"] + "+source"


__version__ = _version()
