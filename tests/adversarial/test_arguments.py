"""Every CLI command × malformed arguments: a usage message or one `error:` line, exit 2,
no traceback, nothing written."""

from __future__ import annotations

import pytest
import torch

from identifiable import __version__

COMMON_TEXT_COMMANDS = ("trace", "attention", "attribution", "view", "mixing", "certify")
NO_CUDA = not torch.cuda.is_available()


def case_id(args: list[str]) -> str:
    return " ".join(a.encode("utf-8", "backslashreplace").decode() for a in args) or "(none)"


# ---- cases: (arguments, a fragment the message must contain) ----------------------------
# "{model}" is the tiny model folder, "{notok}" the same without tokenizer files,
# "{ws}" the workspace (the current directory).

GLOBAL = [
    ([], "missing command"),
    (["nosuch"], "No such command 'nosuch'"),
    (["--bogus"], "No such option: --bogus"),
    (["models", "extra"], "unexpected extra argument"),
    (["reproduce", "--seed", "abc"], "Invalid value for '--seed'"),
]

PER_TEXT_COMMAND = [
    ([], "Missing argument"),
    (["x", "--bogus"], "No such option: --bogus"),
    (["a\udcffb"], "argument 2 is not valid UTF-8 (byte 0xff at byte offset 1)"),
    (["x", "--model", ""], "--model is empty"),
    (["x", "--model", "{ws}/nope"], "does not exist"),
    (["x", "--model", "{ws}"], "could not load the model"),
    (["x", "--model", "{notok}"], "tokenizer"),
    (["x", "--model", "{model}", "--pair"], "requires an argument"),
    (["x", "--model", "{model}", "--pair", "b\udcfe"], "byte 0xfe at byte offset 1"),
]

