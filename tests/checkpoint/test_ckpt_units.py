"""Building blocks: safetensors headers, layer-id conventions across releases, launch-flag parsing, formats."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_patches.checkpoint import layer_ids as L
from eagle3_patches.checkpoint.formats import (
    SGLANG_EAGLE3,
    SPECULATORS,
    CheckpointError,
    detect_format,
    draft_view,
    read_config,
    target_view,
)
from eagle3_patches.checkpoint.launch_args import LaunchArgsError, parse_launch_args
from eagle3_patches.checkpoint.releases import facts
from eagle3_patches.checkpoint.safetensors_header import (
    HeaderError,
    alignment_order,
    bytes_read,
    encode_header,
    read_header,
    reset_bytes_read,
)
from eagle3_patches.errors import Eagle3ConfigError
from eagle3_patches.testing import tiny_models as tm


# ------------------------------------------------------------------ safetensors headers
def test_read_header_matches_the_library(tiny):
    f = tiny["draft"] / "model.safetensors"
    reset_bytes_read()
    h = read_header(f)
    assert bytes_read() == 8 + h.header_len < f.stat().st_size  # the header only
    ref = load_file(str(f))
    assert set(h.tensors) == set(ref)
    for name, t in h.tensors.items():
        assert list(t.shape) == list(ref[name].shape)
        assert t.nbytes == ref[name].numel() * ref[name].element_size()
    assert h.metadata == {"format": "pt"}


def test_encode_header_is_readable_by_safetensors(tmp_path):
    entries = alignment_order([("b", "BOOL", [3]), ("a", "BF16", [2, 2]), ("c", "I64", [2])])
    assert [e[0] for e in entries] == ["c", "a", "b"]  # widest first
    header, offsets = encode_header(entries, {"format": "pt"})
    data = (
        torch.arange(2, dtype=torch.int64).numpy().tobytes()
        + torch.ones(2, 2, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
        + bytes([1, 0, 1])
    )
    f = tmp_path / "x.safetensors"
    f.write_bytes(header + data)
    assert len(header) % 8 == 0
    got = load_file(str(f))
    assert got["c"].tolist() == [0, 1] and got["b"].tolist() == [True, False, True]
    assert read_header(f).tensors["a"].start == offsets["a"][0]


#: every safetensors dtype torch can store, by its torch name
TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}


def test_headers_are_written_byte_for_byte_as_the_safetensors_library_writes_them(tmp_path):
    """The converter's header writer and the library's ``save_file``, for two tensors of each dtype torch has
    (names that sort against the dtype order; 9 and 10 elements, so that a bit width off by one shows): the same
    header bytes, so the same layout."""
    from safetensors.torch import save_file

    from eagle3_patches.checkpoint.safetensors_header import DTYPE_BITS, LIBRARY_DTYPE_ORDER

    assert sorted(LIBRARY_DTYPE_ORDER) == sorted(DTYPE_BITS)
    tensors = {}
    for i, (name, attr) in enumerate(TORCH_DTYPES.items()):
        if hasattr(torch, attr):
            tensors[f"{chr(122 - i)}.{name}"] = torch.zeros(3, 3, dtype=getattr(torch, attr))
            tensors[f"{chr(97 + i)}.{name}"] = torch.zeros(2, 5, dtype=getattr(torch, attr))
    ours, _ = encode_header(alignment_order((n, _st_dtype(t), t.shape) for n, t in tensors.items()), {"format": "pt"})
    save_file(tensors, str(tmp_path / "lib.safetensors"), metadata={"format": "pt"})
    theirs = (tmp_path / "lib.safetensors").read_bytes()[: len(ours)]
    assert ours == theirs, (ours[:200], theirs[:200])


def _st_dtype(t) -> str:
    return next(n for n, attr in TORCH_DTYPES.items() if getattr(torch, attr, None) == t.dtype)


def _header_file(tmp_path, body, data: bytes = b"", name: str = "bad.safetensors") -> Path:
    raw = json.dumps(body).encode()
    f = tmp_path / name
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return f


def _refusal(f) -> HeaderError:
    with pytest.raises(HeaderError) as info:
        read_header(f)
    return info.value


def _library_refusal(f) -> str:
    """What the safetensors library says of the file ("" when it accepts it)."""
    from safetensors import safe_open

    try:
        with safe_open(str(f), framework="numpy"):
            return ""
    except Exception as exc:  # noqa: BLE001 - any refusal
        return str(exc)


_U64 = (1 << 64) - 1


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, r"data_offsets is not \[begin, end\]"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, r"data_offsets is not \[begin, end\]"),
        # the largest well-formed U8 tensor (2^61 - 1 bytes: its bits fit a u64), far more data than the file has
        ({"x": {"dtype": "U8", "shape": [(1 << 61) - 1], "data_offsets": [0, (1 << 61) - 1]}}, "truncated"),
        ({"x": {"dtype": "U8", "shape": [2, 1 << 63], "data_offsets": [0, 0]}}, "overflows 64 bits"),
        ({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, "unknown dtype"),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "non-negative"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "does not match"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, "gap"),
        (
            {
                "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "y": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]},
            },
            "overlaps",
        ),
        ({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}, "truncated"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"a": 1}}, "__metadata__"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_bad_headers(tmp_path, body, needle):
    f = _header_file(tmp_path, body, b"\0" * 8)
    err = _refusal(f)
    assert re.search(needle, err.what), err  # the what alone: the test's id is in the path, so in str(err)
    assert err.where == str(f) and err.fix
    assert _library_refusal(f)  # never stricter than the loader


@pytest.mark.parametrize(
    "body, data_len, what, found, expected",
    [
        # a span longer than dtype x shape, and shorter, and one for a tensor with a zero dimension
        (
            {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}},
            8,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "8 bytes ([0, 8])",
            "4 bytes for F32 [1]",
        ),
        (
            {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
            4,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "4 bytes ([0, 4])",
            "8 bytes for F32 [2]",
        ),
        (
            {"__metadata__": {"format": "pt"}, "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
            4,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "4 bytes ([0, 4])",
            "8 bytes for F32 [2]",
        ),
        (
            {"x": {"dtype": "F32", "shape": [0], "data_offsets": [0, 4]}},
            4,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "4 bytes ([0, 4])",
            "0 bytes for F32 [0]",
        ),
        (
            {"x": {"dtype": "U8", "shape": [_U64, 0], "data_offsets": [0, 4]}},
            4,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "4 bytes ([0, 4])",
            f"0 bytes for U8 [{_U64}, 0]",
        ),
        # the sub-byte dtypes' widths
        (
            {"x": {"dtype": "F4", "shape": [4], "data_offsets": [0, 3]}},
            3,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "3 bytes ([0, 3])",
            "2 bytes for F4 [4]",
        ),
        (
            {"x": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 4]}},
            4,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "4 bytes ([0, 4])",
            "3 bytes for F6_E2M3 [4]",
        ),
        (
            {"x": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [0, 4]}},
            4,
            "tensor 'x': data_offsets span does not match dtype and shape",
            "4 bytes ([0, 4])",
            "3 bytes for F6_E3M2 [4]",
        ),
        (
            {"x": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}},
            2,
            "tensor 'x': 3 elements of F4 do not fill whole bytes",
            "[3]",
            "",
        ),
        # the tiling of the data region
        (
            {"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
            8,
            "tensor 'x': data leaves a gap before it",
            "begins at 4",
            "begins at 0",
        ),
        (
            {
                "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "y": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]},
            },
            6,
            "tensor 'y': data overlaps the previous tensor",
            "begins at 2",
            "begins at 4",
        ),
        (
            {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}},
            8,
            "safetensors file is truncated: the header declares more data than the file holds",
            "8 data bytes",
            "12 data bytes",
        ),
        (
            {"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}},
            2,
            "safetensors file has trailing bytes after the last tensor",
            "2 data bytes",
            "1 data bytes",
        ),
        # offsets that are no [begin, end]: not a list, missing, three numbers (whose first two would fit), one,
        # a begin of -1 (whose span would fit)
        *[
            (
                {"x": {"dtype": "F32", "shape": [1], **({} if offsets is None else {"data_offsets": offsets})}},
                4,
                "tensor 'x': data_offsets is not [begin, end] with 0 <= begin <= end",
                repr(offsets),
                "",
            )
            for offsets in (7, None, [0, 4, 8], [4], [-1, 3])
        ],
        (
            {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "y": [1]},
            4,
            "tensor 'y': header entry is not an object",
            "[1]",
            "",
        ),
        # the largest end a u64 holds is an end (and then far from what one U8 needs)
        (
            {"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, _U64]}},
            1,
            "tensor 'x': data_offsets span does not match dtype and shape",
            f"{_U64} bytes ([0, {_U64}])",
            "1 bytes for U8 [1]",
        ),
    ],
)
def test_a_refused_header_says_what_was_found_and_what_was_expected(tmp_path, body, data_len, what, found, expected):
    f = _header_file(tmp_path, body, b"\0" * data_len)
    err = _refusal(f)
    assert (err.what, err.found, err.expected) == (what, found, expected)
    assert _library_refusal(f)


#: shapes at the library's overflow: elements x bits past 2^64 - 1 or not, and (its product runs in order) a 0
#: after the element count overflowed or before it could
_OVERFLOW_CASES = [
    ("U8", [_U64]),
    ("U8", [1 << 61]),
    ("U8", [(1 << 61) - 1]),
    ("BOOL", [(1 << 61) - 1]),
    ("F32", [1 << 59]),
    ("F32", [(1 << 59) - 1]),
    ("F4", [1 << 62]),
    ("F4", [(1 << 62) - 2]),
    ("U8", [1 << 32, 1 << 32, 0]),
    ("U8", [1 << 32, (1 << 32) - 1, 0]),
    ("U8", [0, 1 << 32, 1 << 32]),
    ("U8", [_U64, 0]),
]


@pytest.mark.parametrize("dtype, shape", _OVERFLOW_CASES)
def test_dtype_x_shape_overflows_exactly_where_the_librarys_checked_product_does(tmp_path, dtype, shape):
    f = _header_file(tmp_path, {"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}})
    library = _library_refusal(f)
    what = ""
    try:
        read_header(f)  # accepted: a tensor of no bytes
    except HeaderError as exc:
        what = exc.what
    assert ("overflows 64 bits" in what) == ("overflow" in library), (what, library)


def test_the_overflow_cases_hold_both_answers(tmp_path):
    """The table above is no vacuous agreement: the library overflows on some of its shapes and not on others."""
    said = {
        "overflow" in _library_refusal(_header_file(tmp_path, {"x": {"dtype": d, "shape": s, "data_offsets": [0, 0]}}))
        for d, s in _OVERFLOW_CASES
    }
    assert said == {True, False}


def test_each_dtypes_bit_width_is_the_librarys(tmp_path):
    """A tensor of 8 elements of each dtype, sized by DTYPE_BITS, is what the library accepts; one byte more it
    refuses.
    """
    from eagle3_patches.checkpoint.safetensors_header import DTYPE_BITS, tensor_nbytes

    for dtype in DTYPE_BITS:
        header, offsets = encode_header([("x", dtype, [8])])
        nbytes = tensor_nbytes(dtype, [8])
        assert offsets["x"] == (0, nbytes)
        f = tmp_path / f"{dtype}.safetensors"
        f.write_bytes(header + b"\0" * nbytes)
        assert read_header(f).tensors["x"].nbytes == nbytes, dtype
        body = {"x": {"dtype": dtype, "shape": [8], "data_offsets": [0, nbytes + 1]}}
        assert "does not match" in _refusal(_header_file(tmp_path, body, b"\0" * (nbytes + 1))).what, dtype


def test_the_dtype_classes_are_torchs():
    """The doctor's float (weights) and integer (d2t) dtype classes, as torch classes the dtypes it can store."""
    from eagle3_patches.checkpoint.safetensors_header import FLOAT_DTYPES, INT_DTYPES

    dtypes = {name: getattr(torch, attr) for name, attr in TORCH_DTYPES.items() if hasattr(torch, attr)}
    ints = {n for n, d in dtypes.items() if not d.is_floating_point and not d.is_complex and d != torch.bool}
    floats = {n for n, d in dtypes.items() if d.is_floating_point and d.itemsize >= 2}  # the fp8 kinds are quantized
    assert (INT_DTYPES, FLOAT_DTYPES) == (ints, floats)


