"""Read and write safetensors *headers* without touching tensor data.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON + the data region.
The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the data region) and may hold a ``"__metadata__"`` string map.

:func:`read_header` reads exactly ``8 + N`` bytes through the one safe opening path
(:mod:`.safe_io`: no links out of the checkpoint, regular files only) and lets the
**safetensors library itself** decide whether the header is valid (``safe_open(...,
framework="numpy")`` parses and validates the header in Rust, in linear time, and reads no
tensor data): whatever it refuses is refused here, so these tools are never more lenient
than the loader.  Hand-written code remains for three reasons only:

* checks the library lacks: a memory budget checked *before* any parse (the library's own
  parse of a 40 MB header of 20M dims takes 800 MB), and duplicate tensor names (the library
  keeps the last one silently; another reader may keep the first);
* wording: the library's refusals ("invalid offset for tensor `x`") name neither what was
  found nor what was expected, so a refused header is diagnosed again by :func:`_explain`
  (linear: numbers of bounded length, products bounded dimension by dimension) for a
  what / where / found / expected / fix message;
* the offsets: the library does not expose ``data_offsets``, which the converter needs; they
  are parsed lazily (:attr:`Header.tensors`) from the header the library has accepted.

Every byte read here is counted (:func:`bytes_read`), so the doctor can say how much it read.
It never imports torch.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .safe_io import (
    CheckpointError,
    CheckpointFile,
    check_parse_budget,
    load_json,
    open_checkpoint_file,
)

#: safetensors' own limit on the JSON header (``N``)
MAX_HEADER_BYTES = 100_000_000
#: no framework loads a tensor of more dimensions (numpy and torch stop at 64)
MAX_RANK = 64
_U64 = (1 << 64) - 1

#: bits per element of every dtype name safetensors 0.8 writes
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
INT_DTYPES = frozenset({"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"})

#: config.json ``torch_dtype`` / ``dtype`` strings -> safetensors dtype names. These are the floating-point names
#: transformers accepts: loading a config it turns the string into ``getattr(torch, name)``, case-sensitively, and
#: stops with AttributeError on any other (``BFloat16``, ``torch.bfloat16``)
CONFIG_DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "half": "F16",
    "float32": "F32",
    "float": "F32",
    "float64": "F64",
    "double": "F64",
}


class HeaderError(CheckpointError):
    """A safetensors file whose header cannot be trusted."""

    default_code = "safetensors-header"


# ------------------------------------------------------------------ read counter
_lock = threading.Lock()
_bytes_read = 0


def _count(n: int) -> None:
    global _bytes_read
    with _lock:
        _bytes_read += n


def bytes_read() -> int:
    """Bytes read by this module (headers) and :func:`count_read` callers since the last reset."""
    return _bytes_read


def count_read(n: int) -> None:
    """Add ``n`` bytes read elsewhere (config files, d2t/t2d) to the counter."""
    _count(n)


def reset_bytes_read() -> None:
    global _bytes_read
    with _lock:
        _bytes_read = 0


# ------------------------------------------------------------------ model
# pragma: no mutate core/ReplaceTrueWithFalse: no code assigns to a `TensorInfo` or hashes one: `frozen` only refuses
# such an assignment
@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # relative to the data region
    end: int
    file: str = ""  # the shard's file name

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class Header:
    """One validated safetensors header.  ``names`` (sorted) and ``metadata`` come from the
    safetensors library; ``tensors`` (with offsets) is parsed on first use."""

    def __init__(
        self,
        path: Path,
        header_len: int,
        file_size: int,
        metadata: dict[str, str],
        names: list[str],
        raw: bytes,
        file: str,
        mode: int,
    ):
        self.path, self.header_len, self.file_size, self.metadata, self.names = (
            path,
            header_len,
            file_size,
            metadata,
            names,
        )
        self.file = file  # the name relative to the checkpoint directory
        self.mode = mode  # the file's permission bits
        self._raw = raw

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def data_len(self) -> int:
        return self.file_size - self.data_start

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """name -> :class:`TensorInfo`, from the header the library accepted (refuses ranks > 64)."""
        obj = json.loads(self._raw)  # valid, bounded JSON of u64 numbers: the library and the budget said so
        obj.pop("__metadata__", None)
        file, out = self.file, {}
        for name, e in obj.items():
            shape = e["shape"]
            if len(shape) > MAX_RANK:
                raise _err(
                    f"tensor {name!r} has {len(shape)} dimensions",
                    str(self.path),
                    found=f"{len(shape)} dimensions",
                    expected=f"<= {MAX_RANK} (no framework loads more)",
                )
            out[name] = TensorInfo(name, e["dtype"], tuple(shape), e["data_offsets"][0], e["data_offsets"][1], file)
        self._raw = b""
        return out


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    bits = DTYPE_BITS[dtype] * n
    # pragma: no mutate core/NumberReplacer `6`: every bit width is even, so `bits % 8` is never 1, the one remainder
    # where `+ 6` and `+ 7` round differently
    return (bits + 7) // 8


# ------------------------------------------------------------------ read
def _err(what: str, where: str, found: str = "", expected: str = "", fix: str = "") -> HeaderError:
    return HeaderError(
        what,
        where=where,
        found=found,
        expected=expected,
        fix=fix or "re-download or re-export this file; the safetensors library would refuse to load it",
    )


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise HeaderError(
                f"duplicate key {k!r}: the safetensors library keeps the last silently, other readers the first"
            )
        out[k] = v
    return out


def _load(raw: bytes, where: str) -> dict:
    """The header JSON, parsed with every bound of :func:`.safe_io.load_json` and duplicates refused."""
    try:
        obj = load_json(
            raw, what="safetensors header", where=where, code="safetensors-header", object_pairs_hook=_no_duplicates
        )
    except HeaderError as exc:  # from _no_duplicates, raised inside json
        raise _err("safetensors header has a duplicate name", where, found=exc.what) from None
    except CheckpointError as exc:
        raise _err(exc.what, where, found=exc.found, expected=exc.expected) from None
    if not isinstance(obj, dict):
        raise _err("safetensors header is not a JSON object", where, found=type(obj).__name__)
    return obj


def _explain(raw: bytes, where: str, data_len: int, library: str) -> HeaderError:
    """Why the safetensors library refused this header, as what / found / expected.

    Linear in the header: the JSON is parsed with bounded numbers, each dimension is checked
    to be a u64 and the running product stops as soon as it passes 2^64 (where the library's
    checked product overflows: the element count, then the element count x the dtype's bits).
    """
    try:
        obj = _load(raw, where)
    except HeaderError as exc:
        return exc
    meta = obj.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values())):
        return _err("safetensors __metadata__ is not a map of strings", where, found=repr(meta)[:200])
    spans = []
    for name, entry in obj.items():
        if not isinstance(entry, dict):
            return _err(f"tensor {name!r}: header entry is not an object", where, found=repr(entry)[:200])
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            return _err(
                f"tensor {name!r}: unknown dtype", where, found=repr(dtype)[:80], expected=", ".join(DTYPE_BITS)
            )
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d <= _U64 for d in shape):
            return _err(
                f"tensor {name!r}: shape is not a list of non-negative integers",
                where,
                found=repr(shape)[:200],
                expected="u64 dimensions",
            )
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= _U64
        ):
            return _err(
                f"tensor {name!r}: data_offsets is not [begin, end] with 0 <= begin <= end",
                where,
                found=repr(offsets)[:200],
            )
        bits = DTYPE_BITS[dtype]
        n = 1
        for d in shape:  # the library's checked u64 product, in order: it overflows even where a later dimension is 0
            n *= d
            if n > _U64:
                break
        # pragma: no mutate core/ReplaceComparisonOperator_Gt_GtE: every bit width is even and 2^64 - 1 is odd: `n *
        # bits` never equals it
        if n * bits > _U64:  # and then elements x bits, checked too
            return _err(
                f"tensor {name!r}: dtype x shape overflows 64 bits",
                where,
                found=f"{dtype} {repr(shape)[:200]}",
                expected="a tensor of fewer than 2^64 bits",
            )
        if (bits * n) % 8:
            return _err(
                f"tensor {name!r}: {n} elements of {dtype} do not fill whole bytes", where, found=repr(shape)[:200]
            )
        want = bits * n // 8
        if offsets[1] - offsets[0] != want:
            return _err(
                f"tensor {name!r}: data_offsets span does not match dtype and shape",
                where,
                found=f"{offsets[1] - offsets[0]} bytes ({offsets})",
                expected=f"{want} bytes for {dtype} {repr(shape)[:200]}",
            )
        spans.append((offsets[0], offsets[1], name))
    pos = 0  # the tensors must tile the data region: no gap, no overlap
    for start, end, name in sorted(spans):
        if start != pos:
            # pragma: no mutate core/ReplaceComparisonOperator_Lt_LtE: inside `if start != pos`: `start == pos` never
            # reaches it
            kind = "overlaps the previous tensor" if start < pos else "leaves a gap before it"
            return _err(f"tensor {name!r}: data {kind}", where, found=f"begins at {start}", expected=f"begins at {pos}")
        pos = end
    if pos > data_len:
        return _err(
            "safetensors file is truncated: the header declares more data than the file holds",
            where,
            found=f"{data_len} data bytes",
            expected=f"{pos} data bytes",
        )
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: the `pos > data_len` branch just above has returned:
    # here `pos <= data_len`, so `!=` is `<`
    if pos != data_len:
        return _err(
            "safetensors file has trailing bytes after the last tensor",
            where,
            found=f"{data_len} data bytes",
            expected=f"{pos} data bytes",
        )
    return _err("the safetensors library refuses this header", where, found=library[:300])


def _library_names(f: CheckpointFile, where: str) -> tuple[list[str], dict[str, str]] | str:
    """``(names, metadata)`` when the safetensors library accepts the file, else its message."""
    from safetensors import safe_open

    try:
        with safe_open(f.library_path, framework="numpy") as st:
            return list(st.keys()), dict(st.metadata() or {})
    except Exception as exc:  # noqa: BLE001 - SafetensorError and friends: any refusal is the answer
        return f"{type(exc).__name__}: {exc}"


def read_header(path: os.PathLike | str, *, root: os.PathLike | str | None = None) -> Header:
    """Read and validate the header of one safetensors file (reads ``8 + N`` bytes only).

    ``root``: the checkpoint directory the file must stay inside (default: the file's own
    directory); the file is opened by :func:`.safe_io.open_checkpoint_file`.  Raises
    :class:`HeaderError` for an invalid header, :class:`.safe_io.CheckpointError` (e.g.
    ``UnsafeFileError``) for a file that must not be read.
    """
    path = Path(path)
    root = path.parent if root is None else Path(root)
    where = str(path)
    rel = os.path.relpath(path, root)
    with open_checkpoint_file(root, rel, what="safetensors file") as f:
        size = f.size
        head = f.read_at(0, 8)
        _count(len(head))
        if len(head) < 8:
            raise _err(
                "safetensors file is too short to hold a header", where, found=f"{size} bytes", expected=">= 8 bytes"
            )
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES:
            raise _err(
                "safetensors header length is implausible (corrupted file?)",
                where,
                found=f"{n} bytes",
                expected=f"<= {MAX_HEADER_BYTES} bytes",
            )
        if 8 + n > size:
            raise _err(
                "safetensors header is truncated",
                where,
                found=f"file of {size} bytes",
                expected=f"at least {8 + n} bytes (header length {n})",
            )
        raw = f.read_at(8, n)
        _count(len(raw))
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: the file's size was checked to hold `8 + n` bytes
        # just above; fewer come back only if the file shrinks between that `fstat` and the `pread` (a race no test can
        # order), and then the library, which reads the header again, refuses the file anyway
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: `read_at(8, n)` returns at most `n` bytes, so `!=`
        # is `<`
        if len(raw) != n:
            raise _err("safetensors header is truncated", where, found=f"{len(raw)} bytes", expected=f"{n} bytes")
        try:
            check_parse_budget(raw, what="safetensors header", where=where, code="safetensors-header")
        except CheckpointError as exc:
            raise _err(exc.what, where, found=exc.found, expected=exc.expected, fix=exc.fix) from None
        got = _library_names(f, where)
        mode = f.stat.st_mode & 0o7777
    if isinstance(got, str):
        raise _explain(raw, where, size - 8 - n, got)
    names, metadata = got
    # the library keeps the last of duplicate names; refuse them.  Without a backslash no
    # JSON string can hide a quote, so each '"data_offsets"' is that exact string: one per
    # entry when no name or metadata says it, and then no two entries share a name.
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: the library accepted the header, so every entry has a
    # `data_offsets` key; without a backslash each is the literal string, so the count is never below the number of
    # names
    if b"\\" in raw or raw.count(b'"data_offsets"') != len(names):
        _load(raw, where)
    return Header(path, n, size, metadata, names, raw, rel, mode)


# ------------------------------------------------------------------ write
def encode_header(
    entries: Iterable[tuple[str, str, Iterable[int]]], metadata: Mapping[str, str] | None = None
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """``8 + N`` header bytes for tensors laid out contiguously in the given order.

    Returns the bytes and ``name -> (begin, end)`` within the data region.  The JSON is
    padded with spaces to a multiple of 8 bytes (as the safetensors library does), so the
    data region starts 8-aligned.
    """
    body: dict = {}
    if metadata:
        body["__metadata__"] = dict(metadata)
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for name, dtype, shape in entries:
        shape = [int(d) for d in shape]
        if name in offsets or name == "__metadata__":
            raise ValueError(f"duplicate or reserved tensor name {name!r}")
        nbytes = tensor_nbytes(dtype, shape)
        body[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + nbytes]}
        offsets[name] = (pos, pos + nbytes)
        pos += nbytes
    raw = json.dumps(body, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, offsets


#: the safetensors library's ``Dtype`` enum in declaration order (0.8): its serializer (``prepare``) writes the
#: tensors by this rank, highest first, then by name, which keeps every tensor aligned.  Checked against
#: ``save_file`` for every dtype torch stores (tests/checkpoint/test_ckpt_units.py); the F6 pair, which torch
#: lacks, as the enum declares it
LIBRARY_DTYPE_ORDER = (
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
)
_LIBRARY_RANK = {d: i for i, d in enumerate(LIBRARY_DTYPE_ORDER)}


def alignment_order(entries: Iterable[tuple[str, str, Iterable[int]]]) -> list[tuple[str, str, tuple[int, ...]]]:
    """Order as safetensors' serializer does (:data:`LIBRARY_DTYPE_ORDER`, highest first, then by name)."""
    return sorted(((n, d, tuple(s)) for n, d, s in entries), key=lambda e: (-_LIBRARY_RANK[e[1]], e[0]))
