# long module: one reader of an untrusted torch file: the archive's and the pickle's bounds checked in one place
"""A stranger's ``torch.save`` file, read by this module alone: one strict reading of the archive, a pickle reader
that knows only the grammar these files have, and the storages mapped, never copied.

``torch.load`` is never called: its zip reader finds records case-insensitively and at the offsets of the last end
record, and its unpickler (even ``weights_only=True``) builds whatever data a pickle describes (a key nested
through the memo, a 2M-deep tuple, 200k keys of one hash).  Here, before anything is built:

* the file (a ``.gz`` inflated in 1 MiB chunks into an unlinked temporary file, never whole in memory) is at most
  :data:`MAX_FILE_BYTES`;
* **the zip is exactly the layout torch.save writes**, read from its end: one end record ending the file (no
  comment), its zip64 record and locator where present, the directory ending where they begin, and the records
  tiling the file from its first byte to the directory: a local header, the record's bytes, and its data
  descriptor where the header's flags announce one.  So bytes before the first record, between records or after
  the directory, a second directory, records that overlap or repeat, and a local header that differs from the
  directory (name, flags, method, sizes, CRC) are refused; so is a record that is compressed or encrypted, a
  CRC that does not match the bytes, and any name but those torch.save writes under one ``<archive>/`` prefix
  (``data.pkl``, ``data/<n>``, ``version``, ``byteorder``, ``.format_version``, ``.storage_alignment``,
  ``.data/version``, ``.data/serialization_id``): names that differ only in case cannot both be there;
* **the pickle** (``<archive>/data.pkl``, at most :data:`MAX_PICKLE_BYTES`) is read by :class:`_Reader`, which
  knows the opcodes ``torch.save`` writes (protocol 2) and the three globals it names for a container of dense
  tensors (``torch._utils._rebuild_tensor_v2``, ``collections.OrderedDict``, ``torch.<dtype>Storage``): any other
  global (a tensor subclass, a nested or sparse tensor, ``bytearray``, any callable) is refused by name, unrun.
  Dict keys are strings (nothing else is ever hashed); a container holds at most :data:`MAX_ITEMS` items, the
  pickle runs at most :data:`MAX_OPCODES` opcodes, and the object built must be what the training formats hold:
  a dict of string keys to tensors, lists (or tuples) of tensors and scalars, and scalars (no deeper nesting);
* **each storage** is its ``<archive>/data/<key>`` record, of exactly the persistent id's element count, mapped
  copy-on-write from the file; each tensor is a view of it that lies inside it and holds no more elements than it
  stores, so what a caller converts is bounded by the file's size (every record is read once, by the CRC check).

Work is linear in the file's size; memory, beyond the mapping, is bounded by the pickle's (at most
:data:`MAX_OPCODES` objects).  Every refusal is one :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import gzip
import mmap
import os
import re
import struct
import sys
import tempfile
import zlib
from typing import Any

from ..checkpoint.safe_io import CheckpointError, checkpoint_error, open_checkpoint_file

#: a file (or a ``.ckpt.gz`` inflated) larger than this is refused before it is loaded: 4 GiB holds 64k positions
#: of a 7168-wide model's three aux layers in bf16 (Kimi-K2.5, DeepSeek-V3), far beyond any training length
MAX_FILE_BYTES = 4 << 30
#: the pickle of one record (a dict of a few tensors is under 1 KB, 256 layers' list about 30 KB)
MAX_PICKLE_BYTES = 1 << 20
#: the zip directory of one file, and its records (a record per tensor storage, plus seven)
MAX_ZIP_DIRECTORY = 16 << 20
MAX_RECORDS = 4096
#: opcodes one pickle may run (about 30 per tensor): the objects it builds, and the memory they take, are fewer
MAX_OPCODES = 1 << 18
#: items of one dict, list or tuple
MAX_ITEMS = 4096
#: dimensions of one tensor (no framework makes more)
MAX_RANK = 64

#: the storage types ``torch.save`` names for the dtypes training data is written in (complex, unsigned wider
#: than a byte and float8 have no use here and lack the CPU kernels the checks run)
_DTYPES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}
_REBUILD = "torch._utils._rebuild_tensor_v2"
#: what torch.save names for a dtype without a storage class (uint16, uint32, uint64, ...)
_REBUILD_V3 = "torch._utils._rebuild_tensor_v3"
_ORDERED_DICT = "collections.OrderedDict"
_CHUNK = 1 << 20
_ZIP_MAGIC = b"PK\x03\x04"
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # signature, version, flags, method, time, date, crc, sizes, name, extra
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # ... comment length, disk, attributes, local header offset
_END = struct.Struct("<4sHHHHIIH")  # signature, disks, records on this disk and in all, size, offset, comment
_END64 = struct.Struct("<4sQHHIIQQQQ")  # signature, record size, versions, disks, records (twice), size, offset
_LOCATOR = struct.Struct("<4sIQI")  # signature, disk, offset of the zip64 end record, disks
#: general-purpose flags torch.save sets: a data descriptor follows the bytes (3), names are UTF-8 (11)
_FLAGS = 0x0008 | 0x0800
_NAMES = re.compile(
    r"([^/\\\x00-\x1f\x7f-\x9f]{1,255})/(data\.pkl|data/[0-9]{1,10}|version|byteorder|\.format_version|"
    r"\.storage_alignment|\.data/version|\.data/serialization_id)"
)


class _Where:
    """The file a message names, its label and fix, and the error code: one refusal builder for every check."""

    def __init__(self, where: str, label: str, fix: str, code: str):
        self.where, self.label, self.fix, self.code = where, label, fix, code

    def error(self, what: str, *, found: str = "", expected: str = "") -> CheckpointError:
        return checkpoint_error(
            self.code, what, where=self.where, found=found[:200], expected=expected[:200], fix=self.fix
        )

    def not_zip(self, found: str) -> CheckpointError:
        return self.error(
            f"{self.label} is not a torch zip file",
            found=found,
            expected="a file written by torch.save (a zip archive of stored records)",
        )

    def layout(self, what: str, found: str, expected: str) -> CheckpointError:
        return self.error(
            f"{self.label}'s zip archive is not laid out as torch.save writes it: {what}",
            found=found,
            expected=expected,
        )

    def unreadable(self, found: str) -> CheckpointError:
        return self.error(
            f"{self.label} is not a readable torch file",
            found=f"its pickle: {found}",
            expected="a file written by torch.save of a dict of tensors",
        )

    def code_like(self, found: str) -> CheckpointError:
        return self.error(
            f"{self.label} holds objects other than tensors and plain containers; refused (loading it could run code)",
            found=found,
            expected="a dict of dense tensors, as torch.save writes it",
        )

    def shape(self, found: str) -> CheckpointError:
        return self.error(
            f"{self.label} holds data of a shape training data never has",
            found=found,
            expected="a dict of string keys to tensors, lists of tensors and scalars",
        )

    def too_large(self, found: str) -> CheckpointError:
        return self.error(
            f"{self.label} is too large to load",
            found=found,
            expected=f"<= {MAX_FILE_BYTES} bytes (MAX_FILE_BYTES)",
        )


def _inflate(fd: int, into, at: _Where) -> None:
    """The gzip stream of ``fd`` inflated into the file ``into``, 1 MiB at a time, at most MAX_FILE_BYTES."""
    written = 0
    try:
        with open(fd, "rb", closefd=False) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            while chunk := gz.read(min(_CHUNK, MAX_FILE_BYTES + 1 - written)):
                if not written and not chunk.startswith(_ZIP_MAGIC[: len(chunk)]):
                    raise at.not_zip("a gzip stream of something else")
                written += len(chunk)
                if written > MAX_FILE_BYTES:
                    raise at.too_large(f"more than {MAX_FILE_BYTES} bytes inflated")
                into.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise at.error(f"{at.label} is not a readable gzip stream", found=str(exc)) from None
    into.flush()


# ------------------------------------------------------------------ the archive
class _Record:
    __slots__ = ("name", "flags", "crc", "size", "header", "data")

    def __init__(self, name: str, flags: int, crc: int, size: int, header: int):
        self.name, self.flags, self.crc, self.size, self.header = name, flags, crc, size, header
        self.data = 0  # where the record's bytes begin, once its local header is read


def _directory(buf: mmap.mmap, size: int, at: _Where) -> tuple[int, int, int]:
    """``(records, directory offset, directory end)`` from the end records, which must end the file."""
    if size < _END.size or buf[:4] != _ZIP_MAGIC:
        raise at.not_zip("no zip archive (an older torch.save format, or another file)")
    end = size - _END.size
    sig, disk, disk_cd, here, records, cd_size, cd_off, comment = _END.unpack_from(buf, end)
    if sig != b"PK\x05\x06" or comment:
        raise at.not_zip("no zip end record in the last 22 bytes (trailing bytes, a comment, or no archive)")
    cd_end = end
    if end >= _LOCATOR.size + _END64.size and buf[end - _LOCATOR.size : end - _LOCATOR.size + 4] == b"PK\x06\x07":
        _, loc_disk, off64, disks = _LOCATOR.unpack_from(buf, end - _LOCATOR.size)
        cd_end = end - _LOCATOR.size - _END64.size
        if off64 != cd_end or loc_disk or disks != 1:
            raise at.layout(
                "a zip64 locator that does not point at the record before it",
                f"offset {off64}, disk {loc_disk} of {disks}",
                f"offset {cd_end}, disk 0 of 1",
            )
        sig64, rec_size, _, _, d64, dcd64, here64, records64, size64, off64 = _END64.unpack_from(buf, cd_end)
        if sig64 != b"PK\x06\x06" or rec_size != _END64.size - 12 or d64 or dcd64 or here64 != records64:
            raise at.layout(
                "a malformed zip64 end record",
                f"{rec_size} bytes, {here64}/{records64} records",
                "a 56-byte zip64 end record of one disk",
            )
        for short, long in ((here, records64), (records, records64), (cd_size, size64), (cd_off, off64)):
            if short not in (long, 0xFFFF, 0xFFFFFFFF):
                raise at.layout("two end records that disagree", f"{short} and {long}", "one directory")
        records, cd_size, cd_off = records64, size64, off64
    elif disk or disk_cd or here != records:
        raise at.layout("a multi-disk archive", f"disk {disk}, {here} of {records} records", "one disk")
    if records > MAX_RECORDS or cd_size > MAX_ZIP_DIRECTORY:
        raise at.error(
            f"{at.label} has an implausibly large zip directory",
            found=f"{records} records, {cd_size} bytes of directory",
            expected=f"<= {MAX_RECORDS} records and {MAX_ZIP_DIRECTORY} bytes",
        )
    if cd_off + cd_size != cd_end:
        raise at.layout(
            "the directory does not end where the end record begins (several directories, or bytes between)",
            f"directory at {cd_off}, {cd_size} bytes; end record at {cd_end}",
            "one directory directly before the end record",
        )
    return records, cd_off, cd_end


def _records(buf: mmap.mmap, size: int, at: _Where) -> dict[str, _Record]:
    """The archive's records by name (without its ``<archive>/`` prefix), after every check of the module
    docstring's second point."""
    count, pos, cd_end = _directory(buf, size, at)
    cd_off = pos
    records: dict[str, _Record] = {}
    folded: dict[bytes, bytes] = {}
    prefix = None
    for _ in range(count):
        if pos + _CENTRAL.size > cd_end:
            raise at.layout("a directory shorter than its end record says", f"{len(records)} records", f"{count}")
        (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, disk, _, _, header) = (
            _CENTRAL.unpack_from(buf, pos)
        )
        raw = bytes(buf[pos + _CENTRAL.size : min(pos + _CENTRAL.size + nlen, cd_end)])
        shown = raw.decode("ascii", "backslashreplace")[:100]
        if sig != b"PK\x01\x02":
            raise at.layout("a directory entry without its signature", f"entry {len(records)}", "PK\\x01\\x02")
        if method or flags & ~_FLAGS or csize != usize:
            raise at.error(
                f"{at.label} holds a compressed or encrypted record (torch.save stores every record as it is)",
                found=f"record {shown!r}, compression {method}, flags {flags}",
                expected="stored records only",
            )
        if elen or clen or disk or header >= cd_off:
            raise at.layout(
                "a directory entry with an extra field, a comment or a foreign offset",
                f"record {shown!r}: extra {elen}, comment {clen}, disk {disk}, offset {header}",
                "none of them, and the record before the directory",
            )
        other = folded.setdefault(raw.lower(), raw)
        if other is not raw:  # before the names are matched: a record torch's case-blind lookup would find
            raise at.layout(
                "two records of one name, or names that differ only in case",
                f"{other.decode('ascii', 'backslashreplace')[:100]!r} and {shown!r}",
                "each record once",
            )
        try:
            m = _NAMES.fullmatch(raw.decode("utf-8"))
        except UnicodeDecodeError:
            m = None
        if m is None or (prefix is not None and m.group(1) != prefix):
            raise at.layout(
                "a record torch.save does not write",
                f"record {shown!r}",
                "<archive>/data.pkl, <archive>/data/<n>, version, byteorder, ... under one prefix",
            )
        prefix, name = m.group(1), m.group(2)
        records[name] = _Record(name, flags, crc, usize, header)
        pos += _CENTRAL.size + nlen
    if pos != cd_end:
        raise at.layout("bytes after the directory's last entry", f"{cd_end - pos} bytes", "none")
    if "data.pkl" not in records:
        raise at.not_zip("no <archive>/data.pkl record")
    _tile(buf, sorted(records.values(), key=lambda r: r.header), cd_off, prefix or "", at)
    return records


