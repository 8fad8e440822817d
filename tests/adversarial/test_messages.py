"""What refusals and outputs say: one rule for the API and the CLI (workers, threads, rows,
layers, heads), flags to CLI users and arguments to Python users, advice that fits what
the caller chose, the limit that really limits a text, defaults named as defaults, and
tables printed whole into a file."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from identifiable.attention import interval_map
from identifiable.errors import IdentifiableError

TEXT = "the cat sat on the mat. the dog sat on the log, and the bird sat on the cat"


@pytest.fixture(scope="module")
def trace(tiny_model):
    return tiny_model("bert").trace(TEXT)


# ---- one rule for the API and the CLI -------------------------------------------------------

PARITY = [
    ({"workers": 0}, ["--workers", "0"], "workers=0 must be at least 1", "--workers 0 must be"),
    ({"threads": 0}, ["--threads", "0"], "threads=0 must be at least 1", "--threads 0 must be"),
    ({"rows": [99]}, ["--row", "99"], "rows= holds 99, out of range",
     "--row 99 is out of range: valid rows are 0.."),
    ({"layers": [7]}, ["--layer", "7"], "layers= holds 7, out of range",
     "--layer 7 is out of range: valid layers are 0..1"),
    ({"heads": [9]}, ["--head", "9"], "heads= holds 9, out of range",
     "--head 9 is out of range: valid heads are 0..3"),
    ({"time_budget": -1.0}, ["--time-budget", "-1"], "time_budget=-1 must be a finite number",
     "--time-budget -1 must be a finite number"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "flags", "python", "cli"), PARITY, ids=[p[2] for p in PARITY])
def test_interval_map_and_certify_refuse_by_the_same_rule(
    ws, model_dir, trace, kwargs, flags, python, cli
) -> None:
    with pytest.raises(IdentifiableError) as info:
        interval_map(trace, **kwargs)
    assert str(info.value).startswith(python), str(info.value)
    out = ws.refused(["certify", TEXT, "--model", str(model_dir), *flags], cli)
    assert "=" not in out.err.split("error:")[1].split(",")[0]  # a flag, not an argument


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"rows": []}, "rows= is empty"),  # the case: it returned silently
        ({"layers": []}, "layers= is empty"),
        ({"heads": []}, "heads= is empty"),
        ({"rows": [0, 0]}, "rows= repeats an index"),
        ({"rows": "0"}, "rows= takes a list of integers"),
        ({"workers": True}, "workers= takes a whole number"),
        ({"workers": 2.0}, "workers= takes a whole number"),
    ],
)
def test_empty_and_malformed_selections_are_refused_alike(trace, kwargs, expect) -> None:
    with pytest.raises(IdentifiableError, match=expect):
        interval_map(trace, **kwargs)


def test_flow_workers_follow_the_same_rule(ws, model_dir, tiny_model) -> None:
    from identifiable.mixing import context_mixing

    ws.refused(
        ["mixing", "x", "--model", str(model_dir), "--method", "flow", "--workers", "0"],
        "--workers 0 must be at least 1",
    )
    with pytest.raises(IdentifiableError, match=r"^workers=0 must be at least 1$"):
        context_mixing(tiny_model("bert"), "the cat sat", "flow", workers=0)


# ---- advice that fits the caller's choice ----------------------------------------------------


def test_a_time_budget_refusal_never_advises_one_head_to_one_head(ws, model_dir, trace) -> None:
    with pytest.raises(IdentifiableError) as one:
        interval_map(trace, layers=[0], heads=[0], time_budget=1e-9)
    assert "choose one head" not in str(one.value) and "choose fewer rows (rows=)" in str(one.value)
    with pytest.raises(IdentifiableError) as row:
        interval_map(trace, layers=[0], heads=[0], rows=[5], time_budget=1e-9)
    assert "choose" not in str(row.value) and str(row.value).endswith("raise time_budget=")
    with pytest.raises(IdentifiableError) as many:
        interval_map(trace, layers=[0], time_budget=1e-9)
    assert "choose one head (layers=, heads=)" in str(many.value)
    assert "--" not in str(many.value)  # Python callers read arguments
    cli = ["certify", TEXT, "--model", str(model_dir), "--time-budget", "0.000000001"]
    out = ws.refused([*cli, "--layer", "0", "--head", "0"], "raise --time-budget")
    assert "choose one head" not in out.err and "choose one row with --row" in out.err
    assert "time_budget=" not in out.err


# ---- the limit that limits -------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_context(tmp_path_factory, bert_tokenizer):
    """A tiny GPT-2 with n_positions = 4096 and a borrowed tokenizer that says 512, and
    one with n_positions = 128 (stricter than the tokenizer)."""
    from transformers import GPT2Model

    from helpers.families import tiny_config

    folders = {}
    for positions in (4096, 128):
        config = tiny_config("gpt2")
        config.n_positions = positions
        config.bos_token_id, config.eos_token_id = 101, 102  # in the borrowed vocabulary
        folder = tmp_path_factory.mktemp("gpt2") / f"gpt2-{positions}"
        GPT2Model(config).save_pretrained(folder)
        bert_tokenizer.save_pretrained(folder)
        folders[positions] = folder
    assert bert_tokenizer.model_max_length == 512
    return folders


def test_a_stricter_tokenizer_is_named_as_the_limit(ws, long_context) -> None:
    """The issue's case: truncated to 512 with "the model's maximum of 512"."""
    long = "word " * 700
    ws.inputs.extend(long_context.values())
    out = ws.main(["trace", long, "--model", str(long_context[4096])])
    assert out.code == 0, out.err
    (warning,) = [ln for ln in out.err_lines if ln.startswith("warning:")]
    assert "the tokenizer's model_max_length of 512, stricter than the model's 4096" in warning
    assert "model's maximum of 512" not in warning
    ws.refused(
        ["trace", long, "--model", str(long_context[4096]), "--no-truncate"],
        "takes at most 512 (the tokenizer's model_max_length of 512",
    )
    short = ws.main(["trace", long, "--model", str(long_context[128])])
    assert "the model's maximum of 128 positions (n_positions)" in short.err, short.err


