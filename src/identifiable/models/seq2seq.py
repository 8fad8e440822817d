"""Encoder–decoder models (T5, mT5, BART, mBART, Marian): three traces per sequence pair.

One forward pass of a (source, target) pair gives three kinds of attention, each
captured as its own `Trace` so that every analysis written for encoder-only and
decoder-only models applies unchanged:

- `encoder`: the encoder's self-attention over the n_s source tokens (all keys);
- `decoder`: the decoder's causal self-attention over the n_t decoder tokens;
- `cross`: the decoder's cross-attention. Row i is decoder token i, the keys are
  the encoder's n_s output vectors E_enc, so A is `[n_t, n_s]` and
  T = E_enc·W_V·H is `[n_s, d]`: rank, null space and effective attention live
  over the encoder length (docs/definitions.md#cross-attention).

`verify()` proves each of the three captures. The encoder alone is also a plain
`Model` (`Seq2SeqModel.encoder`), which is where Hidden Token Attribution runs:
a decoder hidden state depends on two input sequences, for which the paper's
attribution (one input sequence) is not defined.

The names live where the parts do: `Seq2SeqModel` in models/model.py (beside `Model`,
composed of three `AttentionStack`s), `Seq2SeqSpec` and `SEQ2SEQ_SPECS` with every other
family in models/specs.py, `Seq2SeqTrace` beside `Trace` in models/trace.py.
"""

from __future__ import annotations

from identifiable.models.model import Seq2SeqModel
from identifiable.models.specs import SEQ2SEQ_SPECS, Seq2SeqSpec, find_seq2seq_spec
from identifiable.models.trace import Seq2SeqTrace

__all__ = ["SEQ2SEQ_SPECS", "Seq2SeqModel", "Seq2SeqSpec", "Seq2SeqTrace", "find_seq2seq_spec"]