SPECIFIC = [
    # trace
    (["trace", "x", "--model", "{model}", "--json", "{ws}/missing/t.json"], "does not exist"),
    (["trace", "x", "--model", "{model}", "--json", "{ws}"], "is a folder"),
    # attention
    (["attention", "x", "--layer", "abc"], "Invalid value for '--layer'"),
    (
        ["attention", "x", "--model", "{model}", "--layer", "-1", "--head", "0"],
        "valid layers are 0..1",
    ),
    (["attention", "x", "--model", "{model}", "--layer", "3", "--head", "0"], "out of range"),
    (
        ["attention", "x", "--model", "{model}", "--layer", "1", "--head", "9"],
        "valid heads are 0..3",
    ),
    (["attention", "x", "--model", "{model}", "--layer", "1"], "together"),
    (["attention", "x", "--model", "{model}", "--row", "1"], "--row needs"),
    (["attention", "x", "--model", "{model}", "--variant", "junk"], "unknown --variant"),
    (["attention", "x", "--model", "{model}", "--json", "{ws}/missing/a.json"], "does not exist"),
    # attribution
    (["attribution", "x", "--model", "{model}", "--seed", str(2**63)], "--seed must be"),
    (["attribution", "x", "--model", "{model}", "--seed", "-1"], "--seed must be"),
    (["attribution", "x", "--model", "{model}", "--json", "{ws}/new/a.json"], "does not exist"),
    (["attribution", "x", "--model", "{model}", "--json", "{ws}"], "is a folder"),
    (["attribution", "x", "--model", "{model}", "--memory-budget", "0"], "--memory-budget"),
    (["attribution", "x", "--probes", "abc"], "Invalid value for '--probes'"),
    # view
    (["view", "x", "--model", "{model}", "--max-rows", "-5"], "--max-rows must be at least 1"),
    (["view", "x", "--model", "{model}", "--max-mb", "nan"], "--max-mb must be"),
    (["view", "x", "--model", "{model}", "--max-mb", "inf"], "--max-mb must be"),
    (["view", "x", "--model", "{model}", "--max-mb", "0.5"], "--max-mb must be"),
    (["view", "x", "--model", "{model}", "--interval-seconds", "nan"], "--interval-seconds"),
    # huge finite values passed isfinite and overflowed in int(max_mb * 1e6)
    (["view", "x", "--model", "{model}", "--max-mb", "1e308"], "--max-mb must be"),
    (["view", "x", "--model", "{model}", "--max-mb", "1e7"], "between 1 and 1000000"),
    (["view", "x", "--model", "{model}", "--interval-seconds", "1e308"], "--interval-seconds"),
    (["view", "x", "--model", "{model}", "--interval-seconds", "-1"], "--interval-seconds"),
    (["view", "x", "--model", "{model}", "--interval-seconds", "1.5e6"], "between 0 and"),
    (["view", "x", "--model", "{model}", "--layer", "9"], "valid layers are 0..1"),
    (["view", "x", "--model", "{model}", "--head", "-1"], "--head must be 0 or more"),
    (["view", "x", "--model", "{model}", "--out", "{ws}"], "is a folder"),
    (["view", "x", "--model", "{model}", "--out", "{ws}/missing/v.html"], "does not exist"),
    (["view", "  ", "--model", "{model}"], "the text is empty"),
    # tokens
    (["tokens", "--model", "{model}", "--corpus", "{ws}/missing.txt"], "not found"),
    (["tokens", "--model", "{model}", "--layers", "a,b"], "--layers takes"),
    (["tokens", "--model", "{model}", "--max-tokens", "0"], "--max-tokens must be"),
    (["tokens", "--model", "{model}", "--batch-size", "0"], "--batch-size must be"),
    (["tokens", "--model", "{model}", "--max-tokens", "9" * 20], "--max-tokens must be between"),
    (["tokens", "--model", "{model}", "--max-tokens", str(2**31)], "--max-tokens must be between"),
    (["tokens", "--model", "{model}", "--quick", "--max-tokens", "5"], "not both"),
    (["tokens", "--max-corpus-mib", "0"], "Invalid value for '--max-corpus-mib'"),
    (["tokens", "--max-line-kib", "x"], "Invalid value for '--max-line-kib'"),
    (["tokens", "--model", ""], "--model is empty"),
    (["tokens", "--model", "{model}", "--out", "{ws}/a-file"], "is a file"),
    # reproduce
    (["reproduce", "--model", "{model}", "--budget", "huge"], "quick, paper, smoke"),
    (["reproduce", "--model", "{model}", "--device", "junk"], "unknown device 'junk'"),
    *(
        [
            (["reproduce", "--model", "{model}", "--device", "cuda"], "not available"),
            (["reproduce", "--model", "{model}", "--device", "cuda:3"], "not available"),
        ]
        if NO_CUDA
        else [(["reproduce", "--model", "{model}", "--device", "cuda:99"], "does not exist")]
    ),
    (["reproduce", "--model", "{model}", "--out", "/"], "filesystem root"),
    (["reproduce", "--model", "{model}", "--out", "."], "current directory"),
    (["reproduce", "--model", "{model}", "--out", "{ws}/../home", "--force"], "home directory"),
    (["reproduce", "--model", "{model}", "--out", "{ws}/a-file"], "is a file"),
    (
        ["reproduce", "--model", "{model}", "--out", "{ws}/busy"],
        "holds no identifiable reproduce run",
    ),
    (["reproduce", "--model", "{model}", "--out", "{ws}/busy", "--force"], "--force refused"),
    (["reproduce", "--model", "{model}", "--out", "{ws}/busy", "--resume"], "cannot resume"),
    (["reproduce", "--model", "{model}", "--out", "{ws}/r", "--resume", "--force"], "not both"),
    (
        ["reproduce", "--model", "{model}", "--corpus", "{ws}/missing.txt", "--out", "{ws}/r"],
        "not found",
    ),
    (["reproduce", "--model", "", "--out", "{ws}/r"], "--model is empty"),
    (["reproduce", "--model", "{ws}/nope", "--out", "{ws}/busy", "--force"], "--force refused"),
    (["reproduce", "--max-corpus-mib", "-1"], "Invalid value for '--max-corpus-mib'"),
    # mixing and certify
    (["mixing", "x", "--model", "{model}", "--method", "junk"], "junk"),
    (["mixing", "x", "--model", "{model}", "--workers", "2"], "does not apply to --method"),
    (["mixing", "x", "--model", "{model}", "--method", "flow", "--workers", "0"], "workers"),
    (["certify", "x", "--layer", "abc"], "Invalid value for '--layer'"),
    (["certify", "x", "--model", "{model}", "--threads", "0"], "--threads 0 must be at least 1"),
]

