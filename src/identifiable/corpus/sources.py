"""Reading a corpus source into Documents (or ready-made text pairs).

Sources: the built-in `"wikipedia-sample"`, a MediaWiki export, a plain text file
(`lines`: one text per line; `paragraphs`: blank-line separated), a JSON Lines
file (or a JSON array of records), and `"hf:NAME"` Hugging Face datasets.
Every source has a content `identity` (a SHA-256) that fingerprints build on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from identifiable.corpus.document import Document
from identifiable.corpus.fileio import ReadLimits, current_limits, file_digest, peek, read_text
from identifiable.corpus.sentences import split_sentences
from identifiable.corpus.wikidump import parse_wiki_dump
from identifiable.errors import IdentifiableError
from identifiable.utils.checks import shown
from identifiable.utils.unicode import check_unicode

__all__ = [
    "FORMATS",
    "WIKIPEDIA_SAMPLE",
    "SourceData",
    "SourceOptions",
    "read_source",
    "wikipedia_sample_path",
]

WIKIPEDIA_SAMPLE = "wikipedia-sample"
FORMATS = ("auto", "lines", "paragraphs", "jsonl", "wiki")
_SAMPLE_FILE = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_KNOWN = f"'{WIKIPEDIA_SAMPLE}', a .txt/.jsonl/.xml(.bz2) file path, or 'hf:DATASET'"


@dataclass(frozen=True)
class SourceData:
    """What a source holds.

    Attributes:
        name: display name ("wikipedia-sample", the file name, "hf:NAME").
        kind: "wiki", "lines", "paragraphs", "jsonl" or "hf" (the format actually read).
        identity: SHA-256 of the content (file bytes, or the extracted records).
        documents: the texts as Documents (empty when `pairs` is set).
        pairs: ready-made `(a, b)` pairs from two record fields, else None.
    """

    name: str
    kind: str
    identity: str
    documents: tuple[Document, ...]
    pairs: tuple[tuple[str, str], ...] | None = None


def wikipedia_sample_path() -> Path:
    """Locate the 106-article English Wikipedia sample.

    It ships with this package (`identifiable/data/enwiki-sample.xml.bz2`, CC BY-SA 3.0,
    see the NOTICE beside it); an installation without it falls back to the identical file
    in gensim's wheel, found without importing gensim (which is slow to import).
    """
    bundled = Path(__file__).resolve().parents[1] / "data" / "enwiki-sample.xml.bz2"
    if bundled.is_file():
        return bundled
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise IdentifiableError(
            f"the built-in '{WIKIPEDIA_SAMPLE}' corpus ships inside the gensim package, "
            "which is not installed: pip install gensim, or pass a .txt/.jsonl file"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SAMPLE_FILE
    if not path.is_file():
        raise IdentifiableError(
            f"gensim is installed but lacks its test data {path.name}; reinstall gensim "
            "from its wheel (pip install --force-reinstall gensim), or pass a .txt/.jsonl file"
        )
    return path


def _paragraph(text: str) -> tuple[str, ...]:
    return tuple(split_sentences(text))


def _document(title: str, text: str) -> Document | None:
    """A Document from free text: blank lines separate paragraphs; None if blank."""
    paragraphs = tuple(p for p in (_paragraph(b) for b in _BLANK_LINE.split(text)) if p)
    return Document(title, paragraphs) if paragraphs else None


def _text_documents(name: str, text: str, fmt: str) -> tuple[str, tuple[Document, ...]]:
    """Split a plain text file into one Document per line or per paragraph."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if fmt == "auto":
        blocks = [b for b in _BLANK_LINE.split(text) if b.strip()]
        # Blank-line separated blocks of several lines are paragraphs; anything else
        # (no blank lines, or one-line blocks) reads the same as one text per line.
        multiline = any("\n" in b.strip() for b in blocks)
        fmt = "paragraphs" if len(blocks) > 1 and multiline else "lines"
    documents: list[Document] = []
    if fmt == "lines":
        for number, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                documents.append(Document(f"{name}:{number}", (_paragraph(line),)))
    else:
        for number, block in enumerate(b for b in _BLANK_LINE.split(text) if b.strip()):
            documents.append(Document(f"{name}:¶{number + 1}", (_paragraph(block),)))
    return fmt, tuple(documents)


