"""Property tests: random mutations of the three formats measure-accept reads (a hidden_state_dump shard, a SpecForge
file, a speculators file) never end in anything but a one-line refusal (an :class:`Eagle3Error`) or states the
draft can run on.  Deterministic (derandomized) and bounded by the number of cases, not by the clock."""

from __future__ import annotations

import io
import os
import pickletools
import re
import struct
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from eagle3_patches.acceptance.measure import read_states
from eagle3_patches.errors import Eagle3Error
from eagle3_patches.instruments.hidden_state_dump import FORMAT

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
from test_training_data import write_specforge, write_speculators  # noqa: E402

CASES = settings(
    max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
W = 6
CONFIG = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}, "target_hidden_size": 2}

dims = st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=0, max_size=3)
dtypes = st.sampled_from([torch.int64, torch.int8, torch.float32, torch.bfloat16, torch.bool, torch.float64])
ints = st.sampled_from([0, 1, 2, 3, -1, 2**31, 2**62, -(2**63)])
tensors = st.one_of(
    st.builds(lambda shape, dt: torch.zeros(shape, dtype=dt), dims, dtypes),
    st.builds(lambda vals: torch.tensor(vals, dtype=torch.int64), st.lists(ints, min_size=1, max_size=6)),
    st.builds(lambda v: torch.full((3, W), v), st.sampled_from([float("nan"), float("inf"), 1e30, 0.0])),
)
objects = st.one_of(
    st.none(), st.integers(-3, 3), st.text(max_size=4), tensors, st.lists(tensors, max_size=3), st.just([])
)
meta_values = st.one_of(
    st.sampled_from(["[1, 2, 3]", "[1.0, 2.0, 3.0]", "[]", "null", "[-1]", "[true]", "{}", "[" * 50, "1,2,3"]),
    st.text(max_size=12),
)


def _consume(data: Path) -> None:
    try:
        for states in read_states(data, CONFIG, max_sequences=4, max_tokens=64):
            assert states.aux.dtype == torch.float32 and states.aux.shape[0] == states.tokens.shape[0]
            assert states.labelled.shape == states.tokens.shape
    except Eagle3Error as exc:
        assert str(exc) and not isinstance(exc, AssertionError)


@CASES
@given(
    key=st.sampled_from(["input_ids", "positions", "seq_ids", "hidden_states", "decoded", None]),
    value=tensors,
    layer_ids=meta_values,
    second=st.booleans(),
)
def test_a_mutated_dump_is_read_or_refused(key, value, layer_ids, second):
    rows = {
        "input_ids": torch.tensor([5, 6, 7, 8]),
        "positions": torch.tensor([0, 1, 2, 3]),
        "seq_ids": torch.tensor([7, 7, 7, 7]),
        "hidden_states": torch.ones(4, W),
        "decoded": torch.tensor([0, 1, 1, 1], dtype=torch.int8),
    }
    if key is not None:
        rows[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        save_file(
            rows, os.path.join(tmp, "shard-1-00000.safetensors"), metadata={"format": FORMAT, "layer_ids": layer_ids}
        )
        if second:  # a second shard of the same sequence, one position on
            more = {k: v[:1].clone() for k, v in rows.items() if v.dim() >= 1 and len(v)} if key is None else {}
            if more:
                more["positions"] = torch.tensor([4])
                save_file(
                    more,
                    os.path.join(tmp, "shard-1-00001.safetensors"),
                    metadata={"format": FORMAT, "layer_ids": "[1, 2, 3]"},
                )
        _consume(Path(tmp))


@CASES
@given(key=st.sampled_from(["input_ids", "loss_mask", "aux_hidden_state", "hidden_state", "extra"]), value=objects)
def test_a_mutated_specforge_file_is_read_or_refused(key, value):
    with tempfile.TemporaryDirectory() as tmp:
        write_specforge(Path(tmp), 0, **{key: value})
        _consume(Path(tmp))


@CASES
@given(key=st.sampled_from(["input_ids", "loss_mask", "hidden_states", "extra"]), value=objects)
def test_a_mutated_speculators_file_is_read_or_refused(key, value):
    with tempfile.TemporaryDirectory() as tmp:
        write_speculators(Path(tmp), 0, **{key: value})
        _consume(Path(tmp))


@CASES
@given(offset=st.integers(0, 4000), data=st.binary(min_size=1, max_size=16))
def test_a_torch_file_with_bytes_overwritten_is_read_or_refused(offset, data):
    with tempfile.TemporaryDirectory() as tmp:
        write_speculators(Path(tmp), 0)
        path = Path(tmp) / "data_0.pt"
        raw = bytearray(path.read_bytes())
        at = offset % len(raw)
        raw[at : at + len(data)] = data
        path.write_bytes(bytes(raw))
        _consume(Path(tmp))


# ---------------------------------------------------------------------- the zip's structure and the pickle's opcodes
def _valid_records() -> list[tuple[str, bytes]]:
    buf = io.BytesIO()
    torch.save(
        {
            "input_ids": torch.arange(5),
            "hidden_states": [torch.ones(5, W // 3)] * 4,
            "loss_mask": torch.ones(5, dtype=torch.long),
        },
        buf,
    )
    with zipfile.ZipFile(buf) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _torch_zip(records: list[tuple[str, bytes]]) -> bytes:
    """``records`` laid out as torch.save lays them out (each record's bytes 64-aligned by a padding extra field,
    stored, no data descriptor here): a mutated pickle reaches the pickle reader, its storages still in place."""
    out, directory = bytearray(), bytearray()
    for name, data in records:
        raw, crc = name.encode(), zlib.crc32(data)
        pad = -(len(out) + 30 + len(raw) + 4) % 64
        extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        directory += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                0,
                0,
                0,
                0,
                0,
                0,
                crc,
                len(data),
                len(data),
                len(raw),
                0,
                0,
                0,
                0,
                0,
                len(out),
            )
            + raw
        )
        out += (
            struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, 0, 0, 0, 0, crc, len(data), len(data), len(raw), len(extra))
            + raw
            + extra
            + data
        )
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(records), len(records), len(directory), len(out), 0)
    return bytes(out + directory + end)


