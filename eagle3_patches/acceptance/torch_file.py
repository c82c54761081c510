"""A stranger's ``torch.save`` file, loaded with every allocation bounded before it is made.

``torch.save`` writes a zip archive of stored (uncompressed) records: ``<archive>/data.pkl``, the pickle of the
object, and one ``<archive>/data/<key>`` record per tensor storage.  Before ``torch.load`` sees a byte:

* the file (a ``.gz`` inflated in 1 MiB chunks into an unlinked temporary file, never whole in memory) is at most
  :data:`MAX_FILE_BYTES`;
* its zip directory is read from the end record, at most :data:`MAX_ZIP_DIRECTORY` bytes and
  :data:`MAX_RECORDS` records; every record is stored (a deflated record would be inflated whole by torch), none
  encrypted, and the records together fit in the file (overlapping records, one storage read many times, are
  refused);
* the pickle is at most :data:`MAX_PICKLE_BYTES` and is scanned opcode by opcode (:mod:`pickletools`, nothing
  run): the only globals it may name are the three ``torch.save`` writes for a container of dense tensors
  (``torch._utils._rebuild_tensor_v2``, ``collections.OrderedDict``, ``torch.<dtype>Storage``).  A tensor
  subclass, a nested, sparse or quantized tensor, a ``bytearray`` and any other callable are refused by name.

Then ``torch.load(..., weights_only=True, mmap=True)`` maps the storages instead of reading them: what is
allocated afterwards is what the caller converts, which it bounds itself.
"""

from __future__ import annotations

import gzip
import os
import pickle
import pickletools
import struct
import tempfile
import zipfile
import zlib
from typing import Any

from ..checkpoint.safe_io import CheckpointError, checkpoint_error, open_checkpoint_file

#: a file (or a ``.ckpt.gz`` inflated) larger than this is refused before it is loaded: 4 GiB holds 64k positions
#: of a 7168-wide model's three aux layers in bf16 (Kimi-K2.5, DeepSeek-V3), far beyond any training length
MAX_FILE_BYTES = 4 << 30
#: the pickle of one record (a dict of a few tensors is a few KB)
MAX_PICKLE_BYTES = 16 << 20
#: the zip directory of one file, and its records (a record per tensor storage, plus five)
MAX_ZIP_DIRECTORY = 16 << 20
MAX_RECORDS = 4096
#: the globals ``torch.save`` writes for a container of dense CPU tensors (``module name``)
_GLOBALS = frozenset({"torch._utils _rebuild_tensor_v2", "collections OrderedDict"})
_STORAGES = frozenset(
    f"torch {t}Storage"
    for t in (
        "Float Double Half BFloat16 Long Int Short Char Byte Bool ComplexFloat ComplexDouble "
        "Float8_e4m3fn Float8_e5m2 Float8_e4m3fnuz Float8_e5m2fnuz UInt16 UInt32 UInt64"
    ).split()
)
_CHUNK = 1 << 20
_ZIP_MAGIC = b"PK\x03\x04"


def _error(where: str, what: str, fix: str, *, code: str, found: str = "", expected: str = "") -> CheckpointError:
    return checkpoint_error(code, what, where=where, found=found, expected=expected, fix=fix)


def _too_large(where: str, label: str, found: str, code: str) -> CheckpointError:
    return _error(
        where,
        f"{label} is too large to load",
        "leave this file out, or split the data into shorter sequences",
        code=code,
        found=found,
        expected=f"<= {MAX_FILE_BYTES} bytes (MAX_FILE_BYTES)",
    )


def _inflate(fd: int, into, where: str, label: str, fix: str, code: str) -> None:
    """The gzip stream of ``fd`` inflated into the file ``into``, 1 MiB at a time, at most MAX_FILE_BYTES."""
    written = 0
    try:
        with open(fd, "rb", closefd=False) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            while chunk := gz.read(min(_CHUNK, MAX_FILE_BYTES + 1 - written)):
                if not written and not chunk.startswith(_ZIP_MAGIC[: len(chunk)]):
                    raise _not_zip(where, label, fix, code, "a gzip stream of something else")
                written += len(chunk)
                if written > MAX_FILE_BYTES:
                    raise _too_large(where, label, f"more than {MAX_FILE_BYTES} bytes inflated", code)
                into.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise _error(where, f"{label} is not a readable gzip stream", fix, code=code, found=str(exc)[:200]) from None
    into.flush()


def _not_zip(where: str, label: str, fix: str, code: str, found: str) -> CheckpointError:
    return _error(
        where,
        f"{label} is not a torch zip file",
        fix,
        code=code,
        found=found,
        expected="a file written by torch.save (a zip archive of stored records)",
    )