@pytest.mark.parametrize(
    "entry, field, cut",
    [
        ({"dtype": "Q" * 100, "shape": [1], "data_offsets": [0, 1]}, "found", lambda e: repr(e["dtype"])[:80]),
        ({"dtype": "F32", "shape": [-1] * 100, "data_offsets": [0, 4]}, "found", lambda e: repr(e["shape"])[:200]),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0] * 100}, "found", lambda e: repr(e["data_offsets"])[:200]),
        ({"dtype": "F4", "shape": [1] * 100 + [3], "data_offsets": [0, 2]}, "found", lambda e: repr(e["shape"])[:200]),
        (
            {"dtype": "U8", "shape": [1 << 32] * 100, "data_offsets": [0, 0]},
            "found",
            lambda e: "U8 " + repr(e["shape"])[:200],
        ),
        (
            {"dtype": "F32", "shape": [1] * 100, "data_offsets": [0, 8]},
            "expected",
            lambda e: "4 bytes for F32 " + repr(e["shape"])[:200],
        ),
        ([0] * 100, "found", lambda e: repr(e)[:200]),
    ],
)
def test_a_long_value_is_shown_cut(tmp_path, entry, field, cut):
    err = _refusal(_header_file(tmp_path, {"x": entry}, b"\0" * 8))
    shown = getattr(err, field)
    assert shown == cut(entry) and len(shown) < len(repr(entry))


def test_long_metadata_and_a_long_library_message_are_shown_cut(tmp_path):
    from eagle3_patches.checkpoint.safetensors_header import _explain

    meta = {f"k{i}": i for i in range(100)}
    err = _refusal(_header_file(tmp_path, {"__metadata__": meta}))
    assert err.found == repr(meta)[:200]
    # a header the hand-written checks find nothing wrong with: the library's own words, cut at 300 characters
    raw = json.dumps({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).encode()
    assert _explain(raw, "w", 1, "E" * 400).found == "E" * 300


def test_a_file_of_a_header_only_is_read(tmp_path):
    """No data at all (8 + N bytes exactly): a valid file of no tensors, or of empty ones."""
    f = _header_file(
        tmp_path, {"__metadata__": {"format": "pt"}, "x": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}}
    )
    h = read_header(f)
    assert (h.names, h.metadata, h.data_len, h.tensors["x"].shape) == (["x"], {"format": "pt"}, 0, (0, 3))


