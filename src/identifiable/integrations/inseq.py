"""Adapters to the tools researchers already use beside identifiable.

* bertviz: every result with a `[layer, head, query, key]` array has `to_bertviz(field)`
  (see `identifiable.results.Result.to_bertviz`), so
  `bertviz.head_view(eff.to_bertviz("effective"), eff.tokens)` shows effective attention.
* inseq: `register_inseq()` adds two attribution methods to inseq's own registry,
  "effective_attention" and "hidden_token_attribution", so that
  `inseq.load_model(hf_model, "effective_attention").attribute(text)` works like
  inseq's built-in "attention" method, with effective attention in place of the raw one.

Both are optional extras; nothing here is imported by the rest of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from identifiable.errors import IdentifiableError

if TYPE_CHECKING:  # models load torch: imported when an adapter runs
    from identifiable.models.protocol import TracedModel

INSEQ_METHODS = ("effective_attention", "hidden_token_attribution")
INSEQ_MISSING = (
    "inseq is not installed: pip install 'identifiable[inseq]' (inseq 0.7.1 needs "
    "typeguard<=2.13.3, which rules out the 'lens' extra's transformer-lens in one environment)"
)
_REGISTERED: dict[str, type] = {}


def register_inseq() -> tuple[str, ...]:
    """Register identifiable's methods with inseq (idempotent); returns their names.

    The classes subclass inseq's `AttentionWeightsAttribution` (the "attention" method):
    inseq's registry finds methods through subclasses of `InternalsAttributionRegistry`,
    keyed by `method_name`. Each step traces the step's token ids with
    `identifiable.models.Model` (which wraps inseq's own Hugging Face model, no copy) and
    returns scores in the layout inseq's "attention" method uses:
    `[batch, key, query, layer, head]` for effective attention and
    `[batch, input token, hidden token, layer]` for HTA (layer l: the output of block l, from 0).
    Batches must be unpadded (one text, or texts of equal length).
    """
    if _REGISTERED:
        return tuple(_REGISTERED)
    try:
        from inseq.attr.feat.internals_attribution import AttentionWeightsAttribution
    except ImportError:
        raise IdentifiableError(INSEQ_MISSING) from None

    class EffectiveAttentionAttribution(AttentionWeightsAttribution):  # type: ignore[misc, valid-type]
        """Effective attention (paper variant) of every layer and head, via identifiable."""

        method_name = "effective_attention"

        def __init__(self, attribution_model: Any, **kwargs: Any) -> None:
            super().__init__(attribution_model, **kwargs)
            self._idf_model = _wrap(attribution_model)

        def attribute_step(self, attribute_fn_main_args: dict, attribution_args: dict) -> Any:
            out = super().attribute_step(attribute_fn_main_args, attribution_args)
            scores = _step_scores(self._idf_model, attribute_fn_main_args, _effective)
            out.target_attributions = scores.to(out.target_attributions.dtype)
            return out

    class HiddenTokenAttribution(AttentionWeightsAttribution):  # type: ignore[misc, valid-type]
        """Hidden Token Attribution c^l_{i,j} (the k-probe estimator, 16 probes by default)."""

        method_name = "hidden_token_attribution"

        def __init__(self, attribution_model: Any, probes: int | None = 16, **kwargs: Any):
            super().__init__(attribution_model, **kwargs)
            self._idf_model = _wrap(attribution_model)
            self._probes = probes

        def attribute_step(self, attribute_fn_main_args: dict, attribution_args: dict) -> Any:
            from inseq.data import MultiDimensionalFeatureAttributionStepOutput

            def hta(model: TracedModel, ids: Any) -> Any:
                from identifiable.attribution import hidden_token_attribution

                res = hidden_token_attribution(model, ids, probes=self._probes, progress=False)
                return res.contributions.permute(2, 1, 0)  # [key j, token i, layer]

            scores = _step_scores(self._idf_model, attribute_fn_main_args, hta)
            return MultiDimensionalFeatureAttributionStepOutput(
                source_attributions=None, target_attributions=scores, _num_dimensions=1
            )

    _REGISTERED.update(
        {
            "effective_attention": EffectiveAttentionAttribution,
            "hidden_token_attribution": HiddenTokenAttribution,
        }
    )
    return tuple(_REGISTERED)


def _wrap(attribution_model: Any) -> TracedModel:
    from identifiable.models import Model

    model = getattr(attribution_model, "model", None)
    if model is None:
        raise IdentifiableError("this inseq model has no Hugging Face model to trace")
    traced = Model.from_hf(model, getattr(attribution_model, "tokenizer", None))
    if not isinstance(traced, Model):
        raise IdentifiableError(
            "identifiable's inseq methods trace one self-attention stack; for an "
            "encoder–decoder model use identifiable.load_model(...).encoder directly"
        )
    return traced


def _effective(model: TracedModel, ids: Any) -> Any:
    from identifiable.attention import effective_attention

    eff = effective_attention(model.trace(ids))
    return eff.effective.permute(3, 2, 0, 1)  # [L, H, q, k] → [k, q, L, H], as inseq's


def _step_scores(model: TracedModel, main_args: dict, fn: Any) -> Any:
    """`fn(model, ids)` for each text of the step's batch, stacked on a batch axis."""
    import torch

    extra: Sequence[Any] = main_args.get("additional_forward_args") or ()
    ids = extra[0] if extra else main_args["inputs"][0]
    mask = extra[3] if len(extra) > 3 else None
    if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
        raise IdentifiableError(
            "identifiable's inseq methods need unpadded batches: attribute one text at a time"
        )
    return torch.stack([fn(model, row.detach().cpu()) for row in ids])
