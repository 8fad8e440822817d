"""Family quirks (models/quirks.py): each object does its one job on tensors and modules, the
table's odd families hold them, and a spec naming a removed flag fails when it is made."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from identifiable.models import ArchSpec, find_spec
from identifiable.models.hooks import HookSet
from identifiable.models.quirks import (
    AT_OUT_PROJ,
    BATCH_FIRST,
    FAIRSEQ,
    SEQUENCE_FIRST,
    BlockOutput,
    LayerGroups,
    Segments,
    Tower,
)
from identifiable.models.specs import SEQ2SEQ_SPECS, SPECS


def test_axes_turn_each_layout_batch_first():
    hidden = torch.arange(2 * 3 * 4.0).reshape(3, 2, 4)  # [n, B, d]
    maps = torch.rand(3, 5, 2, 4)  # [n, n_k, B, H]
    assert torch.equal(SEQUENCE_FIRST.batch_first(hidden), hidden.transpose(0, 1))
    assert torch.equal(SEQUENCE_FIRST.maps_batch_first(maps)[1, 2], maps[:, :, 1, 2])
    assert torch.equal(FAIRSEQ.batch_first(hidden), hidden.transpose(0, 1))
    assert FAIRSEQ.maps_batch_first(maps) is maps  # FSMT's maps are batch-first already
    assert BATCH_FIRST.batch_first(hidden) is hidden and BATCH_FIRST.maps_batch_first(maps) is maps
    assert torch.equal(SEQUENCE_FIRST.first_sequence(hidden), hidden[:, 0])
    assert torch.equal(BATCH_FIRST.first_sequence(hidden), hidden[0])
    flat = hidden.reshape(6, 4)  # OPT's flattened (batch, token) rows stay as they are
    assert SEQUENCE_FIRST.first_sequence(flat) is flat


class _Block(nn.Module):
    """W_O inside the forward, then a dropout called on the maps (4-D) and the output (3-D)."""

    def __init__(self) -> None:
        super().__init__()
        self.o = nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dropout(torch.ones(1, 1, 2, 2))
        return self.dropout(self.o(x)) + 1


def test_block_output_reads_out_proj_or_a_modules_3d_input():
    block, x = _Block().eval(), torch.rand(1, 3, 4)
    for where, module in ((AT_OUT_PROJ, block.o), (BlockOutput("dropout"), block.dropout)):
        got: list[torch.Tensor] = []
        with HookSet() as hooks:
            where.hook(hooks, module, got.append)
            block(x)
        assert len(got) == 1 and torch.equal(got[0], block.o(x))
        assert block.get_submodule(where.path("o")) is module
    assert AT_OUT_PROJ.at_out_proj and not BlockOutput("dropout").at_out_proj


class _Grouped(nn.Module):
    def __init__(self, config: object | None) -> None:
        super().__init__()
        inner = [nn.Linear(2, 2) for _ in range(4)]
        self.groups = nn.ModuleList([nn.Module() for _ in range(2)])  # G = 2 groups of 2
        for g, group in enumerate(self.groups):
            group.layers = nn.ModuleList(inner[2 * g : 2 * g + 2])
        if config is not None:
            self.config = config


def test_layer_groups_run_shared_layers_once_per_depth():
    stack = _Grouped(type("C", (), {"num_hidden_layers": 4})())
    listed = list(stack.groups)
    runs = LayerGroups("layers").runs(listed, stack)
    g0, g1 = list(stack.groups[0].layers), list(stack.groups[1].layers)
    assert runs == [*g0, *g0, *g1, *g1]  # run i: group ⌊i·G/L⌋, every layer inside
    # ungrouped stacks need no config (FSMT's stacks have none)
    assert LayerGroups().runs(listed, _Grouped(None)) == listed


def test_segments_and_tower():
    one, two = (type("C", (), {"type_vocab_size": k})() for k in (1, 2))
    assert not Segments().passed(one) and Segments().passed(two)
    assert Segments(compared=True).passed(object())  # XLNet: no type_vocab_size
    base = nn.Module()
    base.vision_model = nn.Linear(1, 1)
    assert Tower("vision_model").of(base) is base.vision_model
    own = nn.Linear(1, 1)  # transformers 4.x CLIPVisionModel: its own tower
    assert Tower("vision_model").of(own) is own
    assert Tower().of(base) is base


def test_the_odd_families_hold_their_quirks_and_only_they():
    singles = {s.name: s for s in SPECS}
    pairs = {p.name: p for p in SEQ2SEQ_SPECS}
    odd = {
        s.name
        for s in (*SPECS, *(x for p in SEQ2SEQ_SPECS for x in (p.encoder, p.decoder, p.cross)))
        if (s.axes, s.block_output, s.layer_groups, s.segments, s.tower)
        != (BATCH_FIRST, AT_OUT_PROJ, LayerGroups(), Segments(), Tower())
    }
    assert odd == {"xlnet", "albert", "clip-vision", "fsmt-encoder", "fsmt-decoder", "fsmt-cross"}
    xlnet = singles["xlnet"]
    assert xlnet.axes == SEQUENCE_FIRST and xlnet.block_output.at == "rel_attn.dropout"
    assert xlnet.segments.compared and find_spec("albert").layer_groups.path == "albert_layers"
    assert pairs["fsmt"].encoder.axes == FAIRSEQ and singles["clip-vision"].tower.path


@pytest.mark.parametrize("flag", ["norm", "sequence_first", "batch_first_maps", "block_output_at"])
def test_a_removed_flag_fails_when_the_spec_is_made(flag):
    with pytest.raises(TypeError, match=flag):
        ArchSpec("x", ("x",), "h", "v", "o", **{flag: True})