def _tile(buf: mmap.mmap, ordered: list[_Record], cd_off: int, prefix: str, at: _Where) -> None:
    """The records, in file order, fill the file from byte 0 to the directory: each local header agrees with its
    directory entry, and its bytes (and data descriptor) end where the next record begins; the CRCs match."""
    pos = 0
    for i, rec in enumerate(ordered):
        shown = f"record {prefix}/{rec.name!r} at {rec.header}"
        if rec.header != pos or pos + _LOCAL.size > cd_off:
            raise at.layout(
                "bytes before, between or shared by records (a record hidden, or one read twice)",
                f"{shown}, expected at {pos}",
                "records side by side from the file's first byte",
            )
        sig, _, flags, method, _, _, crc, csize, usize, nlen, elen = _LOCAL.unpack_from(buf, pos)
        name = bytes(buf[pos + _LOCAL.size : pos + _LOCAL.size + nlen])
        sizes = (crc, csize, usize)
        described = flags & 0x0008
        if (
            sig != _ZIP_MAGIC
            or flags != rec.flags
            or method
            or name != f"{prefix}/{rec.name}".encode()
            or sizes not in ((rec.crc, rec.size, rec.size), *(((0, 0, 0),) if described else ()))
        ):
            raise at.layout(
                "a local header that differs from the directory",
                f"{shown}: name {name[:100]!r}, flags {flags}, method {method}, crc {crc}, size {usize}",
                f"name, flags, crc and size of the directory (crc {rec.crc}, size {rec.size})",
            )
        rec.data = pos + _LOCAL.size + nlen + elen
        pos = rec.data + rec.size
        following = ordered[i + 1].header if i + 1 < len(ordered) else cd_off
        if pos > following:
            raise at.layout("records that overlap", shown, "records side by side")
        if described:
            pos = _descriptor(buf, pos, following, rec, shown, at)
        if pos != following:
            raise at.layout("bytes between records", f"{following - pos} bytes after {shown}", "none")
        if _crc(buf, rec.data, rec.size) != rec.crc:
            raise at.error(
                f"{at.label} is damaged: a record's bytes do not match its CRC",
                found=shown,
                expected=f"CRC {rec.crc:08x}: download or copy the file again",
            )