def _field(record: Mapping[str, Any], key: str, where: str) -> str:
    if key not in record:
        raise IdentifiableError(
            f"{where}: no field {key!r} (fields: {', '.join(map(str, record)) or 'none'}); "
            "the text must be in a field named 'text', or pass load_corpus(field=…) "
            "or pair_fields=(A, B) in Python"
        )
    value = record[key]
    if not isinstance(value, str):
        raise IdentifiableError(
            f"{where}: field {key!r} is {type(value).__name__}, not text; pick a text field"
        )
    check_unicode(value, f"{where}: field {key!r}", "fix or remove that record")
    return value


def _records_to_data(
    name: str,
    kind: str,
    records: Iterable[tuple[str, Any]],
    field: str,
    pair_fields: tuple[str, str] | None,
) -> SourceData:
    """Turn `(where, record)` items into Documents or pairs; hash what was extracted."""
    digest = hashlib.sha256()
    documents: list[Document] = []
    pairs: list[tuple[str, str]] = []
    for where, record in records:
        if not isinstance(record, Mapping):
            raise IdentifiableError(
                f"{where}: expected a JSON object, got {type(record).__name__}; "
                'each line must look like {"text": "…"}'
            )
        if pair_fields is not None:
            a, b = (" ".join(_field(record, k, where).split()) for k in pair_fields)
            digest.update(json.dumps([a, b]).encode())
            if a and b:
                pairs.append((a, b))
            continue
        text = _field(record, field, where)
        digest.update(json.dumps(text).encode())
        document = _document(where, text)
        if document is not None:
            documents.append(document)
    return SourceData(
        name, kind, digest.hexdigest(), tuple(documents), tuple(pairs) if pair_fields else None
    )


_MAX_DIGITS = 4300  # Python's default limit on converting decimal text to int


class _LongNumber(Exception):
    """A JSON integer longer than Python converts (`sys.get_int_max_str_digits()`)."""


def _int(literal: str) -> int:
    # json would raise a bare ValueError from int(); say which record instead
    if len(literal.lstrip("-")) > _MAX_DIGITS:
        raise _LongNumber(len(literal))
    return int(literal)


def _long_number(where: str, exc: _LongNumber) -> IdentifiableError:
    return IdentifiableError(
        f"{where} holds a number of {exc.args[0]} digits (at most {_MAX_DIGITS} can be read); "
        "quote it as a string or remove it"
    )


def _jsonl_records(path: Path, text: str) -> Iterable[tuple[str, Any]]:
    """Parse JSON Lines (or a JSON array), naming the line of any invalid record."""
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text, parse_int=_int)
        except _LongNumber as exc:
            raise _long_number(str(path), exc) from None
        except json.JSONDecodeError as exc:
            raise IdentifiableError(
                f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}; fix the file"
            ) from exc
        except RecursionError:
            raise IdentifiableError(
                f"{path}: JSON nested too deeply to read; records must be flat objects"
            ) from None
        if not isinstance(records, list):
            raise IdentifiableError(f"{path}: expected a JSON array of records; fix the file")
        yield from ((f"{path.name} record {i + 1}", r) for i, r in enumerate(records))
        return
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_int=_int)
        except _LongNumber as exc:
            raise _long_number(f"{path}: line {number}", exc) from None
        except json.JSONDecodeError as exc:
            raise IdentifiableError(
                f"{path}: invalid JSON on line {number}: {exc.msg}; fix or remove that line"
            ) from exc
        except RecursionError:
            raise IdentifiableError(
                f"{path}: line {number} is JSON nested too deeply to read; "
                'each line must be a flat object such as {"text": "…"}'
            ) from None
        yield f"{path.name}:{number}", record


