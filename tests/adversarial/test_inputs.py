"""Inputs bounded before use: text with lone surrogates (Python API), decompression-bomb
images (`view --image`), and models that cannot read text, each refused in one line that
says what the user can do in that command."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from identifiable.errors import IdentifiableError

# ---- lone surrogates through the Python API -------------------------------------------------

SURROGATE_INPUTS = {
    "text": "a\ud800b",
    "text, low surrogate": "trailing \udfff",
    "pair, second text": ("a fine text", "b\udc00c"),
    "pair, first text": ("\udbff", "fine"),
}


@pytest.mark.parametrize("name", list(SURROGATE_INPUTS))
@pytest.mark.parametrize("call", ["trace", "encode", "trace_many"])
def test_text_with_a_lone_surrogate_is_one_error(tiny_model, name, call) -> None:
    model = tiny_model("bert")
    text = SURROGATE_INPUTS[name]
    with pytest.raises(IdentifiableError, match=r"^text holds a lone surrogate \(U\+D[89A-F]"):
        if call == "trace_many":
            list(model.trace_many(["a fine text", text]))
        else:
            getattr(model, call)(text)


def test_a_surrogate_pair_written_as_escapes_is_real_text(tmp_path, tiny_model) -> None:
    """JSON's "\\ud83d\\ude00" is one character (😀), not a lone surrogate: it is read."""
    from identifiable.corpus import load_corpus

    path = tmp_path / "emoji.jsonl"
    path.write_text('{"text": "A smile \\ud83d\\ude00 in a sentence."}\n', "utf-8")
    (text,) = list(load_corpus(str(path)))
    assert "\U0001f600" in text
    assert tiny_model("bert").trace(text).n_tokens > 3


def test_reproduce_refuses_a_corpus_list_with_a_surrogate_before_writing(
    tiny_model, tmp_path
) -> None:
    from identifiable.runs.reproduce import reproduce

    with pytest.raises(IdentifiableError, match="corpus item 2 holds a lone surrogate"):
        reproduce(tiny_model("bert"), ["a fine text", ("b", "c\ud800")], tmp_path / "r",
                  budget="smoke", progress=False)  # fmt: skip
    assert list(tmp_path.iterdir()) == []


# ---- decompression bombs -------------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(width: int, height: int) -> bytes:
    """A PNG header claiming width × height, with one compressed row: bytes, not pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    row = zlib.compress(b"\x00" * (width + 1), 9)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", row) + _chunk(b"IEND", b"")
    )


def _gif(width: int, height: int) -> bytes:
    screen = struct.pack("<HHBBB", width, height, 0, 0, 0)
    image = b"," + struct.pack("<HHHHB", 0, 0, width, height, 0)
    return b"GIF89a" + screen + image + b"\x02\x02\x44\x01\x00;"


def _bmp(width: int, height: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 1, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 86, 0, 0, 62) + info + b"\x00" * 24


def _npy_header(path: Path, shape: tuple[int, ...], dtype: str = "<f4", data: bool = True):
    """A .npy file of `shape` (sparse: its data is never written) or only its header."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": dtype, "fortran_order": False, "shape": shape}
        )
        if data:
            f.truncate(f.tell() + int(np.prod(shape)) * np.dtype(dtype).itemsize)


IMAGES = {
    "PNG 30000x30000 (the issue's bomb)": ("bomb.png", lambda p: p.write_bytes(_png(30000, 30000)),
                                           "holds 900 megapixels"),
    "PNG 14000x14000": ("big.png", lambda p: p.write_bytes(_png(14000, 14000)), "196 megapixels"),
    "GIF 65535x65535": ("bomb.gif", lambda p: p.write_bytes(_gif(65535, 65535)), "megapixels"),
    "BMP 50000x50000": ("bomb.bmp", lambda p: p.write_bytes(_bmp(50000, 50000)), "2500 megapixels"),
    "npy 3x20000x20000": ("big.npy", lambda p: _npy_header(p, (3, 20000, 20000)), "400 megapixels"),
    "npy of 64 channels": ("wide.npy", lambda p: _npy_header(p, (64, 4000, 4000)), "megapixels"),
    "npy header only": ("cut.npy", lambda p: _npy_header(p, (3, 32, 32), data=False),
                        "not a readable .npy array"),
    "npy of integers": ("ints.npy", lambda p: np.save(p, np.zeros((3, 8, 8), np.int64)),
                        "must hold float pixel values"),
    "npy 2-D": ("flat.npy", lambda p: np.save(p, np.zeros((8, 8), np.float32)),
                "must hold float pixel values"),
    "PNG cut short": ("cut.png", lambda p: p.write_bytes(_png(64, 64)[:30]), "not an image file"),
    "text named .png": ("text.png", lambda p: p.write_text("hello"), "not an image file"),
    "a folder": ("folder.png", lambda p: p.mkdir(), "is a folder"),
    "missing": ("missing.png", lambda p: None, "no such file"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(IMAGES))
def test_a_hostile_image_is_one_line_before_the_model_loads(ws, name) -> None:
    filename, write, expect = IMAGES[name]
    path = ws.root / "in" / filename
    path.parent.mkdir()
    write(path)
    # the model does not exist: an image refused first never reaches it
    ws.refused(["view", "--image", str(path), "--model", str(ws.root / "no-model")], expect)


# ---- models that cannot read text ---------------------------------------------------------


@pytest.fixture(scope="session")
def image_model_dir(tmp_path_factory) -> Path:
    from helpers.families import build_tiny_hf_model

    root = tmp_path_factory.mktemp("models") / "tiny-vit"
    build_tiny_hf_model("vit").save_pretrained(root)
    return root


TEXT_COMMANDS = [
    ["trace", "hello"],
    ["attention", "hello"],
    ["attribution", "hello"],
    ["mixing", "hello"],
    ["certify", "hello"],
    ["tokens", "--out", "t"],
    ["reproduce", "--out", "r", "--budget", "smoke"],
]
PYTHON_ADVICE = ("tokenizer=", "Model.from_hf", "load_model(", "pixel_values", "PIL")


@pytest.mark.parametrize("command", TEXT_COMMANDS, ids=[c[0] for c in TEXT_COMMANDS])
@pytest.mark.parametrize("kind", ["no tokenizer", "image model"])
def test_a_model_that_cannot_read_text_gets_cli_advice(
    ws, no_tokenizer_dir, image_model_dir, command, kind
) -> None:
    model = no_tokenizer_dir if kind == "no tokenizer" else image_model_dir
    ws.inputs.append(image_model_dir)
    expect = "has no tokenizer" if kind == "no tokenizer" else "is an image model"
    outcome = ws.refused([*command, "--model", str(model)], expect)
    assert not any(advice in outcome.err for advice in PYTHON_ADVICE), outcome.err
    if kind == "image model":
        assert "identifiable view --image" in outcome.err


def test_view_of_text_with_an_image_model_names_the_image_option(ws, image_model_dir) -> None:
    ws.inputs.append(image_model_dir)
    ws.refused(["view", "hello", "--model", str(image_model_dir)], "give --image FILE")


def test_view_with_a_model_without_tokenizer_says_so(ws, no_tokenizer_dir) -> None:
    outcome = ws.refused(["view", "hello", "--model", str(no_tokenizer_dir)], "has no tokenizer")
    assert "Model.from_hf" not in outcome.err