def _write(raw: bytes, tmp: str) -> Path:
    (Path(tmp) / "data_0.pt").write_bytes(raw)
    return Path(tmp)


def test_the_fuzzers_torch_layout_is_read():
    with tempfile.TemporaryDirectory() as tmp:
        (states,) = read_states(_write(_torch_zip(_valid_records()), tmp), CONFIG)
        assert states.aux.shape == (5, W)


#: (structure, its struct format) of each zip header: a field of one of them is overwritten
_HEADERS = {
    b"PK\x03\x04": "<4sHHHHHIIIHH",
    b"PK\x01\x02": "<4sHHHHHHIIIHHHHHII",
    b"PK\x05\x06": "<4sHHHHIIH",
    b"PK\x06\x06": "<4sQHHIIQQQQ",
    b"PK\x06\x07": "<4sIQI",
}


@CASES
@given(
    header=st.integers(0, 31),
    field=st.integers(0, 20),
    value=st.sampled_from([0, 1, 2, 63, 64, 0xFFFF, 0xFFFFFFFF, -1, 1 << 31, 7]),
    fresh=st.booleans(),
)
def test_a_torch_file_with_a_zip_field_changed_is_read_or_refused(header, field, value, fresh):
    """One field of one local header, directory entry or end record (torch.save's own layout, or the fuzzer's)
    set to a boundary value."""
    raw = bytearray(_torch_zip(_valid_records()) if fresh else _saved_good())
    starts = sorted(at for sig in _HEADERS for at in _finds(raw, sig))
    at = starts[header % len(starts)]
    fmt = _HEADERS[bytes(raw[at : at + 4])]
    parts = struct.unpack_from(fmt, raw, at)
    i = 1 + field % (len(parts) - 1)
    size = struct.calcsize("<" + re.findall(r"\d*[a-zA-Z]", fmt[1:])[i])
    parts = (*parts[:i], value % (1 << (8 * size)), *parts[i + 1 :])
    struct.pack_into(fmt, raw, at, *parts)
    with tempfile.TemporaryDirectory() as tmp:
        _consume(_write(bytes(raw), tmp))


def _finds(raw: bytearray, sig: bytes) -> list[int]:
    found, at = [], raw.find(sig)
    while at >= 0:
        found.append(at)
        at = raw.find(sig, at + 1)
    return found


def _saved_good() -> bytes:
    buf = io.BytesIO()
    torch.save(
        {
            "input_ids": torch.arange(5),
            "hidden_states": [torch.ones(5, 2)] * 4,
            "loss_mask": torch.ones(5, dtype=torch.long),
        },
        buf,
    )
    return buf.getvalue()


@CASES
@given(op=st.sampled_from(["drop", "duplicate", "swap", "case", "rename"]), i=st.integers(0, 20), j=st.integers(0, 20))
def test_a_torch_file_with_its_records_dropped_duplicated_reordered_or_renamed_is_read_or_refused(op, i, j):
    records = _valid_records()
    i, j = i % len(records), j % len(records)
    if op == "drop":
        del records[i]
    elif op == "duplicate":
        records.insert(j, records[i])
    elif op == "swap":
        records[i], records[j] = records[j], records[i]
    elif op == "case":
        records.append((records[i][0].upper(), records[j][1]))
    else:
        records[i] = (records[i][0].replace("archive/", "other/", 1), records[i][1])
    with tempfile.TemporaryDirectory() as tmp:
        _consume(_write(_torch_zip(records), tmp))


#: every pickle opcode, with an argument of the size it reads (a 1-byte length for the text ones)
_OPCODES = [
    bytes([op.code.encode("latin-1")[0]]) + b"\x01" * max(0, op.arg.n if op.arg and op.arg.n > 0 else 0)
    for op in pickletools.opcodes
]


@CASES
@given(
    at=st.integers(0, 400),
    op=st.sampled_from(["insert", "delete", "replace"]),
    new=st.sampled_from(_OPCODES),
    n=st.integers(1, 3),
)
def test_a_pickle_with_opcodes_inserted_deleted_or_replaced_is_read_or_refused(at, op, new, n):
    """The pickle of a valid file edited at an opcode boundary: any opcode of any protocol inserted, ``n`` opcodes
    deleted, or one replaced; its storages stay in place."""
    records = _valid_records()
    pkl = records[0][1]
    starts = [pos for _, _, pos in pickletools.genops(pkl)]
    k = at % len(starts)
    ends = [*starts[1:], len(pkl)]
    if op == "insert":
        pkl = pkl[: starts[k]] + new * n + pkl[starts[k] :]
    elif op == "delete":
        pkl = pkl[: starts[k]] + pkl[ends[min(k + n, len(ends)) - 1] :]
    else:
        pkl = pkl[: starts[k]] + new + pkl[ends[k] :]
    records[0] = (records[0][0], pkl)
    with tempfile.TemporaryDirectory() as tmp:
        _consume(_write(_torch_zip(records), tmp))