def _read_hf(
    name: str, *, field: str, pair_fields: tuple[str, str] | None, split: str, config: str | None
) -> SourceData:
    """Load a Hugging Face dataset split; `datasets` is optional and imported lazily."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise IdentifiableError(
            "reading Hugging Face datasets needs the optional 'datasets' package: "
            "install identifiable[datasets] (pip install 'identifiable[datasets]'), "
            "or export the data to JSONL and pass the file"
        ) from exc
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # any failure inside a third-party loader is the user's to fix
        raise IdentifiableError(
            f"could not load dataset {name!r} (config={config!r}, split={split!r}): "
            f"{type(exc).__name__}: {exc}. Check the name and split, download it while "
            "online, or export it to JSONL and pass the file"
        ) from exc
    records = ((f"hf:{name}[{split}] row {i + 1}", r) for i, r in enumerate(dataset))
    return _records_to_data(f"hf:{name}", "hf", records, field, pair_fields)


def _detect(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in {".bz2", ".gz", ".xz"}]
    last = suffixes[-1] if suffixes else ""
    if last in {".jsonl", ".ndjson", ".json"}:
        return "jsonl"
    head = peek(path).lstrip(b"\xef\xbb\xbf \t\r\n")
    if last == ".xml" or head.startswith((b"<mediawiki", b"<?xml")):
        return "wiki"
    return "auto"  # plain text: lines or paragraphs decided from the content


@lru_cache(maxsize=16)
def _read_cached(
    path_key: str,
    digest: str,
    name: str,
    fmt: str,
    field: str,
    pair_fields: tuple[str, str] | None,
    limits: ReadLimits,
) -> SourceData:
    """Parse a file once per (path, content digest, options): edits are always seen."""
    path = Path(path_key)
    fmt = _detect(path, fmt)
    if fmt == "wiki":
        if pair_fields is not None:
            raise IdentifiableError("pair_fields applies to JSONL/datasets records, not wiki dumps")
        return SourceData(name, "wiki", digest, parse_wiki_dump(path, limits=limits))
    if fmt == "jsonl" and peek(path).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
        limits = replace(limits, max_line_bytes=limits.max_bytes)  # a JSON array has no lines
    text = read_text(path, limits)
    if fmt == "jsonl":
        return _records_to_data(name, "jsonl", _jsonl_records(path, text), field, pair_fields)
    if pair_fields is not None:
        raise IdentifiableError(
            f"pair_fields needs JSONL records, but {path.name} is plain text; "
            "write the pairs as JSON Lines with two fields"
        )
    kind, documents = _text_documents(name, text, fmt)
    return SourceData(name, kind, hashlib.sha256(text.encode()).hexdigest(), documents)


def is_dataset(source: Any) -> bool:
    """A `datasets.Dataset` (or anything shaped like one: named columns, indexable rows)."""
    return hasattr(source, "column_names") and hasattr(source, "features")


def _check_columns(source: Any, field: str, pair_fields: tuple[str, str] | None) -> None:
    """One line listing the dataset's columns when the text column is not one of them."""
    columns = list(source.column_names)
    wanted = list(pair_fields) if pair_fields is not None else [field]
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise IdentifiableError(
            f"the dataset has no column {missing[0]!r} (its columns: {', '.join(columns)}); "
            "pass column=... (or pair_fields=...) naming the text column"
        )


def dataset_items(
    source: Any, column: str = "text", pair_fields: tuple[str, str] | None = None
) -> list[str | tuple[str, str]]:
    """The texts of a `datasets.Dataset` (its `column`), or (a, b) pairs of two columns,
    each row as it is (whitespace kept, nothing segmented): what `reproduce` and `compare`
    run on when given a dataset. Empty texts are skipped; a non-text cell is one line."""
    _check_columns(source, column, pair_fields)
    items: list[str | tuple[str, str]] = []
    for i, record in enumerate(source):
        where = f"dataset row {i + 1}"
        if pair_fields is not None:
            a, b = (_field(record, k, where) for k in pair_fields)
            if a.strip() and b.strip():
                items.append((a, b))
        elif (text := _field(record, column, where)).strip():
            items.append(text)
    return items


