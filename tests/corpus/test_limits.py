"""Hostile corpus files: bombs and endless lines fail in one line with bounded memory;
damaged archives and absurd JSON fail in one line instead of a traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from identifiable.corpus import load_corpus, read_limits
from identifiable.corpus.sources import SourceOptions, read_source
from identifiable.errors import IdentifiableError

MiB = 1 << 20

# Reads the file in a fresh interpreter (no torch: the corpus reader does not need it) and
# reports how much the peak resident set grew while reading it, and the error it raised.
PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from identifiable.corpus.sources import SourceOptions, read_source
    from identifiable.errors import IdentifiableError
    path, options = sys.argv[1], json.loads(sys.argv[2])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        read_source(path, SourceOptions(**options))
        message = None
    except IdentifiableError as exc:
        message = str(exc)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"grown_kib": grown, "error": message}))
    """
)


def peak_growth(path: Path, **options: object) -> tuple[float, str | None]:
    """(MiB the peak RSS grew by while reading `path`, the error message or None)."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["grown_kib"] / 1024, result["error"]


def gzip_of(path: Path, chunk: bytes, count: int) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(count):
            f.write(chunk)
    return path


def test_gzip_bomb_of_one_endless_line_is_refused_with_flat_memory(tmp_path: Path) -> None:
    bomb = gzip_of(tmp_path / "bomb.txt.gz", b"a" * MiB, 96)  # 96 MiB in ~100 KiB
    assert bomb.stat().st_size < 2 * MiB
    grown, error = peak_growth(bomb)
    assert error is not None and "line 1 is longer than 1024 KiB" in error
    assert "--max-line-kib" in error and "\n" not in error
    assert grown < 24, f"peak memory grew by {grown:.0f} MiB reading a 96 MiB bomb"


def test_huge_single_line_plain_file_is_refused_with_flat_memory(tmp_path: Path) -> None:
    huge = tmp_path / "one-line.txt"
    huge.write_bytes(b"word " * (8 * MiB))  # 40 MiB, no newline
    grown, error = peak_growth(huge)
    assert error is not None and "line 1 is longer" in error
    assert grown < 16, f"peak memory grew by {grown:.0f} MiB reading a 40 MiB line"


def test_bomb_of_short_lines_stops_at_the_size_limit(tmp_path: Path) -> None:
    bomb = gzip_of(tmp_path / "lines.txt.gz", b"the cat sat on the mat.\n" * 40_000, 64)  # ~61 MiB
    grown, error = peak_growth(bomb, max_bytes=4 * MiB)
    assert error is not None and "decompresses to more than 4 MiB" in error
    assert "--max-corpus-mib" in error
    assert grown < 24, f"peak memory grew by {grown:.0f} MiB with a 4 MiB limit"


def test_wiki_dump_is_bounded_too(tmp_path: Path) -> None:
    page = "<page><title>T</title><ns>0</ns><revision><text>" + "Words here. " * 50
    page += "</text></revision></page>\n"
    dump = tmp_path / "dump.xml"
    dump.write_text("<mediawiki>\n" + page * 2000 + "</mediawiki>\n", "utf-8")
    with pytest.raises(IdentifiableError, match="decompresses to more than"):
        read_source(dump, SourceOptions(max_bytes=64 * 1024))
    assert len(read_source(dump).documents) == 2000


def test_limits_can_be_raised(tmp_path: Path) -> None:
    long_line = tmp_path / "long.txt"
    long_line.write_text(("A sentence of several words. " * 1200) + "\n", "utf-8")  # 35 KB
    with pytest.raises(IdentifiableError, match="line 1 is longer than 16 KiB"):
        load_corpus(long_line, max_line_bytes=16 * 1024)
    assert len(load_corpus(long_line, max_line_bytes=64 * 1024)) == 1
    with read_limits(max_line_bytes=16 * 1024), pytest.raises(IdentifiableError, match="line 1"):
        load_corpus(long_line, format="lines")
    with pytest.raises(IdentifiableError, match="max_bytes must be a positive integer"):
        load_corpus(long_line, max_bytes=0)


def test_one_line_json_array_is_not_held_to_the_line_limit(tmp_path: Path) -> None:
    records = [{"text": f"Record number {i} has a few words."} for i in range(40_000)]
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records), "utf-8")  # ~1.7 MB on one line
    assert len(load_corpus(path)) == 40_000


def test_bad_deflate_stream_is_one_error(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(b"A sentence. " * 5000))
    data[20:60] = b"\xff" * 40  # a valid header, then garbage where the deflate blocks are
    path = tmp_path / "broken.txt.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(zlib.error):  # what a raw read raises: the case being handled
        gzip.decompress(bytes(data))
    with pytest.raises(IdentifiableError, match="corrupt"):
        read_source(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_deeply_nested_json_is_one_error(tmp_path: Path, suffix: str) -> None:
    nested = "[" * 200_000 + "]" * 200_000
    path = tmp_path / f"deep{suffix}"
    body = f'{{"text": {nested}}}' if suffix == ".jsonl" else nested
    path.write_text(body + "\n", "utf-8")
    with pytest.raises(IdentifiableError, match="nested too deeply"):
        read_source(path, SourceOptions(max_line_bytes=4 * MiB))


def test_missing_field_message_names_no_nonexistent_option(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"body": "A text."}\n', "utf-8")
    with pytest.raises(IdentifiableError) as exc:
        load_corpus(path)
    message = str(exc.value)
    assert "no field 'text'" in message and "--field" not in message
    assert "field=" in message