def test_a_header_cut_by_one_byte_is_truncated_before_it_is_read(tmp_path):
    f = _header_file(tmp_path, {"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})
    raw = f.read_bytes()
    f.write_bytes(raw[:-1])
    n = len(raw) - 8
    reset_bytes_read()
    err = _refusal(f)
    assert (err.what, err.found, err.expected) == (
        "safetensors header is truncated",
        f"file of {n + 7} bytes",
        f"at least {n + 8} bytes (header length {n})",
    )
    assert bytes_read() == 8  # the length only


@pytest.mark.parametrize("extra", [0, 1])
def test_the_header_length_bound_is_the_librarys(tmp_path, extra):
    from eagle3_patches.checkpoint.safetensors_header import MAX_HEADER_BYTES

    n = MAX_HEADER_BYTES + extra
    f = tmp_path / "big.safetensors"
    with open(f, "wb") as fh:  # sparse: "{}" and zeros
        fh.write(n.to_bytes(8, "little") + b"{}")
        fh.truncate(8 + n)
    err = _refusal(f)
    assert ("implausible" in err.what) == ("too large" in _library_refusal(f)) == bool(extra), err


def test_the_files_permission_bits_are_kept(tmp_path):
    f = _header_file(tmp_path, {"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    f.chmod(0o2751)
    assert read_header(f).mode == 0o2751


def test_encode_header_refuses_a_duplicate_or_reserved_name():
    for entries in ([("a", "U8", [1]), ("a", "U8", [1])], [("__metadata__", "U8", [1])]):
        with pytest.raises(ValueError, match="duplicate or reserved tensor name"):
            encode_header(entries)
    assert encode_header([("a", "U8", [1]), ("b", "U8", [1])])[1] == {"a": (0, 1), "b": (1, 2)}


def test_nothing_is_counted_read_before_anything_is_read():
    import subprocess
    import sys

    code = "from eagle3_patches.checkpoint.safetensors_header import bytes_read; print(bytes_read())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert out.stdout.strip() == "0"


def test_duplicate_keys_and_trailing_bytes(tmp_path):
    entry = b'"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    raw = b"{" + entry + b", " + entry + b"}"
    f = tmp_path / "dup.safetensors"
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0")
    with pytest.raises(HeaderError, match="duplicate"):
        read_header(f)
    raw = b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0\0")
    with pytest.raises(HeaderError, match="trailing"):
        read_header(f)


def test_a_duplicate_name_is_refused_where_an_escaped_key_hides_one_entrys_offsets(tmp_path):
    """Two entries named ``x``, the second spelling ``data_offsets`` with a JSON escape: the library keeps the
    last and loads the file; the literal ``"data_offsets"`` count matches its one name, so only a parse of the
    header (which a backslash forces) sees the duplicate."""
    raw = (
        b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
        b'"x": {"dtype": "U8", "shape": [1], "data\\u005foffsets": [0, 1]}}'
    )
    assert json.loads(raw.replace(b'"x"', b'"y"', 1))["x"]["data_offsets"] == [0, 1]  # the escape is the key
    f = tmp_path / "dup.safetensors"
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0")
    assert _library_refusal(f) == ""
    assert _refusal(f).what == "safetensors header has a duplicate name"


@pytest.mark.parametrize("size", [0, 7])
def test_header_errors_are_config_errors(tmp_path, size):
    f = tmp_path / "short.safetensors"
    f.write_bytes(b"\x08" * size)  # less than the 8 bytes of the length
    with pytest.raises(Eagle3ConfigError, match="too short to hold a header"):
        read_header(f)
    with pytest.raises(Eagle3ConfigError, match="directory"):
        read_header(tmp_path)


# ------------------------------------------------------------------ layer ids
def test_kimi_ids_on_each_release():
    # SpecForge's Kimi-K2.5 draft: [2, 30, 58], 61 layers
    assert L.what_captures([2, 30, 58], 61, "0.5.9").outputs == (2, 30, 58)
    assert L.what_captures([2, 30, 58], 61, "0.5.12").outputs == (2, 30, 58)
    assert L.what_captures([2, 30, 58], 61, "0.5.13").outputs == (1, 29, 57)  # the meaning changed
    assert L.what_captures([1, 30, 58], 61, "0.5.13").outputs == (1, 30, 58)  # first id 1: +1 kept
    assert L.what_captures([2, 30, 58], 61, "0.5.10.post1").points == (3, 31, 59)


def test_what_captures_names_every_failure():
    cap = L.what_captures([58, 2, 60, -1, 2], 61, "0.5.9")
    assert cap.crash_points == (0,)  # -1 -> before layer 0: residual None
    assert cap.never_reached == (61,)  # 60 -> before layer 61
    assert cap.duplicates == (2,)
    assert cap.reordered
    assert cap.outputs == (2, 58) and cap.n_states == 2


@pytest.mark.parametrize(
    "ids, failure",
    [
        ([-1, 30, 58], "crash_points"),  # capture before layer 0
        ([2, 30, 60], "never_reached"),  # before layer 61 of 61
        ([-2, 30, 58], "never_reached"),  # before layer -1
        ([2, 2, 30], "duplicates"),
        ([30, 2, 58], "reordered"),
        ([2, 30, 58], None),
    ],
)
def test_each_failure_alone_makes_the_capture_broken(ids, failure):
    """Any one failure is enough for the doctor to leave the ids to aux_capture_validation's rule (``broken``)."""
    cap = L.what_captures(ids, 61, "0.5.9")
    assert [f for f in ("crash_points", "never_reached", "duplicates", "reordered") if getattr(cap, f)] == (
        [failure] if failure else []
    )
    assert cap.broken == (failure is not None)


def test_only_the_captured_states_order_counts():
    cap = L.what_captures([2, 60, 30], 61, "0.5.9")  # 60 is never reached; 2 and 30 arrive in the order asked
    assert cap.never_reached == (61,) and not cap.reordered and cap.outputs == (2, 30)


def test_defaults_when_no_ids():
    cap = L.what_captures(None, 61, "0.5.9")
    assert cap.points == (2, 30, 58) and cap.outputs == (1, 29, 57)
    unknown = L.what_captures(None, None, "0.5.9")  # neither ids nor the target's depth: nothing to judge
    assert (unknown.points, unknown.outputs, unknown.broken) == ((), (), False)


def test_the_capture_is_described_as_the_doctor_prints_it():
    assert L.what_captures([2, 30, 58], 61, "0.5.9").describe() == (
        "on sglang 0.5.9, ids [2, 30, 58] -> capture before layers [3, 31, 59]: "
        "the outputs of layers [2, 30, 58] of 61 (3 state(s), in layer order)"
    )
    assert L.what_captures(None, 61, "0.5.13").describe() == (
        "on sglang 0.5.13, no ids (sglang's defaults) -> capture before layers [2, 30, 58]: "
        "the outputs of layers [1, 29, 57] of 61 (3 state(s), in layer order)"
    )
    assert (
        L.what_captures([2, 30], None, "0.5.9")
        .describe()
        .endswith("the outputs of layers [2, 30] (2 state(s), in layer order)")
    )


def test_conventions_round_trip():
    assert L.to_output_of_layer([2, 30, 58], L.INPUT_OF_LAYER) == [1, 29, 57]
    assert L.from_output_of_layer([1, 29, 57], L.INPUT_OF_LAYER) == [2, 30, 58]
    assert L.to_output_of_layer([2, 30, 58], L.OUTPUT_OF_LAYER) == [2, 30, 58]
    with pytest.raises(ValueError):
        L.to_output_of_layer([1], "sideways")


@pytest.mark.parametrize("version", ["0.5.8", "0.5.9", "0.5.12", "0.5.13", "0.5.23"])
@pytest.mark.parametrize("outputs", [[2, 30, 58], [1, 29, 57], [0, 30, 59]])
def test_ids_for_sglang_capture_what_was_asked(version, outputs):
    try:
        ids = L.ids_for_sglang(outputs, version)
    except Eagle3ConfigError:
        assert outputs[0] == 0 and not facts(version).plus_one_always
        return
    assert list(L.what_captures(ids, 61, version).outputs) == outputs


def test_valid_range():
    assert L.valid_output_range(61) == (0, 59)
    assert L.what_captures([59], 61, "0.5.9").never_reached == ()
    assert L.what_captures([60], 61, "0.5.9").never_reached == (61,)


def test_release_facts():
    f9, f12, f14 = facts("0.5.9"), facts("0.5.12"), facts("0.5.14")
    assert f9.has_kimi_k25 and f9.plus_one_always and not f9.loads_layers0_keys and not f9.fc_width_from_ids
    assert f12.loads_layers0_keys and f12.fc_width_from_ids and f12.plus_one_always
    assert not f14.plus_one_always
    assert not facts("0.5.8").has_kimi_k25
    with pytest.raises(ValueError, match="not a version"):
        facts("banana")


@pytest.mark.parametrize(
    "fact, first", [("has_kimi_k25", "0.5.9"), ("loads_layers0_keys", "0.5.12"), ("fc_width_from_ids", "0.5.12")]
)
def test_a_release_fact_starts_at_the_release_that_brought_it(fact, first):
    """The release table (docs/compat.md): each fact holds from its release on, not one release earlier."""
    major, minor, patch = map(int, first.split("."))
    assert not getattr(facts(f"{major}.{minor}.{patch - 1}"), fact)
    assert getattr(facts(first), fact) and getattr(facts(f"{first}.post1"), fact)


def test_the_plus_one_rule_ends_with_0_5_12():
    assert facts("0.5.12.post1").plus_one_always and not facts("0.5.13rc1").plus_one_always


def test_release_facts_compare_release_numbers_only():
    assert facts("0.5.10.post1").release == facts("0.5.10").release == (0, 5, 10)
    assert facts("0.5.13rc1").release == (0, 5, 13)
    assert facts("0.6").release == (0, 6, 0) and facts("1").release == (1, 0, 0)
    assert len({facts("0.5.9"), facts("0.5.9.0")}) == 1  # values: usable as keys


def test_the_release_table_spans_the_releases_the_matrix_checks(tiny):
    """The doctor says when it extrapolates: outside the releases it was read from, which end at the newest
    release the library has been checked against (``NEWEST_CHECKED``, the matrix's ``newest-known``)."""
    from eagle3_patches.checkpoint.releases import NEWEST_CHECKED
    from eagle3_patches.doctor import doctor

    newest = str(NEWEST_CHECKED)
    major, minor, patch = map(int, newest.split("."))
    inside = {"0.5.8", newest}
    for version in ("0.5.7", "0.5.8", newest, f"{major}.{minor}.{patch + 1}", "0.6.0"):
        report = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version=version)
        notes = [d for d in report.findings if d.code == "sglang-version-unknown"]
        assert bool(notes) == (version not in inside), (version, report.format())
        if notes:
            assert f"(0.5.8-{newest})" in notes[0].what


def test_a_patch_covers_the_releases_it_declares():
    import eagle3_patches
    from eagle3_patches.checkpoint.releases import parse_version

    kimi = eagle3_patches.get_registry()["kimi_k25_eagle3_delegation"]
    assert kimi.covers(parse_version("0.5.9"))
    assert not kimi.covers(parse_version("0.5.10")) and not kimi.covers(parse_version("0.5.10.post1"))


# ------------------------------------------------------------------ launch flags
def test_parse_full_command():
    la = parse_launch_args(
        "SGLANG_X=1 eagle3-patches run -- python3.11 -u -m sglang.launch_server --model-path /m --tp 8 "
        "--speculative-algorithm eagle3 --speculative-draft-model /d --enable-two-batch-overlap "
        "--mem-fraction-static 0.8 --pp-size=2 --disable-cuda-graph --dtype bfloat16"
    )
    assert la.with_patches and la.program == "python -m sglang.launch_server"
    assert (la.model_path, la.draft_path, la.algorithm, la.tp, la.pp, la.dtype) == (
        "/m",
        "/d",
        "EAGLE3",
        8,
        2,
        "bfloat16",
    )
    assert la.enable_two_batch_overlap and la.disable_cuda_graph
    assert la.unknown == ["--mem-fraction-static", "0.8"]


@pytest.mark.parametrize(
    "argv, program, with_patches",
    [
        ("A=1 env B=2 python -m sglang.launch_server --tp 4", "python -m sglang.launch_server", False),
        (
            "python3.11 -X importtime -W ignore -u -m sglang.launch_server --tp 4",
            "python -m sglang.launch_server",
            False,
        ),
        ("python3 -Q new -m sglang.launch_server --tp 4", "python -m sglang.launch_server", False),
        ("python launch_server.py --tp 4", "python -m sglang.launch_server", False),
        ("/usr/bin/python3 /srv/sglang/launch_server.py --tp 4", "python -m sglang.launch_server", False),
        ("sglang serve --tp 4", "sglang serve", False),
        ("eagle3-patches run python -m sglang.launch_server --tp 4", "python -m sglang.launch_server", True),
        ("eagle3-patches run --some-option -- sglang serve --tp 4", "sglang serve", True),
        ("eagle3-patches run -v sglang serve --tp 4", "sglang serve", True),
        ("eagle3-patches run sglang serve --tp 4", "sglang serve", True),
        ("python3 -u /srv/sglang/launch_server.py --tp 4", "python -m sglang.launch_server", False),
        ("env eagle3-patches run -- python -m eagle3_patches run -- sglang serve --tp 4", "sglang serve", True),
        ("--tp 4", "flags", False),
        # an argv list (what the CLI passes) and sglang's longer names of the flag
        (["--tp-size", "4"], "flags", False),
        (["--", "--tensor-parallel-size", "4"], "flags", False),
        (["sglang", "serve", "--tp", "4"], "sglang serve", False),
        (
            ["python", "-m", "eagle3_patches", "run", "--", "python", "-m", "sglang.launch_server", "--tp", "4"],
            "python -m sglang.launch_server",
            True,
        ),
    ],
)
def test_each_launch_form_finds_the_flags_and_the_wrapper(argv, program, with_patches):
    la = parse_launch_args(argv)
    assert (la.tp, la.program, la.with_patches, la.unknown) == (4, program, with_patches, [])


def test_no_flags_mean_sglangs_defaults():
    assert parse_launch_args("python -m sglang.launch_server").program == "python -m sglang.launch_server"
    for wrapper in ("eagle3-patches run --", "eagle3-patches run"):  # nothing wrapped: the flags are sglang's defaults
        la = parse_launch_args(wrapper)
        assert (la.with_patches, la.program, la.tp) == (True, "flags", 1)
    for argv in ([], "", "--", "A=1 env"):
        la = parse_launch_args(argv)
        assert la.as_dict() == {
            "model_path": None,
            "draft_path": None,
            "algorithm": None,
            "tp": 1,
            "pp": 1,
            "dp": 1,
            "nnodes": 1,
            "dtype": "auto",
            "enable_two_batch_overlap": False,
            "enable_multi_layer_eagle": False,
            "enable_pdmux": False,
            "disable_cuda_graph": False,
            "enable_flashinfer_allreduce_fusion": False,
            "enable_dp_attention": False,
            "enable_hierarchical_cache": False,
            "hicache_storage_backend": None,
            "hicache_storage_backend_extra_config": None,
            "hicache_mem_layout": None,
            "enable_multimodal": False,
            "cuda_graph_backend_prefill": None,
            "enable_breakable_cuda_graph": False,
            "disable_prefill_cuda_graph": False,
            "moe_a2a_backend": "none",
            "json_model_override_args": None,
            "context_length": None,
            "quantization": None,
            "draft_quantization": None,
            "attention_backend": None,
            "draft_attention_backend": None,
            "num_steps": None,
            "eagle_topk": None,
            "num_draft_tokens": None,
            "speculative_adaptive": False,
            "disable_overlap_schedule": False,
            "disaggregation_mode": "null",
            "transfer_backend": "mooncake",
            "page_size": None,
            "kv_cache_dtype": "auto",
            "env": {"A": "1"} if argv == "A=1 env" else {},  # the assignment in front of the (empty) command
            "with_patches": False,
            "run_only": [],
            "run_disable": [],
            "program": "flags",
            "given": [],
            "unknown": [],
        }


def test_without_a_launch_command_the_doctor_gives_both_verdicts_and_exits_by_stock_sglangs(tiny):
    from eagle3_patches.doctor import doctor

    r = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9")
    assert "stock sglang or eagle3-patches (not known from the flags: both verdicts below)" in r.format()
    assert r.facts["with_patches"] is None and r.with_patches is not None
    assert (r.exit_code, r.with_patches.exit_code) == (1, 0)
    wrapped = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9", launch="eagle3-patches run -- --tp 1")
    assert "with eagle3-patches" in wrapped.format()


def test_every_flag_the_doctor_reads_is_parsed_and_marked_given():
    la = parse_launch_args(
        "--nnodes 2 --pp 2 --enable-two-batch-overlap --disable-cuda-graph "
        "--enable-flashinfer-allreduce-fusion --enable-dp-attention --moe-a2a-backend deepep "
        """--json-model-override-args '{"a": 1}' -h --speculative-alg EAGLE --context-length 8192 """
        "--quantization fp8 --speculative-draft-model-quantization unquant --attention-backend trtllm_mla "
        "--speculative-draft-attention-backend fa3"
    )
    assert (la.context_length, la.quantization, la.draft_quantization) == (8192, "fp8", "unquant")
    assert (la.attention_backend, la.draft_attention_backend) == ("trtllm_mla", "fa3")
    assert (la.nnodes, la.pp, la.moe_a2a_backend, la.json_model_override_args) == (2, 2, "deepep", '{"a": 1}')
    assert la.enable_two_batch_overlap and la.disable_cuda_graph and la.enable_flashinfer_allreduce_fusion
    assert la.enable_dp_attention
    assert la.given == {
        "nnodes",
        "pp",
        "enable_two_batch_overlap",
        "disable_cuda_graph",
        "enable_flashinfer_allreduce_fusion",
        "enable_dp_attention",
        "moe_a2a_backend",
        "json_model_override_args",
        "context_length",
        "quantization",
        "draft_quantization",
        "attention_backend",
        "draft_attention_backend",
    }
    assert la.unknown == ["-h", "--speculative-alg", "EAGLE"]  # no help exit, no abbreviations: sglang's own parser
    assert la.as_dict()["given"] == sorted(la.given) and la.as_dict()["unknown"] == la.unknown


@pytest.mark.parametrize("algorithm", ["eagle", "EAGLE3", "NextN", "standalone", "ngram"])
def test_each_speculative_algorithm_sglang_knows_is_accepted(algorithm):
    assert parse_launch_args(["--speculative-algorithm", algorithm]).algorithm == algorithm.upper()


@pytest.mark.parametrize(
    "argv, what",
    [
        ("vllm serve x", "unrecognised launch command"),
        ("python -m sglang.bench_one_batch", "unrecognised launch command"),
        ("sglang", "unrecognised launch command"),
        ("sglang --tp 4", "unrecognised launch command"),
        ("--tp two", "cannot parse"),
        ("--speculative-algorithm MEDUSA", "cannot parse"),
        ("python -m", "`python -m` without a module name"),
        ("python", "a bare `python`"),
        ("python -X importtime", "a bare `python`"),
        ("eagle3-patches status", "only `eagle3-patches run"),
        ("eagle3-patches doctor --draft /d", "only `eagle3-patches run"),
        ("eagle3-patches", "only `eagle3-patches run"),
        ("--tp 0", "--tp must be >= 1"),
        ("--pp 0", "--pp must be >= 1"),
        ("--nnodes 0", "--nnodes must be >= 1"),
        ('a "b', "cannot split"),
    ],
)
def test_parse_errors(argv, what):
    with pytest.raises(LaunchArgsError) as e:
        parse_launch_args(argv)
    assert what in str(e.value), str(e.value)


def test_a_long_command_line_is_shown_cut_at_200_characters():
    argv = ["vllm", "serve", "x" * 300]
    with pytest.raises(LaunchArgsError) as e:
        parse_launch_args(argv)
    assert e.value.diagnostic.found == " ".join(argv)[:200]


# ------------------------------------------------------------------ formats
def test_detect_formats():
    assert detect_format(tm.eagle3_draft_config()) == SGLANG_EAGLE3
    assert detect_format(tm.speculators_config()) == SPECULATORS
    assert detect_format({"architectures": ["Eagle3Speculator"]}) == SPECULATORS
    assert detect_format(tm.TinyTargetSpec().text_config()) == "model"
    assert detect_format({"architectures": ["LlamaForCausalLMEagle"]}) == "eagle"


def test_views():
    dv = draft_view(tm.speculators_config())
    assert dv.aux_ids == [2, 3, 4] and dv.output_ids == [1, 2, 3] and dv.convention == L.INPUT_OF_LAYER
    assert dv.hidden == tm.HIDDEN and dv.layer_prefix == "transformer_layer_config."
    tv = target_view(tm.kimi_k25_config())
    assert tv.is_kimi_k25 and tv.num_layers == tm.NUM_LAYERS and tv.text_prefix == "text_config."


def test_read_config_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_config(tmp_path / "none")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        read_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no config.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_config(tmp_path)


def test_a_checkpoint_directory_that_cannot_be_listed_is_named_by_its_role(tmp_path, monkeypatch):
    """No config.json, and the directory cannot be listed to look for weights: the refusal names the directory as
    the caller's role (the draft, the target), not as a bare checkpoint."""
    from eagle3_patches.checkpoint import safe_io

    def denied(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(safe_io.os, "listdir", denied)
    with pytest.raises(CheckpointError) as err:
        read_config(tmp_path, "draft")
    assert err.value.what == f"cannot read the draft directory {tmp_path}: permission denied", err.value.what


# ------------------------------------------------------------------ dtype classes, as the doctor applies them
@pytest.mark.parametrize(
    "dtype, accepted",
    [(torch.int64, True), (torch.int32, True), (torch.int16, True), (torch.uint8, True), (torch.float32, False)],
)
def test_d2t_may_be_stored_in_any_integer_dtype(tiny, make_draft, dtype, accepted):
    """sglang adds d2t to an arange of any integer dtype; a float d2t is no table of offsets."""
    from eagle3_patches.doctor import doctor

    def d2t(t):
        t["d2t"] = torch.zeros(t["d2t"].shape, dtype=dtype)  # offsets 0: draft id i is target id i

    report = doctor(tiny["deepseek_v3"], make_draft("d", tensors=d2t), sglang_version="0.5.9")
    assert ("d2t-invalid" not in report.codes()) == accepted, report.format()


# ------------------------------------------------------------------ formats: typed config reads, bounds, weight files
import copy  # noqa: E402
import errno  # noqa: E402

from eagle3_patches.checkpoint import formats as F  # noqa: E402

DOCS = Path(__file__).parents[2] / "docs"
M, N = F.MAX_CONFIG_INT, F.MAX_ID_LIST
IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"
IDS_EXPECTED = f"a list of at most {N} integers in -{M}..{M}"
_GONE = object()
#: each config kind: (its config, the view that reads it)
KINDS = {
    "target": (lambda: tm.TinyTargetSpec().text_config(), target_view),
    "kimi": (tm.kimi_k25_config, target_view),
    "draft": (tm.eagle3_draft_config, draft_view),
    "speculators": (tm.speculators_config, draft_view),
}


def _view(kind: str, edits: dict):
    """The view of ``kind``'s config with ``edits`` ({"a.b": value or _GONE}) applied, and its problems by field."""
    make, view = KINDS[kind]
    cfg = copy.deepcopy(make())
    for dotted, value in edits.items():
        *path, key = dotted.split(".")
        d = cfg
        for p in path:
            d = d[p]
        if value is _GONE:
            del d[key]
        else:
            d[key] = value
    v = view(cfg)
    return cfg, v, {p.where: p for p in v.problems}


def test_the_config_bounds_are_the_ones_docs_security_md_states():
    doc = (DOCS / "security.md").read_text()
    m = re.search(r"sizes and counts in 1\.\.2\^(\d+)-1; id lists of at most (\d+) ids", doc)
    assert (F.MAX_CONFIG_INT, F.MAX_ID_LIST) == (2 ** int(m[1]) - 1, int(m[2]))
    for name, cap in (("config.json", F.MAX_CONFIG_BYTES), (F.INDEX_NAME, F.MAX_INDEX_BYTES)):
        assert cap == int(re.search(rf"\| `{re.escape(name)}` \| [^|]* \| (\d+) MB \|", doc)[1]) << 20


@pytest.mark.parametrize("which", ["config", "index"])
def test_a_config_or_index_of_its_cap_is_read_and_one_byte_more_refused(tmp_path, which):
    cap, name, body = {
        "config": (F.MAX_CONFIG_BYTES, "config.json", {"hidden_size": 64}),
        "index": (F.MAX_INDEX_BYTES, F.INDEX_NAME, {"weight_map": {"a": "model.safetensors"}}),
    }[which]
    read = {"config": lambda: read_config(tmp_path), "index": lambda: F.read_index(tmp_path / name)}[which]
    raw = json.dumps(body).encode()
    (tmp_path / name).write_bytes(raw + b" " * (cap - len(raw)))
    assert read() == (body if which == "config" else body["weight_map"])
    with open(tmp_path / name, "ab") as f:
        f.write(b" ")
    with pytest.raises(CheckpointError, match="implausibly large") as e:
        read()
    assert (e.value.diagnostic.found, e.value.diagnostic.expected) == (f"{cap + 1} bytes", f"<= {cap} bytes")


#: (config, field, value, accepted, the view's attribute, what the problem says is expected)
BOUNDS = [
    *[
        ("target", "hidden_size", v, ok, "hidden", f"an integer in 1..{M}")
        for v, ok in ((1, True), (0, False), (M, True), (M + 1, False))
    ],
    *[
        ("target", "first_k_dense_replace", v, ok, "first_k_dense_replace", f"an integer in 0..{M}")
        for v, ok in ((0, True), (-1, False))
    ],
    *[
        ("draft", "num_hidden_layers", v, ok, "num_layers", f"an integer in 0..{M}")
        for v, ok in ((0, True), (-1, False))
    ],
    *[
        ("draft", IDS, v, ok, "aux_ids", IDS_EXPECTED)
        for v, ok in (
            ([M, -M], True),
            ([M + 1], False),
            ([-M - 1], False),
            (list(range(N)), True),
            (list(range(N + 1)), False),
            ([2.0], False),
            ([True], False),
            (3, False),
        )
    ],
]


@pytest.mark.parametrize("kind, field, value, accepted, attr, expected", BOUNDS)
def test_typed_config_reads_accept_up_to_their_bounds(kind, field, value, accepted, attr, expected):
    _, v, problems = _view(kind, {field: value})
    if accepted:
        assert field not in problems and getattr(v, attr) == value, problems
    else:
        assert getattr(v, attr) is None
        assert (problems[field].found, problems[field].expected) == (repr(value)[:80], expected)


LONG = "x" * 100
#: (config, field, a value of the wrong type, what the problem says is expected); each repr is longer than the 80 shown
WRONG_TYPES = [
    ("target", "architectures", LONG, "a list of strings"),
    ("target", "architectures", [LONG, 1], "a list of strings"),  # one element of the wrong type is enough
    ("target", "model_type", [LONG], "a string"),
    ("kimi", "text_config", [LONG], "an object"),
    ("target", "hidden_size", LONG, f"an integer in 1..{M}"),
    ("draft", "tie_word_embeddings", LONG, "true or false"),
    ("draft", "eagle_config", [LONG], "an object"),
    ("draft", IDS, [LONG], IDS_EXPECTED),
    ("draft", f"eagle_config.{L.CONVENTION_KEY}", LONG, " or ".join(L.CONVENTIONS)),
]


@pytest.mark.parametrize("kind, field, value, expected", WRONG_TYPES)
def test_a_config_field_of_the_wrong_type_is_named_with_80_characters_of_its_value(kind, field, value, expected):
    _, _, problems = _view(kind, {field: value})
    assert (problems[field].found, problems[field].expected) == (repr(value)[:80], expected)


#: (config, field, whether its view reports it missing, what the problem says is expected)
REQUIRED = [
    *[
        (kind, f"{pre}{key}", True, f"an integer in 1..{M}")
        for kind, pre in (("target", ""), ("kimi", "text_config."))
        for key in ("num_hidden_layers", "hidden_size", "vocab_size")
    ],
    *[
        ("draft", key, True, f"an integer in 1..{M}")
        for key in ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size")
    ],
    ("draft", "num_hidden_layers", True, f"an integer in 0..{M}"),
    ("speculators", "transformer_layer_config.num_hidden_layers", False, None),  # speculators' drafts omit it
]


@pytest.mark.parametrize("kind, field, required, expected", REQUIRED)
def test_a_missing_config_field_is_a_problem_only_where_it_is_required(kind, field, required, expected):
    _, _, problems = _view(kind, {field: _GONE})
    if required:
        assert problems[field] == F.FieldProblem(field, "missing", expected)
    else:
        assert field not in problems, problems


#: (config, edits, the view's attribute, its value: a constant, or read from the edited config)
VIEWS = [
    ("target", {"architectures": ["DeepseekV3ForCausalLM", "X"]}, "arch", "DeepseekV3ForCausalLM"),
    ("target", {"dtype": "", "torch_dtype": "torch.float16"}, "dtype", "float16"),
    ("kimi", {"torch_dtype": _GONE, "text_config.torch_dtype": "float16"}, "dtype", "float16"),  # the text_config's
    ("kimi", {"torch_dtype": "float16", "text_config.torch_dtype": _GONE}, "dtype", "float16"),  # the wrapper's
    (
        "kimi",
        {"torch_dtype": "float16", "text_config.torch_dtype": "bfloat16"},
        "dtype",
        "float16",
    ),  # the wrapper's first
    ("kimi", {"quantization_config": {}}, "quantized", True),
    ("kimi", {"text_config.quantization_config": {}}, "quantized", True),
    ("kimi", {}, "quantized", False),
    ("draft", {"num_key_value_heads": 2}, "kv_heads", 2),
    ("draft", {"num_key_value_heads": _GONE}, "kv_heads", lambda c: c["num_attention_heads"]),
    ("draft", {"head_dim": 7}, "head_dim", 7),
    ("draft", {"head_dim": _GONE}, "head_dim", lambda c: c["hidden_size"] // c["num_attention_heads"]),
    ("draft", {"target_hidden_size": 7168}, "effective_target_hidden", 7168),
    ("draft", {"target_hidden_size": _GONE}, "effective_target_hidden", lambda c: c["hidden_size"]),
    ("draft", {"draft_vocab_size": 7}, "effective_draft_vocab", 7),
    ("draft", {"draft_vocab_size": _GONE}, "effective_draft_vocab", lambda c: c["vocab_size"]),
    ("draft", {"tie_word_embeddings": _GONE}, "tie_word_embeddings", False),
    ("draft", {"bias": True}, "fc_bias", True),
    ("speculators", {"transformer_layer_config.bias": True}, "fc_bias", False),  # speculators' fc has no bias
    ("speculators", {}, "convention_stated", True),
    ("speculators", {}, "use_aux_hidden_state", True),
    ("speculators", {}, "layer_model_type", lambda c: c["transformer_layer_config"]["model_type"]),
]


@pytest.mark.parametrize("kind, edits, attr, expected", VIEWS)
def test_what_the_views_read(kind, edits, attr, expected):
    cfg, v, problems = _view(kind, edits)
    assert not problems
    assert getattr(v, attr) == (expected(cfg) if callable(expected) else expected)


@pytest.mark.parametrize(
    "arch, model_type, kimi, family",
    [
        (F.KIMI_K25_ARCH, "other", True, True),
        ("X", "kimi_k25", True, True),
        ("DeepseekV3ForCausalLM", "other", False, True),
        *[("X", mt, False, True) for mt in ("deepseek_v3", "deepseek_v2", "kimi_k2")],
        ("LlamaForCausalLM", "llama", False, False),
    ],
)
def test_a_target_is_kimi_or_deepseek_by_architecture_or_model_type(arch, model_type, kimi, family):
    _, v, _ = _view("target", {"architectures": [arch], "model_type": model_type})
    assert (v.is_kimi_k25, v.deepseek_family) == (kimi, family)


@pytest.mark.parametrize(
    "config",
    [
        {"speculators_model_type": "eagle3"},
        {"transformer_layer_config": {}},
        {"architectures": ["Eagle3DraftModel"]},
        {"architectures": ["Eagle3Speculator"]},
    ],
)
def test_each_mark_of_the_speculators_format_is_enough(config):
    assert detect_format(config) == SPECULATORS


def _write_index(d: Path, weight_map) -> Path:
    (d / F.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d / F.INDEX_NAME


@pytest.mark.parametrize(
    "name", ["", "/etc/passwd", "a\0.safetensors", ".", "./", "..", "../x.safetensors", "a/../../x.safetensors"]
)
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, name):
    with pytest.raises(CheckpointError, match="outside the checkpoint directory") as e:
        F.read_index(_write_index(tmp_path, {"t": "model.safetensors", "u": name}))
    assert e.value.diagnostic.found == repr(name)


def test_an_index_shows_five_of_its_outside_names_and_the_start_of_a_map_it_cannot_use(tmp_path):
    bad = [f"../{c}.safetensors" for c in "fedcba"]
    with pytest.raises(CheckpointError) as e:
        F.read_index(_write_index(tmp_path, {f"t{i}": b for i, b in enumerate(bad)}))
    assert e.value.diagnostic.found == ", ".join(repr(b) for b in sorted(bad)[:5])
    for wm in ({"t" * 300: 1}, None):
        obj = {"metadata": {}, "weight_map": wm}
        (tmp_path / F.INDEX_NAME).write_text(json.dumps(obj))
        with pytest.raises(CheckpointError, match="no weight_map") as e:
            F.read_index(tmp_path / F.INDEX_NAME)
        assert e.value.diagnostic.found == repr(obj)[:200]


def test_index_file_names_are_read_normalized(tmp_path):
    names = {
        "./a.safetensors": "a.safetensors",
        "sub/../b.safetensors": "b.safetensors",
        "c//d.safetensors": "c/d.safetensors",
    }
    wm = {f"t{i}": n for i, n in enumerate(names)}
    assert F.read_index(_write_index(tmp_path, wm)) == {t: names[n] for t, n in wm.items()}


def test_pickle_weights_are_listed_by_name_and_never_read(tmp_path):
    """Every suffix docs/security.md names as a pickle."""
    suffixes = re.findall(
        r"`(\.\w+)`", re.search(r"No pickle is ever loaded \(([^)]*)\)", (DOCS / "security.md").read_text())[1]
    )
    for s in suffixes:
        (tmp_path / f"weights{s}").write_bytes(b"\x80\x04 not read")
    wf = F.list_weight_files(tmp_path)
    assert wf.files == [] and sorted(wf.pickles) == sorted(tmp_path / f"weights{s}" for s in suffixes)


def _two_shards(make_draft):
    d = make_draft("d", shards=2)
    wm = json.loads((d / F.INDEX_NAME).read_text())["weight_map"]
    first, second = sorted(set(wm.values()))
    return d, wm, first, second


@pytest.mark.parametrize("fault", ["missing", "unreadable"])
def test_a_missing_or_unreadable_shard_is_reported_and_the_others_still_read(make_draft, fault):
    d, wm, first, second = _two_shards(make_draft)
    if fault == "missing":
        (d / first).unlink()
    else:
        (d / first).write_bytes(b"not a safetensors file")
    scan = F.scan_shards(F.list_weight_files(d), "draft")
    assert set(scan.tensors) == {n for n, f in wm.items() if f == second} and len(scan.errors) == 1
    if fault == "missing":
        err = scan.errors[0].diagnostic
        assert (err.code, err.what, err.found) == (
            "safetensors-index",
            "a shard named by the draft's index is missing",
            first,
        )


def test_an_index_naming_the_wrong_shard_is_reported_tensor_by_tensor(make_draft):
    d, wm, first, second = _two_shards(make_draft)
    swapped = [next(n for n, f in wm.items() if f == first), next(n for n, f in wm.items() if f == second)]
    wm.update({swapped[0]: second, swapped[1]: first})
    _write_index(d, wm)
    scan = F.scan_shards(F.list_weight_files(d), "draft")
    assert scan.ok and scan.absent == [n for n in wm if n in swapped]


def test_a_tensor_in_two_shards_is_a_duplicate(tmp_path):
    from safetensors.torch import save_file

    for name in ("a.safetensors", "b.safetensors"):
        save_file({"x": torch.zeros(2)}, str(tmp_path / name))
    assert F.scan_shards(F.list_weight_files(tmp_path)).duplicates == [("x", "a.safetensors", "b.safetensors")]


@pytest.mark.parametrize(
    "names, hint",
    [
        (["layers.1.mlp.up_proj.weight"], "one decoder layer"),
        (["model.midlayer.2.mlp.up_proj.weight"], "one decoder layer"),
        (["model.lm_head.weight"], "rename model.lm_head.weight to lm_head.weight"),
        (["layers.0.mlp.up_proj.weight", "model.midlayer.0.mlp.up_proj.weight", "lm_head.weight"], None),
    ],
)
def test_unknown_tensor_hints(names, hint):
    hints = F.unknown_tensor_hints(names, read=frozenset(), release="sglang 0.5.9")
    assert len(hints) == (hint is not None) and all(hint in h for h in hints), hints


def test_a_path_that_cannot_be_looked_at_or_is_kernel_state_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError) as e:
        read_config(tmp_path / "file" / "sub", "draft")
    assert (e.value.code, e.value.what, e.value.diagnostic.found) == (
        "not-a-checkpoint",
        f"the draft path cannot be read: {os.strerror(errno.ENOTDIR)}",
        "NotADirectoryError",
    )
    with pytest.raises(CheckpointError, match="kernel state"):
        read_config("/proc/self", "target")


def test_reading_a_config_counts_its_bytes(tiny):
    reset_bytes_read()
    read_config(tiny["draft"])
    assert bytes_read() == (tiny["draft"] / "config.json").stat().st_size


def test_each_speculators_option_sglang_lacks_is_refused():
    """The options docs/doctor.md lists for ``draft-unsupported-architecture``: refused for a release that reads
    none of them (0.5.9 without the patch set), each naming the first release that reads it."""
    from eagle3_patches.checkpoint import draft_fields as DF
    from eagle3_patches.checkpoint.conversion_plan import unsupported

    row = next(
        line
        for line in (DOCS / "doctor.md").read_text().splitlines()
        if line.startswith("| `draft-unsupported-architecture`")
    )
    options = re.findall(r"`(\w+)`", row.split("speculators' ")[1].split(", or")[0])
    assert set(options) == set(DF.MATH_FIELDS) - {"use_aux_norm"}, row  # speculators has no use_aux_norm
    for option in options:
        found = unsupported({**tm.speculators_config(), option: True}, release="0.5.9").diagnostic.found
        assert found == f"{option}=true ({DF.reads_it(option)})"


# ------------------------------------------------------------------------------------------------ inputs as typed
def test_flags_as_a_shell_quotes_them_are_read_trimmed():
    """A value quoted with its spaces (``--command "... --speculative-algorithm ' EAGLE3 '"``) is the algorithm."""
    assert parse_launch_args(["--speculative-algorithm", " eagle3 "]).algorithm == "EAGLE3"


def test_a_version_pasted_with_its_newline_is_the_version():
    """``--sglang-version "$(pip show sglang | sed -n 's/Version: //p')"`` and the like keep a newline."""
    assert str(facts(" 0.5.13\n").version) == "0.5.13"


def test_a_draft_config_that_enables_aux_states_is_an_eagle3_draft_whatever_its_architecture():
    """No ``Eagle3`` in ``architectures`` but ``eagle_config.use_aux_hidden_state``: sglang's EAGLE-3 format."""
    config = {"architectures": ["LlamaForCausalLM"], "eagle_config": {"use_aux_hidden_state": True}}
    assert F.detect_format(config) == F.SGLANG_EAGLE3
    assert F.detect_format({**config, "eagle_config": {"use_aux_hidden_state": False}}) == F.MODEL


def test_a_yes_no_field_that_is_not_a_bool_is_a_problem_and_its_default():
    """``"tie_word_embeddings": "false"`` (a string, truthy) is not read as true: the default, and a problem."""
    view = F.draft_view(tm.eagle3_draft_config(tm.TinyDraftSpec()) | {"tie_word_embeddings": "false"})
    assert view.tie_word_embeddings is False
    assert any(p.where == "tie_word_embeddings" and p.found == "'false'" for p in view.problems)


@pytest.mark.parametrize(
    "archs, fmt",
    [
        (["LlamaForCausalLMEagle3", "LlamaForCausalLM"], F.SGLANG_EAGLE3),
        (["Eagle3Speculator", "LlamaForCausalLM"], F.SPECULATORS),
        (["LlamaForCausalLMEagle", "LlamaForCausalLM"], F.EAGLE),
    ],
)
def test_one_architecture_of_several_names_the_draft_kind(archs, fmt):
    """A config listing more than one architecture is judged by any of them naming the kind, as sglang's
    registry resolves the first one it knows."""
    assert F.detect_format({"architectures": archs}) == fmt


def test_each_unknown_tensor_kind_is_explained_among_ordinary_names():
    names = ["fc.weight", "input_norm.weight", "midlayer.self_attn.q_norm.weight", "layers.1.mlp.up.weight"]
    hints = " ".join(F.unknown_tensor_hints(names, read=frozenset(), release="sglang 0.5.9"))
    assert "norm_before_fc=true" in hints and "qwen3 decoder layer" in hints and "one decoder layer" in hints


@pytest.mark.parametrize(
    "release, reads_fc_norm, reads_norm_before_fc",
    [((0, 5, 11), False, False), ((0, 5, 12), True, False), ((0, 5, 16), True, False), ((0, 5, 17), True, True)],
)
def test_a_norm_weight_is_unknown_only_where_the_release_does_not_read_its_field(
    release, reads_fc_norm, reads_norm_before_fc
):
    """The hint is derived from what the judged release reads (draft_fields): a weight whose field it reads
    only lacks the field in the config; one whose field it does not read names the first release that does."""
    from eagle3_patches.checkpoint import draft_fields as DF

    label = "sglang " + ".".join(map(str, release))
    hints = F.unknown_tensor_hints(
        ["input_norm.weight", "model.fc_norm.0.weight", "fc_norm.1.weight"],
        read=DF.read_by_release(release),
        release=label,
    )
    assert len(hints) == 2, hints  # one per field
    by_field = {h.split(" ")[0].rstrip(","): h for h in hints}
    assert by_field["fc_norm.1.weight"].startswith("fc_norm.1.weight, model.fc_norm.0.weight ")
    for name, field, first, read in (
        ("input_norm.weight", "norm_before_fc", "0.5.17", reads_norm_before_fc),
        ("fc_norm.1.weight", "fc_norm", "0.5.12", reads_fc_norm),
    ):
        hint = by_field[name]
        if read:
            assert f"belong(s) to {field}" in hint and f"which {label} reads" in hint, hint
            assert "does not read" not in hint
        else:
            assert f"trained with {field}=true, which {label}'s LlamaForCausalLMEagle3 does not read" in hint, hint
            assert f"(sglang >= {first} reads it)" in hint


def test_the_norm_weights_are_matched_by_their_exact_names():
    from eagle3_patches.checkpoint import draft_fields as DF

    assert [DF.field_of_weight(n) for n in ("input_norm.weight", "model.fc_norm.2.weight", "fc_norm.12.weight")] == [
        "norm_before_fc",
        "fc_norm",
        "fc_norm",
    ]
    for other in ("midlayer.input_layernorm.weight", "fc_norm.x.weight", "xinput_norm.weight", "fc_norm.0.bias"):
        assert DF.field_of_weight(other) is None, other
    assert DF.weights_of("fc_norm", 3) == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]
    assert DF.weights_of("norm_before_fc", 3) == ["input_norm.weight"] and DF.weights_of("norm_output", 3) == []


@pytest.mark.parametrize(
    "header, what",
    [
        (
            b'{"__metadata__": {"format": "pt", "n": 1}, "x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
            "__metadata__ is not a map of strings",
        ),
        (b'{"x": {"dtype": "U8", "shape": [1, -1], "data_offsets": [0, 1]}}', "shape is not a list of non-negative"),
        (b'{"x": {"dtype": "U8", "shape": [1, "1"], "data_offsets": [0, 1]}}', "shape is not a list of non-negative"),
        (b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, "1"]}}', "data_offsets is not [begin, end]"),
    ],
)
def test_one_bad_element_among_good_ones_makes_a_header_bad(tmp_path, header, what):
    """Every element is checked: one string dimension, negative dimension, string offset or non-string metadata
    value is refused even where the others are fine."""
    f = tmp_path / "one-bad.safetensors"
    f.write_bytes(len(header).to_bytes(8, "little") + header + b"\0")
    with pytest.raises(HeaderError, match=re.escape(what)):
        read_header(f)