def _read_memory(source: Any, field: str, pair_fields: tuple[str, str] | None) -> SourceData:
    """A `datasets.Dataset` held in memory, or a list of texts, as a source."""
    if is_dataset(source):
        _check_columns(source, field, pair_fields)
        records: Iterable[tuple[str, Any]] = (
            (f"dataset row {i + 1}", r) for i, r in enumerate(source)
        )
        return _records_to_data("dataset", "hf", records, field, pair_fields)
    texts = list(source)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise IdentifiableError(
            f"a corpus given as a list holds texts (str); item {bad + 1} is "
            f"{type(texts[bad]).__name__}"
        )
    rows = ((f"text {i + 1}", {"text": t}) for i, t in enumerate(texts))
    return _records_to_data("texts", "lines", rows, "text", None)


@dataclass(frozen=True)
class SourceOptions:
    """How `read_source` reads a source: `load_corpus`'s read options, under the same names
    (`fmt` is its `format`; its docstring documents each). `max_bytes` and `max_line_bytes`
    bound what a file may decompress to and its longest line (None: the limits in force,
    see `identifiable.corpus.fileio.read_limits`)."""

    fmt: str = "auto"
    field: str = "text"
    pair_fields: Sequence[str] | None = None
    split: str = "train"
    config: str | None = None
    max_bytes: int | None = None
    max_line_bytes: int | None = None


def read_source(source: Any, options: SourceOptions = SourceOptions()) -> SourceData:
    """Resolve and read a corpus source (parsed files are cached in memory).

    Raises:
        IdentifiableError: unknown source or format, missing/unreadable/corrupt file,
            a file past the read limits, invalid JSONL line, missing field, or `datasets`
            not installed.
    """
    limits = current_limits(options.max_bytes, options.max_line_bytes)
    fmt, field = options.fmt, options.field
    if fmt not in FORMATS:
        raise IdentifiableError(f"unknown corpus format {fmt!r}; use one of {', '.join(FORMATS)}")
    fields: tuple[str, str] | None = None
    if options.pair_fields is not None:
        given = tuple(options.pair_fields)
        if len(given) != 2 or not all(isinstance(k, str) for k in given):
            raise IdentifiableError(
                "pair_fields must be two field names, e.g. ('premise', 'hypothesis')"
            )
        fields = (given[0], given[1])
    if is_dataset(source) or isinstance(source, list | tuple):
        return _read_memory(source, field, fields)
    if isinstance(source, str) and source.startswith("hf:"):
        return _read_hf(
            source[3:], field=field, pair_fields=fields, split=options.split, config=options.config
        )
    if not isinstance(source, str | Path):
        raise IdentifiableError(
            f"the corpus source takes a name, a file path, a list of texts or a datasets."
            f"Dataset, got {shown(source)}; pass {_KNOWN}"
        )
    path = wikipedia_sample_path() if source == WIKIPEDIA_SAMPLE else Path(source).expanduser()
    if not path.exists():
        raise IdentifiableError(f"corpus source {str(source)!r} not found; pass {_KNOWN}")
    if not path.is_file():
        raise IdentifiableError(f"corpus source {str(path)!r} is not a file; pass {_KNOWN}")
    if source == WIKIPEDIA_SAMPLE and fmt not in {"auto", "wiki"}:
        raise IdentifiableError(f"'{WIKIPEDIA_SAMPLE}' is a wiki dump; leave format at 'auto'")
    try:
        digest = file_digest(path)
    except OSError as exc:
        raise IdentifiableError(
            f"cannot read corpus file {path}: {exc}; check its permissions"
        ) from exc
    name = WIKIPEDIA_SAMPLE if source == WIKIPEDIA_SAMPLE else path.name
    return _read_cached(str(path.resolve()), digest, name, fmt, field, fields, limits)
