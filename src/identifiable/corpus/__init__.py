"""Texts and text pairs to analyse: `identifiable.corpus`.

One entry point::

    from identifiable.corpus import load_corpus

    corpus = load_corpus()                              # Wikipedia sample, sentences
    corpus = load_corpus(unit="pair", tokenizer=model.tokenizer, max_tokens=128)
    corpus = load_corpus("notes.txt", format="lines", limit=100)
    corpus = load_corpus("data.jsonl", field="body")
    corpus = load_corpus("nli.jsonl", pair_fields=("premise", "hypothesis"))
    corpus = load_corpus("hf:wikitext", config="wikitext-2-raw-v1", split="test")
    for text in corpus: ...                            # str, or (a, b) for pairs
    len(corpus), corpus.name, corpus.unit, corpus.fingerprint

`load_corpus(source="wikipedia-sample", *, unit=None, limit=None, seed=0,
shuffle=False, tokenizer=None, max_tokens=None, min_tokens=None, buckets=None,
per_bucket=None, format="auto", field="text", pair_fields=None, split="train",
config=None, max_bytes=None, max_line_bytes=None) -> Corpus`

Sources:
- `"wikipedia-sample"` (default): the 106 English Wikipedia articles (all
  non-redirect main-namespace pages) in gensim's test data, cleaned of markup
  (templates, links, refs, tables, tags, back-matter sections) and split into
  paragraphs (≥ 8 words, ending like a sentence) and sentences. Four of the 106
  (disambiguation and list pages: Alien, Ada, Asia Minor (disambiguation), List
  of anthropologists) have no prose paragraph left, so 102 yield text.
  Parsed once per process (cached).
- a MediaWiki XML export (`.xml`, `.xml.bz2`, detected from the content too).
- a plain text file (`.txt`, also `.gz`/`.bz2`/`.xz`): `format="lines"` (one text
  per line) or `"paragraphs"` (blank-line separated; lines inside a block are
  joined). `"auto"` picks paragraphs when blank lines separate multi-line blocks.
- JSON Lines (`.jsonl`/`.ndjson`/`.json`, or a JSON array): the text is
  `record[field]`; `pair_fields=("a", "b")` yields ready-made pairs instead.
- `"hf:NAME"`: a Hugging Face dataset (`config`, `split`), read like JSONL
  records; needs the optional `datasets` package (`identifiable[datasets]`).

Read limits: a file may decompress to at most `max_bytes` (default 1 GiB) and a line
of a text or JSON Lines file may hold at most `max_line_bytes` (default 1 MiB); past
either, reading stops with an `IdentifiableError` (memory stays bounded, even for a
decompression bomb). Raise them per call, or for a block of code with
`with identifiable.corpus.read_limits(max_bytes=…, max_line_bytes=…):`.

Units: "sentence", "paragraph", "document" (a whole article, line, block or
record), "pair". Default: "sentence" for wiki sources, "document" for files and
datasets (the text as given), "pair" with `pair_fields`.
`unit="pair"` builds Clark-style pairs `(a, b)` of consecutive text of one
document whose encoded pair (specials included) has `min_tokens` (default 12)
to `max_tokens` (default 128) tokens, with lengths spread uniformly in that
range under `seed` (see `identifiable.corpus.pairs`). The tokenizer formats
them later, e.g. `[CLS] a [SEP] b [SEP]`.

Options applied in this order: `min_tokens`/`max_tokens` keep items within a
token range (needs `tokenizer`, any Hugging Face tokenizer; lengths include
special tokens); `buckets` (e.g. `[16, 32, 64, 128]` or `[(1, 16), (17, 32)]`)
with `per_bucket` (default: the smallest bucket's size) draws a balanced sample
under `seed`, bucket by bucket; `shuffle=True` shuffles under `seed`; `limit`
keeps the first items. Without shuffle the order is the source's order.

`Corpus` is an immutable sequence with `name`, `unit`, `is_pairs`, `options`
and `fingerprint` (hash of the source's content and every option that shapes
the items; caches can key on it). Every problem (unknown source, missing,
unreadable, corrupt or non-UTF-8 file, invalid JSONL line, missing field, empty
result, `datasets` missing) raises `IdentifiableError` saying what to do.

Lower-level pieces: `load_documents` (Documents of paragraphs of sentences),
`split_sentences`, `clean_wikitext`, `parse_wiki_dump`, `make_pairs` / `iter_pairs`,
`token_lengths`, `bucket_by_length`.
"""

from identifiable.corpus.core import (
    CORPUS_VERSION,
    UNITS,
    Corpus,
    load_corpus,
    load_documents,
    resolve_corpus,
)
from identifiable.corpus.document import Document
from identifiable.corpus.fileio import DEFAULT_LIMITS, ReadLimits, read_limits
from identifiable.corpus.lengths import (
    DEFAULT_BUCKETS,
    bucket_by_length,
    token_lengths,
    tokenizer_fingerprint,
)
from identifiable.corpus.pairs import iter_pairs, make_pairs
from identifiable.corpus.sentences import split_sentences
from identifiable.corpus.sources import FORMATS, WIKIPEDIA_SAMPLE, wikipedia_sample_path
from identifiable.corpus.wikidump import parse_wiki_dump
from identifiable.corpus.wikitext import clean_wikitext

__all__ = [
    "CORPUS_VERSION",
    "DEFAULT_BUCKETS",
    "DEFAULT_LIMITS",
    "FORMATS",
    "UNITS",
    "WIKIPEDIA_SAMPLE",
    "Corpus",
    "Document",
    "ReadLimits",
    "bucket_by_length",
    "clean_wikitext",
    "iter_pairs",
    "load_corpus",
    "load_documents",
    "make_pairs",
    "parse_wiki_dump",
    "read_limits",
    "resolve_corpus",
    "split_sentences",
    "token_lengths",
    "tokenizer_fingerprint",
    "wikipedia_sample_path",
]