def _descriptor(buf: mmap.mmap, pos: int, following: int, rec: _Record, shown: str, at: _Where) -> int:
    """The end of the data descriptor at ``pos``: its optional signature, the CRC and both sizes (32- or 64-bit),
    equal to the directory's."""
    ends = []
    for skip in (4, 0):
        if skip and buf[pos : pos + 4] != b"PK\x07\x08":
            continue
        for fmt in ("<III", "<IQQ"):
            end = pos + skip + struct.calcsize(fmt)
            if end <= following and struct.unpack_from(fmt, buf, pos + skip) == (rec.crc, rec.size, rec.size):
                ends.append(end)
    if not ends:
        raise at.layout(
            "a data descriptor that differs from the directory",
            shown,
            f"crc {rec.crc} and size {rec.size} after the record's bytes",
        )
    return following if following in ends else ends[0]


def _crc(buf: mmap.mmap, start: int, size: int) -> int:
    crc = 0
    view = memoryview(buf)
    try:
        for off in range(start, start + size, 64 << 20):
            crc = zlib.crc32(view[off : min(start + size, off + (64 << 20))], crc)
    finally:
        view.release()
    return crc


# ------------------------------------------------------------------ the pickle
class _Global:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Storage:
    __slots__ = ("key", "dtype", "numel", "tensor")

    def __init__(self, key: str, dtype: str, numel: int, tensor: Any):
        self.key, self.dtype, self.numel, self.tensor = key, dtype, numel, tensor