CASES = (
    GLOBAL
    + [
        ([cmd, *args], expect)
        for cmd in COMMON_TEXT_COMMANDS
        for args, expect in PER_TEXT_COMMAND
        if not (cmd == "attention" and not args)
    ]
    # attention's TEXT is optional with --sink, so the command itself says what is missing
    + [(["attention"], "give the TEXT to analyse")]
    + SPECIFIC
)


def fill(args: list[str], ws, model_dir, no_tokenizer_dir) -> list[str]:
    names = {"{model}": str(model_dir), "{notok}": str(no_tokenizer_dir), "{ws}": str(ws.root)}
    filled = []
    for a in args:
        for key, value in names.items():
            a = a.replace(key, value)
        filled.append(a)
    return filled


@pytest.mark.parametrize(("args", "expect"), CASES, ids=[case_id(a) for a, _ in CASES])
def test_malformed_arguments_are_refused(ws, model_dir, no_tokenizer_dir, args, expect) -> None:
    (ws.root / "a-file").write_text("not a folder")
    (ws.root / "busy").mkdir()
    (ws.root / "busy" / "notes.txt").write_text("the user's")
    ws.refused(fill(args, ws, model_dir, no_tokenizer_dir), expect)


# ---- the real script, in a subprocess ----------------------------------------------------

SCRIPT_CASES = [
    ([], "missing command"),
    (["trace", "x", "--bogus"], "No such option"),
    (["view", "x", "--layer", "abc"], "Invalid value for '--layer'"),
    (["attention"], "give the TEXT to analyse"),
    (["reproduce", "--out", "busy", "--force", "--model", "/nonexistent"], "--force refused"),
]


@pytest.mark.parametrize(
    ("args", "expect"), SCRIPT_CASES, ids=[case_id(a) for a, _ in SCRIPT_CASES]
)
def test_the_installed_script_refuses_the_same_way(ws, args, expect) -> None:
    (ws.root / "busy" / ".cache" / "hf").mkdir(parents=True)
    (ws.root / "busy" / ".cache" / "hf" / "token").write_text("k")
    ws.refused(args, expect, script=True)


def test_invalid_utf8_bytes_from_the_shell(ws) -> None:
    outcome = ws.refused([b"trace".decode(), "a\udcff"], script=True)  # argv as the shell passes it
    assert "not valid UTF-8" in outcome.err and "byte offset 1" in outcome.err


def test_version(ws) -> None:
    outcome = ws.main(["--version"])
    assert outcome.code == 0 and outcome.out.strip() == f"identifiable {__version__}"
    script = ws.script(["--version"])
    assert script.code == 0 and script.out.strip() == f"identifiable {__version__}"


# ---- Ctrl-C ----------------------------------------------------------------------------


def test_ctrl_c_in_reproduce_says_rerun_with_resume(ws, monkeypatch, model_dir) -> None:
    import identifiable.runs.reproduce as reproduction

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduction, "reproduce", interrupted)
    outcome = ws.main(["reproduce", "--model", str(model_dir), "--out", "r"])
    assert outcome.code == 130 and outcome.err.strip() == "interrupted; rerun with --resume"


def test_ctrl_c_elsewhere_says_interrupted(ws, monkeypatch, model_dir) -> None:
    import identifiable.cli.common as common

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "load", interrupted)
    monkeypatch.setattr("identifiable.cli.trace.load", interrupted, raising=False)
    outcome = ws.main(["trace", "x", "--model", str(model_dir)])
    assert outcome.code == 130 and outcome.err.strip() == "interrupted"
