"""Hidden Token Attribution (paper section 5, Figs. 3-4): exact by forward mode, or estimated."""

from identifiable.attribution.api import HTAResult, hidden_token_attribution
from identifiable.attribution.contributions import contribution_stderr, contributions
from identifiable.attribution.jacobian import JacobianNorms, LayerFn, jacobian_sq_norms
from identifiable.attribution.memory import DEFAULT_MEMORY_BUDGET, ModelDims, plan_chunk_size
from identifiable.attribution.reference import reverse_mode_sq_norms

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "HTAResult",
    "JacobianNorms",
    "LayerFn",
    "ModelDims",
    "contribution_stderr",
    "contributions",
    "hidden_token_attribution",
    "jacobian_sq_norms",
    "plan_chunk_size",
    "reverse_mode_sq_norms",
]