_SCALARS = (str, int, float, bool, type(None))
#: opcodes that build objects by calling or importing (pickle protocols 0-5); torch.save writes none of them
_CODE_OPCODES = {
    b"i": "INST",
    b"o": "OBJ",
    b"\x81": "NEWOBJ",
    b"\x92": "NEWOBJ_EX",
    b"\x93": "STACK_GLOBAL",
    b"b": "BUILD",
    b"\x82": "EXT1",
    b"\x83": "EXT2",
    b"\x84": "EXT4",
}


class _Reader:
    """The protocol-2 pickle of ``torch.save``, read without ``pickle``: every opcode it may run, what each may
    build, and what the result may be.  Each opcode does bounded work: a MARK-ended one pops at most the items
    pushed since its mark, keys are strings (hashed once, cached), and every container is at most MAX_ITEMS."""

    def __init__(self, raw: bytes, buf: mmap.mmap, records: dict[str, _Record], at: _Where):
        self.raw, self.buf, self.records, self.at = raw, buf, records, at
        self.storages: dict[str, _Storage] = {}
        self.depths: dict[int, int] = {}  # id -> nesting depth of each tuple built (tuples live on stack or memo)

    def depth(self, obj: Any) -> int:
        """How deep ``obj`` nests, checked as each container is built, so no structure is deeper (nor a cycle):
        a list holds only leaves (1), a dict's values are leaves, lists or flat tuples (2), a tuple is one more than
        its items (the deepest, a tensor's rebuild arguments with their hooks dict: 3)."""
        kind = type(obj)
        if kind is tuple:
            return self.depths.get(id(obj), 1)
        return 1 if kind is list else 2 if kind is dict else 0

    def make_tuple(self, items: list[Any], pos: int) -> tuple:
        depth = 1 + max(map(self.depth, items), default=0)
        if depth > 3:
            raise self.at.shape(f"tuples nested {depth} deep at byte {pos} (a tensor's arguments nest 3)")
        made = tuple(items)
        self.depths[id(made)] = depth
        return made

    def fail(self, pos: int, what: str) -> CheckpointError:
        return self.at.unreadable(f"{what} at byte {pos}")

    def read(self) -> Any:
        raw, at = self.raw, self.at
        stack: list[Any] = []
        marks: list[int] = []
        memo: dict[int, Any] = {}
        pos, ops, n = 0, 0, len(raw)

        def take(k: int) -> bytes:
            nonlocal pos
            if pos + k > n:
                raise self.fail(pos, "the pickle ends inside an opcode")
            out = raw[pos : pos + k]
            pos += k
            return out

        def pop_mark() -> list[Any]:
            if not marks:
                raise self.fail(pos, "an opcode that needs a MARK without one")
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            if len(items) > 2 * MAX_ITEMS:
                raise at.shape(f"a container of {len(items)} items at byte {pos}; at most {MAX_ITEMS}")
            return items

        def top(k: int = 1) -> list[Any]:
            if len(stack) - (marks[-1] if marks else 0) < k:
                raise self.fail(pos, "an opcode with too few items on the stack")
            return stack[-k:]

        if take(2) != b"\x80\x02":
            raise self.fail(0, "no protocol-2 header (torch.save writes protocol 2)")
        while True:
            ops += 1
            if ops > MAX_OPCODES:
                raise at.shape(f"more than {MAX_OPCODES} pickle opcodes (MAX_OPCODES)")
            start = pos
            op = take(1)
            if op == b".":
                if marks or len(stack) != 1:
                    raise self.fail(start, "STOP with other than one object on the stack")
                if pos != n:
                    raise self.fail(pos, f"{n - pos} bytes after the pickle's STOP")
                return self.result(stack[0])
            if op in (b"q", b"r"):  # BINPUT, LONG_BINPUT
                key = take(1)[0] if op == b"q" else struct.unpack("<I", take(4))[0]
                memo[key] = top()[0]
            elif op in (b"h", b"j"):  # BINGET, LONG_BINGET
                key = take(1)[0] if op == b"h" else struct.unpack("<I", take(4))[0]
                if key not in memo:
                    raise self.fail(start, f"memo entry {key} read before it is written")
                stack.append(memo[key])
            elif op == b"(":
                marks.append(len(stack))
            elif op == b"X":  # BINUNICODE
                (k,) = struct.unpack("<I", take(4))
                try:
                    stack.append(take(k).decode("utf-8"))
                except UnicodeDecodeError:
                    raise self.fail(start, "a string that is not UTF-8") from None
            elif op == b"K":
                stack.append(take(1)[0])
            elif op == b"M":
                stack.append(struct.unpack("<H", take(2))[0])
            elif op == b"J":
                stack.append(struct.unpack("<i", take(4))[0])
            elif op == b"\x8a":  # LONG1: torch.save writes sizes past 2**31 this way
                k = take(1)[0]
                if k > 8:
                    raise self.fail(start, f"an integer of {k} bytes (at most 8)")
                stack.append(int.from_bytes(take(k), "little", signed=True))
            elif op == b"G":
                stack.append(struct.unpack(">d", take(8))[0])
            elif op in (b"\x88", b"\x89", b"N"):
                stack.append({b"\x88": True, b"\x89": False, b"N": None}[op])
            elif op == b"}":
                stack.append({})
            elif op == b"]":
                stack.append([])
            elif op == b")":
                stack.append(())
            elif op == b"t":
                stack.append(self.make_tuple(pop_mark(), start))
            elif op in (b"\x85", b"\x86", b"\x87"):
                k = op[0] - 0x84
                items = top(k)
                del stack[-k:]
                stack.append(self.make_tuple(items, start))
            elif op in (b"a", b"e"):
                items = top(1) if op == b"a" else pop_mark()
                if op == b"a":
                    stack.pop()
                target = top()[0]
                if type(target) is not list or len(target) + len(items) > MAX_ITEMS:
                    raise at.shape(f"APPEND to a {type(target).__name__} at byte {start}, or past {MAX_ITEMS} items")
                if any(self.depth(item) for item in items):
                    raise at.shape(f"a list holding a container at byte {start} (lists hold tensors and scalars)")
                target.extend(items)
            elif op in (b"s", b"u"):
                items = top(2) if op == b"s" else pop_mark()
                if op == b"s":
                    del stack[-2:]
                target = top()[0]
                if type(target) is not dict or len(items) % 2 or len(target) + len(items) // 2 > MAX_ITEMS:
                    raise at.shape(f"SETITEM to a {type(target).__name__} at byte {start}, or past {MAX_ITEMS} keys")
                for k in range(0, len(items), 2):
                    if type(items[k]) is not str:
                        raise at.shape(f"a dict key that is a {type(items[k]).__name__}, not a string")
                    if self.depth(items[k + 1]) > 1:
                        raise at.shape(
                            f"a dict holding a {type(items[k + 1]).__name__} of containers at byte "
                            f"{start} (a dict holds tensors, lists of them and scalars)"
                        )
                    target[items[k]] = items[k + 1]
            elif op == b"c":  # GLOBAL "module\nname\n"
                end1 = raw.find(b"\n", pos, min(n, pos + 4096))
                end2 = raw.find(b"\n", end1 + 1, min(n, end1 + 4097)) if end1 >= 0 else -1
                if end2 < 0:
                    raise self.fail(start, "a GLOBAL without its two lines")
                name = (raw[pos:end1] + b"." + raw[end1 + 1 : end2]).decode("ascii", "backslashreplace")
                pos = end2 + 1
                storage = name[6:] if name.startswith("torch.") else ""
                if name not in (_REBUILD, _ORDERED_DICT) and storage not in _DTYPES:
                    if name == _REBUILD_V3 or storage.endswith("Storage") and "." not in storage:
                        shown = name + (
                            " (a dtype without a storage class: uint16, uint32, ...)" * (name == _REBUILD_V3)
                        )
                        raise at.error(
                            f"{at.label} stores a tensor of a dtype training data is never written in",
                            found=shown,
                            expected=", ".join(f"torch.{s}" for s in _DTYPES),
                        )
                    raise at.code_like(name)
                stack.append(_Global(name))
            elif op == b"Q":  # BINPERSID: a storage
                (pid,) = top()
                stack[-1] = self.storage(pid, start)
            elif op == b"R":  # REDUCE
                func, args = top(2)
                del stack[-2:]
                stack.append(self.call(func, args, start))
            elif op in _CODE_OPCODES:
                raise at.code_like(f"an object built by the {_CODE_OPCODES[op]} opcode (torch.save writes none)")
            else:
                raise self.fail(start, f"opcode {op!r}, which torch.save's pickles never hold")

    def storage(self, pid: Any, pos: int) -> _Storage:
        ok = type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Global)
        if not ok or type(pid[2]) is not str or type(pid[3]) is not str or type(pid[4]) is not int:
            raise self.fail(pos, "a persistent id other than ('storage', type, key, location, count)")
        _, kind, key, location, numel = pid
        dtype = _DTYPES.get(kind.name[6:]) if kind.name.startswith("torch.") else None
        if dtype is None or not re.fullmatch(r"(cpu|cuda|mps|xpu|hpu)(:[0-9]{1,4})?", location) or numel < 0:
            raise self.fail(pos, f"a storage of {kind.name} on {location[:20]!r} with {numel} elements")
        seen = self.storages.get(key)
        if seen is not None:
            if (seen.dtype, seen.numel) != (dtype, numel):
                raise self.fail(pos, f"storage {key[:20]!r} named as two types or sizes")
            return seen
        rec = self.records.get(f"data/{key}")
        import torch

        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        if rec is None or rec.size != numel * itemsize or rec.data % itemsize:
            raise self.fail(
                pos,
                f"storage {key[:20]!r} of {numel} {dtype} elements without a record of {numel * itemsize} bytes"
                f" (found {'none' if rec is None else f'{rec.size} bytes at {rec.data}'})",
            )
        if numel:
            tensor = torch.frombuffer(self.buf, dtype=getattr(torch, dtype), count=numel, offset=rec.data)
        else:
            tensor = torch.empty(0, dtype=getattr(torch, dtype))
        self.storages[key] = _Storage(key, dtype, numel, tensor)
        return self.storages[key]

    def call(self, func: Any, args: Any, pos: int) -> Any:
        if not isinstance(func, _Global) or type(args) is not tuple:
            raise self.at.code_like(f"a call of a {type(func).__name__} (only torch.save's own rebuild functions)")
        if func.name == _ORDERED_DICT:
            if args:
                raise self.fail(pos, "an OrderedDict built from arguments")
            return {}
        if func.name != _REBUILD:
            raise self.fail(pos, f"a call of {func.name}")
        return self.tensor(args, pos)

    def tensor(self, args: tuple, pos: int) -> Any:
        """``_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`` as a view of the mapped
        storage that lies inside it and holds no more elements than it stores."""
        if len(args) != 6 or not isinstance(args[0], _Storage) or type(args[1]) is not int:
            raise self.fail(pos, "a tensor rebuilt from other than (storage, offset, size, stride, grad, hooks)")
        storage, offset, size, stride, grad, hooks = args
        dims = (size, stride)
        if any(
            type(d) is not tuple or len(d) > MAX_RANK or any(type(x) is not int or not 0 <= x < 1 << 40 for x in d)
            for d in dims
        ):  # no dimension of a tensor in a 4 GiB file reaches 2**40; torch's products stay exact
            raise self.fail(pos, f"a tensor's size or stride that is not up to {MAX_RANK} integers in [0, 2**40)")
        if len(size) != len(stride) or type(grad) is not bool or hooks != {} or offset < 0:
            raise self.fail(pos, "a tensor with a size and stride of different ranks, hooks or a negative offset")
        numel = 1
        for d in size:
            numel *= d
        extent = offset + sum((d - 1) * s for d, s in zip(size, stride)) + 1 if numel else offset
        if numel > max(storage.numel, 1) or extent > storage.numel:
            raise self.at.error(
                f"{self.at.label} holds a tensor that repeats stored elements or reaches past them (a view larger "
                "than its data)",
                found=f"shape {list(size)[:8]}, stride {list(stride)[:8]}, offset {offset} over {storage.numel} "
                "stored elements",
                expected="a tensor whose every element is stored once",
            )
        return storage.tensor.as_strided(size, stride, offset)

    def result(self, obj: Any) -> Any:
        """``obj`` if it has the shape training data has (module docstring), each container looked at once."""
        import torch

        def value(v: Any, where: str, inner: bool) -> None:
            if type(v) in _SCALARS or type(v) is torch.Tensor:
                return
            if type(v) in (list, tuple) and not inner:
                if id(v) not in seen:
                    seen.add(id(v))
                    for i, item in enumerate(v):
                        value(item, f"{where}[{i}]", True)
                return
            raise self.at.shape(f"a {type(v).__name__} at {where}")

        seen: set[int] = set()
        if type(obj) is dict:
            for key, v in obj.items():
                value(v, repr(key[:40]), False)
        else:
            value(obj, "the top", False)
        unused = sorted(n for n in self.records if n.startswith("data/") and n[5:] not in self.storages)
        if unused:
            raise self.at.layout("a storage record no tensor uses", f"record {unused[0]!r}", "every record used")
        return obj


