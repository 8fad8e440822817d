"""Malformed corpora through every command that reads one (`tokens --corpus`, `reproduce --corpus`):
one line, exit 2, nothing written; bombs also under a hard memory limit."""

from __future__ import annotations

import gzip
import resource
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.cli import assert_refused

MiB = 1 << 20


def _gz(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data))


def _bad_deflate(path: Path) -> None:
    data = bytearray(gzip.compress(b"A sentence of words. " * 4000))
    data[20:60] = b"\xff" * 40
    path.write_bytes(bytes(data))


def _truncated_gz(path: Path) -> None:
    path.write_bytes(gzip.compress(b"A sentence of words.\n" * 4000)[:200])


def _bz2_garbage(path: Path) -> None:
    path.write_bytes(b"BZh9" + b"\x00garbage" * 100)


def _gz_bomb_line(path: Path) -> None:
    with gzip.open(path, "wb", compresslevel=1) as f:
        chunk = b"a" * MiB
        for _ in range(64):
            f.write(chunk)


# name -> (file name, writer, a fragment of the one-line error)
CORPORA: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "gz bomb, one line": ("bomb.txt.gz", _gz_bomb_line, "line 1 is longer than 1024 KiB"),
    "huge plain line": (
        "line.txt",
        lambda p: p.write_bytes(b"word " * (MiB // 2)),
        "line 1 is longer",
    ),
    "bad deflate": ("bad.txt.gz", _bad_deflate, "corrupt"),
    "truncated gz": ("cut.txt.gz", _truncated_gz, "corrupt"),
    "bz2 garbage": ("junk.txt.bz2", _bz2_garbage, "corrupt"),
    "xz garbage": ("junk.txt.xz", lambda p: p.write_bytes(b"\xfd7zXZ\x00" + b"x" * 64), "corrupt"),
    "nested JSONL": (
        "deep.jsonl",
        lambda p: p.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
        "nested too deeply",
    ),
    "JSONL of lists": ("lists.jsonl", lambda p: p.write_text("[1, 2]\n"), "expected a JSON object"),
    "JSONL without text": ("other.jsonl", lambda p: p.write_text('{"body": "x"}\n'), "no field"),
    "JSONL text not a string": (
        "num.jsonl",
        lambda p: p.write_text('{"text": 5}\n'),
        "not text",
    ),
    "invalid JSON line": ("broken.jsonl", lambda p: p.write_text('{"text": \n'), "invalid JSON"),
    "not UTF-8": ("latin.txt", lambda p: p.write_bytes(b"caf\xe9 au lait.\n"), "not UTF-8"),
    "empty": ("empty.txt", lambda p: p.write_bytes(b""), "contains no text"),
    "blank lines only": ("blank.txt", lambda p: p.write_text("\n \n\t\n"), "contains no text"),
    "XML that is not a dump": ("x.xml", lambda p: p.write_text("<html></html>"), "not a MediaWiki"),
    "broken XML": ("b.xml", lambda p: p.write_text("<mediawiki><page>"), "truncated or corrupt"),
    "a folder": ("folder", lambda p: p.mkdir(), "is not a file"),
    "gz of nothing valid": ("e.jsonl.gz", lambda p: _gz(p, b"\xff\xfe\n"), "not UTF-8"),
    # JSON escapes decode to lone surrogates, which no tokenizer takes (a TypeError before)
    "lone high surrogate": (
        "sur.jsonl",
        lambda p: p.write_text('{"text": "bad \\ud800 text of several words here"}\n'),
        "sur.jsonl:1: field 'text' holds a lone surrogate (U+D800 at character 4)",
    ),
    "lone low surrogate, line 2": (
        "low.jsonl",
        lambda p: p.write_text('{"text": "A fine line."}\n{"text": "x\\udfff"}\n'),
        "low.jsonl:2: field 'text' holds a lone surrogate (U+DFFF",
    ),
    "reversed surrogate pair": (
        "pair.jsonl",
        lambda p: p.write_text('{"text": "\\ude00\\ud83d reversed"}\n'),
        "lone surrogate (U+DE00 at character 0)",
    ),
    "surrogate in a JSON array": (
        "arr.json",
        lambda p: p.write_text('[{"text": "fine words"}, {"text": "\\udbff"}]'),
        "record 2: field 'text' holds a lone surrogate",
    ),
    "100,000-digit integer": (
        "int.jsonl",
        lambda p: p.write_text('{"text": "a sentence", "id": ' + "9" * 100_000 + "}\n"),
        "line 1 holds a number of 100000 digits",
    ),
    "negative huge integer, line 3": (
        "neg.jsonl",
        lambda p: p.write_text('{"text": "a"}\n{"text": "b"}\n{"n": -' + "1" * 5000 + "}\n"),
        "line 3 holds a number of 5001 digits",
    ),
    "huge integer in a JSON array": (
        "arr-int.json",
        lambda p: p.write_text('[{"text": "a", "n": ' + "7" * 10_000 + "}]"),
        "holds a number of 10000 digits",
    ),
    "huge integer as the text": (
        "text-int.jsonl",
        lambda p: p.write_text('{"text": ' + "5" * 4301 + "}\n"),
        "holds a number of 4301 digits",
    ),
}


def _commands(corpus: str, model: str, ws: Path) -> dict[str, list[str]]:
    return {
        "tokens": ["tokens", "--model", model, "--corpus", corpus, "--out", str(ws / "t")],
        "reproduce": [
            "reproduce",
            "--model",
            model,
            "--corpus",
            corpus,
            "--out",
            str(ws / "r"),
            "--budget",
            "smoke",
            "--no-progress",
        ],
    }


@pytest.mark.parametrize("command", ["tokens", "reproduce"])
@pytest.mark.parametrize("name", list(CORPORA))
def test_malformed_corpus_is_refused(ws, model_dir, command: str, name: str) -> None:
    filename, write, expect = CORPORA[name]
    path = ws.root / "in" / filename
    path.parent.mkdir()
    write(path)
    args = _commands(str(path), str(model_dir), ws.root)[command]
    ws.refused(args, expect)


def test_lowered_limits_refuse_what_defaults_accept(ws, model_dir) -> None:
    path = ws.root / "in" / "c.txt"
    path.parent.mkdir()
    path.write_text("A short sentence of words here.\n" * 2000)  # 64 KB
    args = _commands(str(path), str(model_dir), ws.root)["tokens"]
    ws.refused([*args, "--max-corpus-mib", "0"], "Invalid value")
    big_line = ws.root / "in" / "line.txt"
    big_line.write_text("word " * 400 + "\n")  # 2 KB on one line
    args = _commands(str(big_line), str(model_dir), ws.root)["reproduce"]
    ws.refused([*args, "--max-line-kib", "1"], "line 1 is longer than 1 KiB")


# ---- bombs under a hard memory limit -----------------------------------------------------

AS_LIMIT = (
    3 << 30
)  # 3 GiB of address space: torch (~1.2 GiB) fits, a 1 GiB text read whole does not


@pytest.fixture(scope="module")
def gigabyte_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~4.5 MiB of gzip that inflates to one 1 GiB line (the issue's bomb)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.txt.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        chunk = b"a" * MiB
        for _ in range(1024):
            f.write(chunk)
    return path


@pytest.fixture(scope="module")
def many_lines_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gzip that inflates to 1.07 GiB of short lines: only the size limit stops it."""
    path = tmp_path_factory.mktemp("bomb") / "lines.txt.gz"
    line = b"The cat sat on the mat.\n" * (MiB // 24)
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(1100):
            f.write(line)
    return path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def test_gigabyte_bomb_under_a_memory_limit(ws, model_dir, gigabyte_bomb) -> None:
    args = _commands(str(gigabyte_bomb), str(model_dir), ws.root)["reproduce"]
    before = ws._state()
    outcome = ws.script(args, preexec_fn=_limit_memory)
    assert_refused(outcome, "line 1 is longer than 1024 KiB")
    assert ws._state() == before


def test_many_lines_bomb_under_a_memory_limit(ws, model_dir, many_lines_bomb) -> None:
    args = _commands(str(many_lines_bomb), str(model_dir), ws.root)["tokens"]
    before = ws._state()
    outcome = ws.script(args, preexec_fn=_limit_memory)
    assert_refused(outcome, "decompresses to more than 256 MiB")
    assert ws._state() == before
