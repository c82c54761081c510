"""Read and write safetensors *headers* without touching tensor data.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON + the
data region.  The JSON maps each tensor name to ``{"dtype", "shape",
"data_offsets": [begin, end]}`` (offsets relative to the data region) and may
hold a ``"__metadata__"`` string map.  This module reads exactly ``8 + N``
bytes, validates everything the ``safetensors`` library would refuse (and a
little more), and raises :class:`HeaderError` (what / where / found / expected /
fix) instead of a traceback.  It never imports torch.

Every byte read here is counted (:func:`bytes_read`), so the doctor can say how
much it read.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import Eagle3ConfigError

#: safetensors' own limit on the JSON header (``N``)
MAX_HEADER_BYTES = 100_000_000

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

#: config.json ``torch_dtype`` / ``dtype`` strings -> safetensors dtype names
CONFIG_DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "half": "F16",
    "float32": "F32",
    "float": "F32",
    "float64": "F64",
}


class HeaderError(Eagle3ConfigError):
    """A safetensors file whose header cannot be trusted."""

    code = "safetensors-header"


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
@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # relative to the data region
    end: int
    file: str = ""  # the shard's file name

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class Header:
    path: Path
    header_len: int
    file_size: int
    metadata: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def data_len(self) -> int:
        return self.file_size - self.data_start


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    bits = DTYPE_BITS[dtype] * n
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
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def parse_header_json(raw: bytes, *, where: str, data_len: int | None, file: str = "") -> tuple[dict, dict]:
    """Validate the JSON part of a header; return ``(metadata, tensors)``.

    ``data_len``: the size of the data region when known (the file size minus ``8 + N``);
    then offsets must lie inside it and cover it exactly, as safetensors requires.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _err("safetensors header is not UTF-8", where, found=str(exc)) from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise _err("safetensors header is not valid JSON", where, found=str(exc)[:200]) from None
    if not isinstance(obj, dict):
        raise _err("safetensors header is not a JSON object", where, found=type(obj).__name__)
    metadata: dict[str, str] = {}
    meta = obj.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise _err("safetensors __metadata__ is not a map of strings", where, found=repr(meta)[:200])
        metadata = dict(meta)
    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        if not isinstance(entry, dict):
            raise _err(f"tensor {name!r}: header entry is not an object", where, found=repr(entry)[:200])
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise _err(f"tensor {name!r}: unknown dtype", where, found=repr(dtype)[:80], expected=", ".join(DTYPE_BITS))
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise _err(f"tensor {name!r}: shape is not a list of non-negative integers", where, found=repr(shape)[:200])
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _err(f"tensor {name!r}: data_offsets is not [begin, end] with 0 <= begin <= end", where, found=repr(offsets)[:200])
        n = 1
        for d in shape:
            n *= d
        if (DTYPE_BITS[dtype] * n) % 8:
            raise _err(f"tensor {name!r}: {n} elements of {dtype} do not fill whole bytes", where, found=str(shape))
        want = DTYPE_BITS[dtype] * n // 8
        if offsets[1] - offsets[0] != want:
            raise _err(
                f"tensor {name!r}: data_offsets span does not match dtype and shape",
                where,
                found=f"{offsets[1] - offsets[0]} bytes ({offsets})",
                expected=f"{want} bytes for {dtype} {shape}",
            )
        tensors[name] = TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1], file)
    # safetensors requires the tensors to tile the data region: no gap, no overlap
    pos = 0
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if t.start != pos:
            kind = "overlaps the previous tensor" if t.start < pos else "leaves a gap before it"
            raise _err(f"tensor {t.name!r}: data {kind}", where, found=f"begins at {t.start}", expected=f"begins at {pos}")
        pos = t.end
    if data_len is not None:
        if pos > data_len:
            raise _err(
                "safetensors file is truncated: the header declares more data than the file holds",
                where,
                found=f"{data_len} data bytes",
                expected=f"{pos} data bytes",
            )
        if pos != data_len:
            raise _err(
                "safetensors file has trailing bytes after the last tensor",
                where,
                found=f"{data_len} data bytes",
                expected=f"{pos} data bytes",
            )
    return metadata, tensors


def read_header(path: os.PathLike | str, *, max_header_bytes: int = MAX_HEADER_BYTES) -> Header:
    """Read and validate the header of one safetensors file (reads ``8 + N`` bytes only)."""
    path = Path(path)
    where = str(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            _count(len(head))
            if len(head) < 8:
                raise _err("safetensors file is too short to hold a header", where, found=f"{size} bytes", expected=">= 8 bytes")
            n = int.from_bytes(head, "little")
            if n > max_header_bytes:
                raise _err(
                    "safetensors header length is implausible (corrupted file?)",
                    where,
                    found=f"{n} bytes",
                    expected=f"<= {max_header_bytes} bytes",
                )
            if 8 + n > size:
                raise _err(
                    "safetensors header is truncated",
                    where,
                    found=f"file of {size} bytes",
                    expected=f"at least {8 + n} bytes (header length {n})",
                )
            raw = fh.read(n)
            _count(len(raw))
    except HeaderError:
        raise
    except IsADirectoryError:
        raise _err("expected a safetensors file, found a directory", where, fix="point at the checkpoint directory") from None
    except OSError as exc:
        raise _err("cannot read safetensors file", where, found=f"{type(exc).__name__}: {exc.strerror or exc}", fix="check the path and its permissions") from None
    if len(raw) != n:
        raise _err("safetensors header is truncated", where, found=f"{len(raw)} bytes", expected=f"{n} bytes")
    metadata, tensors = parse_header_json(raw, where=where, data_len=size - 8 - n, file=path.name)
    return Header(path, n, size, metadata, tensors)


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


def alignment_order(entries: Iterable[tuple[str, str, Iterable[int]]]) -> list[tuple[str, str, tuple[int, ...]]]:
    """Order as safetensors' serializer does: widest dtype first, then by name (keeps every tensor aligned)."""
    return sorted(((n, d, tuple(s)) for n, d, s in entries), key=lambda e: (-DTYPE_BITS[e[1]], e[0]))