# ------------------------------------------------------------------ entry point
def load(root, shown: str, rel: str, *, label: str, fix: str, code: str) -> tuple[Any, int]:
    """The object ``torch.save`` wrote to ``root/rel`` (``shown``: its path for messages), read as the module
    docstring says, and the file's size in bytes (inflated, for a ``.gz`` name: a gzip stream of such a file)."""
    at = _Where(shown, label, fix, code)
    with open_checkpoint_file(root, rel, what=label) as f:
        if f.size > MAX_FILE_BYTES:
            raise at.too_large(f"{f.size} bytes")
        if not rel.endswith(".gz"):
            return _read(f.fd, f.size, at), f.size
        with tempfile.NamedTemporaryFile(prefix=".eagle3-inflated-") as tmp:
            _inflate(f.fd, tmp, at)
            size = os.fstat(tmp.fileno()).st_size
            return _read(tmp.fileno(), size, at), size


def _read(fd: int, size: int, at: _Where) -> Any:
    if size < _END.size:
        raise at.not_zip("no zip archive (an older torch.save format, or another file)")
    if sys.byteorder != "little":
        raise at.error(
            f"{at.label} cannot be read on a big-endian machine",
            found=sys.byteorder,
            expected="little-endian, as torch.save writes on every common machine",
        )
    try:  # copy-on-write: tensors may be written by a caller, the file never
        buf = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        raise at.error(f"{at.label} cannot be mapped", found=f"{type(exc).__name__}: {exc}") from None
    records = _records(buf, size, at)
    order = records.get("byteorder")
    if order is not None and bytes(buf[order.data : order.data + order.size]) != b"little":
        raise at.error(
            f"{at.label} was written on a big-endian machine",
            found=bytes(buf[order.data : order.data + min(order.size, 20)]).decode("ascii", "replace"),
            expected="little",
        )
    pkl = records["data.pkl"]
    if pkl.size > MAX_PICKLE_BYTES:
        raise at.error(
            f"{at.label}'s pickle is implausibly large",
            found=f"{pkl.size} bytes",
            expected=f"<= {MAX_PICKLE_BYTES} bytes (MAX_PICKLE_BYTES): a dict of tensors",
        )
    return _Reader(bytes(buf[pkl.data : pkl.data + pkl.size]), buf, records, at).read()