def _directory_size(fd: int, size: int) -> tuple[int, int] | None:
    """``(records, directory bytes)`` from the zip end record (zip64 too), or None where there is none."""
    tail_len = min(size, 22 + 65535)
    tail = os.pread(fd, tail_len, size - tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    records, directory = struct.unpack("<10xHL6x", tail[at : at + 22])
    if records == 0xFFFF or directory == 0xFFFFFFFF:  # zip64: the locator precedes the end record
        pos = size - tail_len + at - 20
        loc = os.pread(fd, 20, pos) if pos >= 0 else b""
        if len(loc) != 20 or loc[:4] != b"PK\x06\x07":
            return None
        (offset,) = struct.unpack("<8xQ4x", loc)
        rec = os.pread(fd, 56, offset) if offset < size else b""
        if len(rec) != 56 or rec[:4] != b"PK\x06\x06":
            return None
        records, directory = struct.unpack("<32xQQ8x", rec)
    return records, directory


def _check_zip(fd: int, size: int, where: str, label: str, fix: str, code: str) -> bytes:
    """The pickle of the torch zip at ``fd``, read after the bounds of the module docstring."""
    if os.pread(fd, 4, 0) != _ZIP_MAGIC:
        raise _not_zip(where, label, fix, code, "no zip archive (an older torch.save format, or another file)")
    counts = _directory_size(fd, size)
    if counts is None:
        raise _not_zip(where, label, fix, code, "no zip end record")
    records, directory = counts
    if records > MAX_RECORDS or directory > MAX_ZIP_DIRECTORY:
        raise _error(
            where,
            f"{label} has an implausibly large zip directory",
            fix,
            code=code,
            found=f"{records} records, {directory} bytes of directory",
            expected=f"<= {MAX_RECORDS} records and {MAX_ZIP_DIRECTORY} bytes",
        )
    try:
        with open(fd, "rb", closefd=False) as raw, zipfile.ZipFile(raw) as zf:
            infos = zf.infolist()
            _check_records(infos, size, where, label, fix, code)
            return zf.read(_pickle_record(infos, where, label, fix, code))
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile raises many types on a damaged archive
        raise _not_zip(where, label, fix, code, f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _check_records(infos: list[zipfile.ZipInfo], size: int, where: str, label: str, fix: str, code: str) -> None:
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
            raise _error(
                where,
                f"{label} holds a compressed or encrypted record (torch.save stores every record as it is)",
                fix,
                code=code,
                found=f"record {info.filename[:100]!r}, compression {info.compress_type}, flags {info.flag_bits}",
                expected="stored records only",
            )
    total = sum(i.file_size for i in infos)
    if total > size:
        raise _error(
            where,
            f"{label}'s records overlap (one stored span read as many records)",
            fix,
            code=code,
            found=f"{len(infos)} records of {total} bytes in a file of {size}",
            expected="records that fit in the file side by side",
        )


def _pickle_record(infos: list[zipfile.ZipInfo], where: str, label: str, fix: str, code: str) -> zipfile.ZipInfo:
    pickles = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
    if len(pickles) != 1:
        raise _not_zip(where, label, fix, code, f"{len(pickles)} <archive>/data.pkl records")
    if pickles[0].file_size > MAX_PICKLE_BYTES:
        raise _error(
            where,
            f"{label}'s pickle is implausibly large",
            fix,
            code=code,
            found=f"{pickles[0].file_size} bytes",
            expected=f"<= {MAX_PICKLE_BYTES} bytes (MAX_PICKLE_BYTES): a dict of tensors",
        )
    return pickles[0]


def _scan_pickle(raw: bytes, where: str, label: str, fix: str, code: str) -> None:
    """Every global the pickle names is one torch.save writes for dense tensors; nothing is run."""
    try:
        for op, arg, _ in pickletools.genops(raw):
            if op.name in ("GLOBAL", "INST") and str(arg) not in _GLOBALS | _STORAGES:
                name = str(arg).replace(" ", ".")
                break
            if op.name in ("STACK_GLOBAL", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"):
                name = f"an object built by the {op.name} opcode (torch.save writes none)"
                break
        else:
            return
    except (ValueError, pickle.UnpicklingError, struct.error, UnicodeDecodeError, EOFError) as exc:
        raise _error(
            where,
            f"{label} is not a readable torch file",
            fix,
            code=code,
            found=f"its pickle: {type(exc).__name__}: {str(exc)[:160]}",
            expected="a file written by torch.save",
        ) from None
    raise _error(
        where,
        f"{label} holds objects other than tensors and plain containers; refused (loading it could run code)",
        fix,
        code=code,
        found=name[:200],
        expected="a dict of dense tensors, as torch.save writes it",
    )


def load(root, shown: str, rel: str, *, label: str, fix: str, code: str) -> Any:
    """The object ``torch.load`` builds from ``root/rel`` (``shown``: its path for messages), after the checks of
    the module docstring; a ``.gz`` name is a gzip stream of such a file."""
    with open_checkpoint_file(root, rel, what=label) as f:
        if f.size > MAX_FILE_BYTES:
            raise _too_large(shown, label, f"{f.size} bytes", code)
        if not rel.endswith(".gz"):
            return _load_zip(f.fd, f.size, f.library_path, shown, label, fix, code)
        with tempfile.NamedTemporaryFile(prefix=".eagle3-inflated-") as tmp:
            _inflate(f.fd, tmp, shown, label, fix, code)
            return _load_zip(tmp.fileno(), os.fstat(tmp.fileno()).st_size, tmp.name, shown, label, fix, code)


def _load_zip(fd: int, size: int, path: str, where: str, label: str, fix: str, code: str) -> Any:
    import torch

    _scan_pickle(_check_zip(fd, size, where, label, fix, code), where, label, fix, code)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 -- torch's zip reader and unpickler raise many types on a bad file
        raise _unloadable(exc, where, label, fix, code) from None


def _unloadable(exc: Exception, where: str, label: str, fix: str, code: str) -> CheckpointError:
    """What ``torch.load(weights_only=True)`` refused; ``found`` is the line of torch's message that says what."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if isinstance(exc, pickle.UnpicklingError):
        after = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.endswith("WeightsUnpickler error:")]
        lines = after or lines
    return _error(
        where,
        f"{label} is not a readable torch file",
        fix,
        code=code,
        found=f"{type(exc).__name__}: {lines[0][:200] if lines else ''}",
        expected="a file written by torch.save",
    )