@pytest.mark.parametrize(
    ("config", "tokenizer", "limit", "named"),
    [
        ({"max_position_embeddings": 2048}, 10**30, 2048, "max_position_embeddings"),
        ({"n_positions": 1024}, 512, 512, "tokenizer's model_max_length of 512"),
        ({"max_seq_len": 8192}, None, 8192, "(max_seq_len)"),  # MPT
        ({"seq_length": 32768}, None, 32768, "(seq_length)"),  # ChatGLM, Qwen-1
        ({"max_position_embeddings": -1}, 4096, 4096, "tokenizer's"),  # XLNet: no own limit
        ({}, None, 10**9, "no limit"),
    ],
)
def test_the_context_length_is_read_from_the_family_field(config, tokenizer, limit, named) -> None:
    from identifiable.models.encoding import position_limit

    spec = SimpleNamespace(position_offset=0)
    tok = SimpleNamespace(model_max_length=tokenizer)
    got, why = position_limit(SimpleNamespace(**config), tok, spec)  # type: ignore[arg-type]
    assert got == limit and named in why, why


# ---- defaults named, tables whole -------------------------------------------------------------


def test_mixing_says_its_default_method(ws, model_dir) -> None:
    default = ws.main(["mixing", "the cat sat", "--model", str(model_dir)])
    title = " ".join(default.out.split())  # the title wraps to the table's width
    assert default.code == 0 and "rollout (the default; choose with --method)" in title
    chosen = ws.main(["mixing", "the cat sat", "--model", str(model_dir), "--method", "rollout"])
    assert chosen.code == 0 and "the default" not in chosen.out


def test_a_memory_refusal_names_the_default_budget_as_the_default(
    ws, model_dir, tiny_model, monkeypatch
) -> None:
    """With no budget given the memory available is the budget: named as the default, not
    as "the 4.41 GB of memory_budget=" the user never set."""
    import identifiable.models.budget as budget

    monkeypatch.setattr(budget, "available_memory", lambda: 1000)
    out = ws.refused(["trace", "the cat sat", "--model", str(model_dir)], "memory available now")
    assert "(the default --memory-budget)" in out.err
    with pytest.raises(IdentifiableError, match="memory available now") as default:
        tiny_model("bert").trace("the cat sat")
    assert "(the default memory_budget=)" in str(default.value)
    with pytest.raises(IdentifiableError, match="of memory_budget=;") as given:
        tiny_model("bert").trace("the cat sat", memory_budget=1000)
    assert "default" not in str(given.value)


def test_tables_written_to_a_file_are_whole(ws, model_dir, tmp_path) -> None:
    """`certify … > file`: every header and cell in full (they were cut to "ident…",
    "movab…" and "con" at 80 columns), each row on one line."""
    out = ws.script(["certify", TEXT, "--model", str(model_dir), "--layer", "0", "--head", "0"])
    assert out.code == 0, out.err
    assert "…" not in out.out and "..." not in out.out
    header = next(ln for ln in out.out.splitlines() if "layer" in ln and "head" in ln)
    for name in ("identifiable", "movable mass", "constrained"):
        assert name in out.out
    assert "L1 constrained" in header or "constrained" in header
    rows = [ln for ln in out.out.splitlines() if ln.startswith("│") and ln.count("│") > 5]
    assert len(rows) == 1 and rows[0].count("│") == 11, out.out
