"""measure-accept's inputs as hostile as the doctor's (docs/security.md, "measure-accept's inputs"): a dump, SpecForge's
and speculators' training data from a stranger.  Each class of defect: a guard that fires on the hostile input, named
in one message, and stays silent on the good one; no traceback, no NaN, no unbounded allocation."""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import subprocess
import sys
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_patches.acceptance import torch_file
from eagle3_patches.acceptance import training_data as td
from eagle3_patches.acceptance.measure import Acceptance, MeasureError, read_states
from eagle3_patches.acceptance.target_states import open_dump
from eagle3_patches.checkpoint.safe_io import CheckpointError
from eagle3_patches.cli import main
from eagle3_patches.instruments.hidden_state_dump import FORMAT
from eagle3_patches.testing import tiny_models

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
from test_training_data import write_specforge, write_speculators  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_accept_fuzz import _torch_zip  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    draft = tiny_models.build_trained_eagle3_draft(root / "draft")
    target = tiny_models.build_kimi_k25(root / "target")
    config = json.loads((draft / "config.json").read_text())
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    return draft, target, ids, len(ids) * config["target_hidden_size"]


def _shard(path, rows, width, *, layer_ids, decoded=None):
    ids, pos, seq = zip(*rows)
    n = len(rows)
    tensors = {
        "input_ids": torch.tensor(ids),
        "positions": torch.tensor(pos),
        "seq_ids": torch.tensor(seq),
        "hidden_states": torch.randn(n, width, generator=torch.Generator().manual_seed(n)),
        "decoded": torch.tensor(decoded if decoded is not None else [int(p > 1) for p in pos], dtype=torch.int8),
    }
    save_file(tensors, str(path), metadata={"format": FORMAT, "layer_ids": json.dumps(layer_ids)})


def _seq(sid, length, first=3):
    return [(first + i, i, sid) for i in range(length)]


def _cli(models, data, *extra, capsys):
    draft, target, _, _ = models
    code = main(["measure-accept", "--draft", str(draft), "--target", str(target), "--data", str(data), *extra])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out


# ---------------------------------------------------------------------- tracebacks instead of a message
class Shadow(torch.Tensor):
    """A tensor subclass whose attributes shadow the methods a check calls."""


def test_a_tensor_subclass_whose_attributes_shadow_its_methods_is_refused_unloaded(tmp_path):
    t = torch.ones(5, dtype=torch.long).as_subclass(Shadow)
    t.dim, t.min, t.numel = 5, None, "x"
    write_specforge(tmp_path, 0, input_ids=t)
    with pytest.raises(CheckpointError, match="holds objects other than tensors") as info:
        list(td.read_specforge(tmp_path))
    assert info.value.found == "torch._tensor._rebuild_from_type_v2"


def test_a_nested_tensor_is_refused_unloaded(tmp_path):
    nested = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    write_speculators(tmp_path, 0, hidden_states=[nested, nested])
    with pytest.raises(CheckpointError, match="holds objects other than tensors") as info:
        list(td.read_speculators(tmp_path))
    assert info.value.found == "torch._utils._rebuild_nested_tensor"


def test_a_sequence_whose_width_changes_between_shards_is_refused_naming_both(tmp_path, models):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 3), width, layer_ids=ids)
    _shard(tmp_path / "shard-1-00001.safetensors", [(9, 3, 1)], width + 1, layer_ids=ids)
    with pytest.raises(CheckpointError, match="different widths") as info:
        open_dump(tmp_path)
    assert info.value.found == f"width {width + 1}"
    assert info.value.expected == f"width {width} as shard-1-00000.safetensors"
    _shard(tmp_path / "shard-1-00001.safetensors", [(9, 3, 1)], width, layer_ids=ids)
    assert [s.tokens.tolist() for s in open_dump(tmp_path).sequences()] == [[3, 4, 5, 9]]


def test_a_non_utf8_escape_laden_name_prints_escaped_on_a_strict_utf8_terminal_on_success_and_refusal(tmp_path, models):
    draft, target, ids, width = models
    data = os.path.join(os.fsencode(tmp_path), b"dump\xff\x1b[2J")
    os.mkdir(data)
    shard = os.path.join(data, b"shard-1-00000.safetensors")
    _shard(os.fsdecode(shard), _seq(1, 12) + _seq(2, 2), width, layer_ids=ids)  # sequence 2 skipped, named
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict", LC_ALL="C.UTF-8")
    args = [sys.executable, "-m", "eagle3_patches", "measure-accept", "--draft", str(draft), "--target", str(target)]
    ok = subprocess.run([*args, "--data", os.fsdecode(data)], capture_output=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert b"skipped: dump\\udcff\\x1b[2J: sequence 2" in ok.stdout and b"\x1b" not in ok.stdout
    os.rename(shard, os.path.join(data, b"shard-\xfe.safetensors"))
    with open(os.path.join(data, b"shard-\xfe.safetensors"), "r+b") as f:
        f.truncate(40)
    bad = subprocess.run([*args, "--data", os.fsdecode(data)], capture_output=True, env=env, timeout=300)
    assert bad.returncode == 1 and b"Traceback" not in bad.stderr and b"\x1b" not in bad.stderr
    assert b"shard-\\udcfe.safetensors" in bad.stderr


# ---------------------------------------------------------------------- memory bounded before it is allocated
def test_a_gzip_bomb_is_refused_at_its_first_chunk_with_bounded_memory(tmp_path):
    (tmp_path / "rows_0-2000").mkdir()
    (tmp_path / "rows_0-2000" / "data_0.ckpt.gz").write_bytes(gzip.compress(bytes(256 << 20), compresslevel=9))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="not a torch zip file") as info:
            list(td.read_specforge(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.found == "a gzip stream of something else"
    assert peak < 16 << 20  # one 1 MiB chunk, not the 256 MiB it inflates to


def test_a_gzipped_torch_file_is_inflated_in_chunks_and_read(tmp_path):
    rec = write_specforge(tmp_path, 0, length=300, compress=True)
    tracemalloc.start()
    try:
        (st,) = td.read_specforge(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert st.tokens.tolist() == rec["input_ids"].tolist() and peak < 16 << 20


def test_a_compressed_record_inside_a_torch_zip_is_refused_unloaded(tmp_path, monkeypatch):
    write_speculators(tmp_path / "src", 0)
    with (
        zipfile.ZipFile(tmp_path / "src" / "data_0.pt") as zin,
        zipfile.ZipFile(tmp_path / "data_0.pt", "w", compression=zipfile.ZIP_DEFLATED) as zout,
    ):
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a compressed record reached torch.load"))
    with pytest.raises(CheckpointError, match="holds a compressed or encrypted record") as info:
        list(td.read_speculators(tmp_path / "data_0.pt"))
    assert "compression 8" in info.value.found


def test_one_tensor_listed_many_times_is_bounded_as_what_it_concatenates_to(tmp_path, monkeypatch):
    layer = torch.ones(5, 4, dtype=torch.bfloat16)
    write_speculators(tmp_path, 0, hidden_states=[layer] * 256)  # stored once, listed 256 times
    assert os.path.getsize(tmp_path / "data_0.pt") < 8 << 10
    monkeypatch.setattr(td, "MAX_SEQUENCE_BYTES", 5 * (9 + 4 * 4 * 255) - 1)
    with pytest.raises(CheckpointError, match="the sequence is too large to measure") as info:
        list(td.read_speculators(tmp_path))
    need = 5 * (9 + 4 * 1020)
    assert info.value.found == f"5 positions of 1020 aux values: {need} bytes as int64 ids and float32 states"
    monkeypatch.setattr(td, "MAX_SEQUENCE_BYTES", 5 * (9 + 4 * 4 * 255))
    assert list(td.read_speculators(tmp_path))[0].aux.shape == (5, 1020)


def test_a_pickle_building_a_large_bytearray_is_refused_unrun(tmp_path):
    # bytearray(2**30) through REDUCE: the scan refuses the global before torch.load runs it
    with zipfile.ZipFile(tmp_path / "data_0.pt", "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02c__builtin__\nbytearray\nJ\x00\x00\x00\x40\x85R.")
    with pytest.raises(CheckpointError, match="holds objects other than tensors") as info:
        list(td.read_speculators(tmp_path))
    assert info.value.found == "__builtin__.bytearray"


def test_a_dump_of_a_million_rows_is_indexed_without_a_row_by_row_copy(tmp_path):
    n = 1 << 20
    seq = torch.arange(n) // 4  # 262144 sequences of 4 rows
    tensors = {
        "input_ids": torch.arange(n) % 7,
        "positions": torch.arange(n) % 4,
        "seq_ids": seq,
        "hidden_states": torch.zeros(n, 1, dtype=torch.float16),
        "decoded": torch.ones(n, dtype=torch.int8),
    }
    save_file(tensors, str(tmp_path / "shard-1-00000.safetensors"), metadata={"format": FORMAT})
    dump = open_dump(tmp_path)
    assert len(dump.whole) == n // 4
    (last,) = list(dump.sequences(max_sequences=1))
    assert last.tokens.tolist() == [0, 1, 2, 3] and last.aux.shape == (4, 1)


# ---------------------------------------------------------------------- a figure only from data that gives one
@pytest.mark.parametrize("case", ["no decoded row", "every sequence too short", "loss mask all zero"])
def test_data_that_gives_no_verify_step_is_an_error_not_nan(tmp_path, models, case, capsys):
    _, _, ids, width = models
    if case == "no decoded row":
        _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 12), width, layer_ids=ids, decoded=[0] * 12)
    elif case == "every sequence too short":
        _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 2) + _seq(2, 2), width, layer_ids=ids)
    else:
        aux = torch.zeros(1, 12, width, dtype=torch.bfloat16)
        write_specforge(tmp_path, 0, length=12, loss_mask=torch.zeros(12, dtype=torch.long), aux_hidden_state=aux)
    for extra in ((), ("--json",)):
        code, out = _cli(models, tmp_path, *extra, capsys=capsys)
        assert code == 1 and out.out == "" and "the data gives no verify step to measure" in out.err
    assert "NaN" not in out.err


def test_an_acceptance_of_no_verify_step_gives_no_figure():
    empty = Acceptance(steps=3, histogram=[0, 0, 0, 0], sequences=1)
    for figure in (lambda: empty.accept_length, lambda: empty.per_position, lambda: empty.to_json(4)):
        with pytest.raises(MeasureError, match="no verify step"):
            figure()
    assert json.loads(Acceptance(steps=1, histogram=[1, 1], sequences=1).to_json(2))["accept_length"] == 1.5


def test_the_json_report_is_strict_json(tmp_path, models, capsys):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 12), width, layer_ids=ids)
    code, out = _cli(models, tmp_path, "--json", capsys=capsys)
    assert code == 0
    report = json.loads(out.out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert report["verify_steps"] >= 1


def test_two_shards_holding_one_position_with_different_tokens_are_refused_naming_both(tmp_path, models):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 4), width, layer_ids=ids)
    _shard(tmp_path / "shard-2-00000.safetensors", [(99, 2, 1)], width, layer_ids=ids)
    with pytest.raises(CheckpointError, match="hold different tokens") as info:
        open_dump(tmp_path)
    assert info.value.found == (
        "sequence 1 position 2: token 5 in shard-1-00000.safetensors, 99 in shard-2-00000.safetensors"
    )
    _shard(tmp_path / "shard-2-00000.safetensors", [(5, 2, 1)], width, layer_ids=ids)  # the same token: one row
    assert [s.tokens.tolist() for s in open_dump(tmp_path).sequences()] == [[3, 4, 5, 6]]


def test_two_files_of_one_index_are_refused_naming_both(tmp_path):
    write_specforge(tmp_path, 0)
    write_specforge(tmp_path, 1)
    assert len(list(td.read_specforge(tmp_path))) == 2
    write_specforge(tmp_path, 0, compress=True, input_ids=torch.arange(5) + 7)
    with pytest.raises(CheckpointError, match="two SpecForge hidden-state files of one index") as info:
        td.read_specforge(tmp_path)
    assert info.value.found == "rows_0-2000/data_0.ckpt and rows_0-2000/data_0.ckpt.gz"


def test_a_dump_captured_at_other_layers_as_floats_is_refused(tmp_path, models, capsys):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 12), width, layer_ids=[float(i) for i in ids])
    code, out = _cli(models, tmp_path, capsys=capsys)
    assert code == 1 and "the dump's layer_ids are not a list of layer numbers" in out.err


def test_a_dump_of_another_width_than_the_drafts_layers_give_is_refused(tmp_path, models):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 12), width - 1, layer_ids=ids)
    config = json.loads((models[0] / "config.json").read_text())
    with pytest.raises(MeasureError, match="not the width the draft's layers give") as info:
        read_states(tmp_path, config)
    assert info.value.diagnostic.found == f"width {width - 1}"


# ---------------------------------------------------------------------- output
def test_a_long_layer_ids_list_is_cut_in_the_message(tmp_path, models):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 12), width, layer_ids=list(range(1000)))
    config = json.loads((models[0] / "config.json").read_text())
    with pytest.raises(MeasureError, match="captured other layers") as info:
        read_states(tmp_path, config)
    assert info.value.diagnostic.found == "layer_ids [0, 1, 2, 3, 4, 5, 6, 7 ...] (1000 ids)"


def test_many_skipped_sequences_are_counted_past_twenty_in_the_report():
    r = Acceptance(steps=1, histogram=[1, 1], sequences=1, skipped=[f"s{i}\x1b" for i in range(25)])
    text = r.format(2)
    assert text.count("skipped: s") == 20 and "skipped: 5 more (--json lists them all)" in text
    assert "\x1b" not in text and "s0\\x1b" in text


# ---------------------------------------------------------------------- streaming and --max-tokens
def test_max_tokens_stops_before_the_next_file_is_loaded(tmp_path):
    for i in range(3):
        write_speculators(tmp_path, i, length=6)
    (tmp_path / "data_3.pt").write_bytes(b"not read")
    got = list(read_states(tmp_path, {}, max_tokens=12))
    assert [s.source for s in got] == ["data_0.pt", "data_1.pt"]
    assert [s.source for s in read_states(tmp_path, {}, max_tokens=7)] == ["data_0.pt", "data_1.pt"]
    with pytest.raises(CheckpointError, match="not a torch zip file"):
        list(read_states(tmp_path, {}))


def test_max_tokens_and_max_sequences_bound_a_dump(tmp_path, models):
    _, _, ids, width = models
    _shard(tmp_path / "shard-1-00000.safetensors", _seq(1, 5) + _seq(2, 5) + _seq(3, 5), width, layer_ids=ids)
    sources = [s.source.rsplit(" ", 1)[-1] for s in read_states(tmp_path, {}, max_tokens=6)]
    assert sources == ["1", "2"]
    assert len(list(read_states(tmp_path, {}, max_sequences=1))) == 1
    assert len(list(read_states(tmp_path, {}))) == 3
    with pytest.raises(MeasureError, match="--max-tokens must be a positive integer"):
        read_states(tmp_path, {}, max_tokens=0)


def test_max_tokens_is_a_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["measure-accept", "--draft", "d", "--data", "x", "--max-tokens", "0"])
    assert info.value.code == 2 and "--max-tokens 0: expected at least 1" in capsys.readouterr().err


def test_the_torch_file_bounds_are_the_documented_ones():
    bounds = (torch_file.MAX_FILE_BYTES, torch_file.MAX_PICKLE_BYTES, torch_file.MAX_RECORDS, torch_file.MAX_ITEMS)
    assert bounds == (4 << 30, 1 << 20, 4096, 4096)
    assert (torch_file.MAX_OPCODES, td.AMPLIFICATION, td.AMPLIFICATION_SLACK) == (1 << 18, 4, 1 << 20)


def _directory(path) -> tuple[int, int]:
    """(records, directory bytes) as the file's zip end record states them."""
    import struct

    data = path.read_bytes()
    at = data.rfind(b"PK\x05\x06")
    _, _, _, _, records, directory, _, _ = struct.unpack("<4s4H2LH", data[at : at + 22])
    return records, directory


@pytest.mark.parametrize("bound", ["MAX_ZIP_DIRECTORY", "MAX_RECORDS"])
def test_a_zip_directory_past_either_bound_is_refused_naming_its_size_and_one_at_the_bound_is_read(
    tmp_path, monkeypatch, bound
):
    """The directory's bytes and its record count are each a bound of their own: a file at the bound is read, one a
    byte (a record) over it is refused before its directory is read."""
    write_speculators(tmp_path, 0)
    path = tmp_path / "data_0.pt"
    records, directory = _directory(path)
    at_bound = directory if bound == "MAX_ZIP_DIRECTORY" else records
    monkeypatch.setattr(torch_file, bound, at_bound)
    assert list(td.read_speculators(path))  # at the bound: read
    monkeypatch.setattr(torch_file, bound, at_bound - 1)
    with pytest.raises(CheckpointError, match="implausibly large zip directory") as info:
        list(td.read_speculators(path))
    assert info.value.found == f"{records} records, {directory} bytes of directory"
    assert f"{at_bound - 1} " in info.value.expected


# ---------------------------------------------------------------------- crafted torch files (issue: one reading)
# Each is what an attacker publishes as data_0.pt: a zip torch's own reader and Python's zipfile read differently,
# or a pickle of data alone (no global: nothing an allow-list or weights_only stops) that hangs, crashes or
# balloons a plain unpickler.  Each must be one message naming the file, exit 1, no traceback, no signal, and
# memory bounded (the child below runs them all under an address-space limit).
def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _good(length: int = 5) -> dict:
    ids = torch.arange(length)
    return {"input_ids": ids, "hidden_states": [torch.ones(length, 4)] * 2, "loss_mask": torch.ones_like(ids)}


def _zip(records, prefix: bytes = b"") -> bytes:
    """``records`` (name, bytes) stored by Python's zipfile after ``prefix`` (its offsets count the prefix)."""
    buf = io.BytesIO()
    buf.write(prefix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name: one case is exactly that
        with zipfile.ZipFile(buf, "a", compression=zipfile.ZIP_STORED) as zf:
            for name, data in records:
                zf.writestr(name, data)
    return buf.getvalue()


def _records(raw: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _pkl(ops: bytes) -> bytes:
    return _zip([("archive/data.pkl", b"\x80\x02" + ops + b"."), ("archive/version", b"3\n")])


def _u(text: str) -> bytes:  # BINUNICODE
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


_BYTEARRAY = b"\x80\x02c__builtin__\nbytearray\nJ\x00\x00\x00\x40\x85R."  # 1 GiB of zeros under a plain load


def _two_directories() -> bytes:
    """A second directory and end record after the first: torch reads the end record's absolute offset, zipfile
    the shifted one."""
    raw = _saved(_good())
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        start = zf.start_dir
    end = raw.rfind(b"PK\x06\x06")
    directory = raw[start:end]
    count = raw.count(b"PK\x01\x02", start, end)
    return raw + directory + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(directory), len(raw), 0)


def _local_header_renamed() -> bytes:
    raw = bytearray(_saved(_good()))
    at = raw.index(b"archive/data.pkl")  # the first record's local header name, not the directory's
    raw[at : at + 16] = b"archive/data.pkx"
    return bytes(raw)


def _memo_nest(levels: int) -> bytes:
    """t_i = (t_{i-1}, t_{i-1}) through the memo: 2**levels leaves in a few bytes a level."""
    ops = b")q\x00"
    for i in range(1, levels):
        ops += b"h" + bytes([i - 1]) + b"\x86q" + bytes([i])
    return ops


def _specforge_uint16_ids(tmp: Path) -> Path:
    write_specforge(tmp, 0, input_ids=torch.arange(5).to(torch.uint16))
    return tmp / "rows_0-2000" / "data_0.ckpt"


class _Shadowed(torch.Tensor):
    pass


def _subclass() -> bytes:
    t = torch.ones(5, dtype=torch.long).as_subclass(_Shadowed)
    t.dim, t.min, t.numel = 5, None, "x"
    return _saved({**_good(), "input_ids": t})


# name -> bytes of data_0.pt (speculators), and the words the message must hold
CRAFTED = {
    "case-colliding names": (
        lambda: _zip([*_records(_saved(_good())), ("archive/DATA.PKL", _BYTEARRAY)]),
        "names that differ only in case",
    ),
    "two central directories": (_two_directories, "bytes between records"),
    "bytes before the first local header": (
        lambda: _zip(_records(_saved(_good())), prefix=_zip([("archive/data.pkl", _BYTEARRAY)])[:-22]),
        "bytes before, between or shared by records",
    ),
    "a local header that disagrees with the directory": (_local_header_renamed, "local header that differs"),
    "a duplicate record": (
        lambda: _zip([*_records(_saved(_good())), ("archive/data.pkl", _BYTEARRAY)]),
        "two records of one name, or names that differ only in case",
    ),
    "memo-nested hash bomb key": (lambda: _pkl(b"}" + _memo_nest(64) + b"K\x00s"), "tuples nested 4 deep"),
    "50k keys colliding in hash": (  # hash(-1) == hash(-2): quadratic insertion in a plain unpickler
        lambda: _pkl(
            b"}(" + b"".join(b"\x8a\x08" + struct.pack("<q", -1 - i) + b"K\x00" for i in range(50_000)) + b"u"
        ),
        "a container of 100000 items",
    ),
    "20k string keys": (
        lambda: _pkl(b"}(" + b"".join(_u(f"k{i}") + b"N" for i in range(20_000)) + b"u"),
        "a container of 40000 items",
    ),
    "a 2M-deep tuple": (lambda: _pkl(b"(" * 2_000_000 + b"t" * 2_000_000), "pickle is implausibly large"),
    "a pickle of 300k opcodes": (lambda: _pkl(b"N" * 300_000), "MAX_OPCODES"),
    "a 200k-deep tuple": (
        lambda: _pkl(b"}" + _u("input_ids") + b")" + b"\x85" * 200_000 + b"s"),
        "tuples nested 4 deep",
    ),
    "repr amplification": (  # a key of 4000 references to one 256 KiB string: 1 GB to repr
        lambda: _pkl(b"}(" + _u("x" * (256 << 10)) + b"q\x00" + b"h\x00" * 3999 + b"t" + b"K\x00s"),
        "a dict key that is a tuple, not a string",
    ),
    "100k references to one 512 KiB string": (
        lambda: _pkl(b"}(" + _u("x" * (512 << 10)) + b"q\x00" + b"h\x00" * 99_999 + b"t" + b"K\x00s"),
        "a container of 100000 items",
    ),
    "a key 5000 deep": (lambda: _pkl(b"}" + b"(" * 5000 + b"K\x00" + b"t" * 5000 + b"K\x00s"), "tuples nested 4 deep"),
    "a tensor subclass with numel shadowed": (_subclass, "torch._tensor._rebuild_from_type_v2"),
    "one layer listed 256 times": (
        lambda: _saved({**_good(1024), "hidden_states": [torch.ones(1024, 2048, dtype=torch.bfloat16)] * 256}),
        "one stored tensor listed many times",
    ),
    "one tensor referenced 256 times": (
        lambda: _saved(
            {
                **_good(1024),
                "hidden_states": [t.view(1024, 2048) for t in [torch.ones(1024 * 2048, dtype=torch.bfloat16)] * 256],
            }
        ),
        "one stored tensor listed many times",
    ),
}


def _crafted(root: Path) -> dict[str, tuple[Path, str]]:
    cases = {}
    for i, (name, (build, words)) in enumerate(CRAFTED.items()):
        (root / str(i)).mkdir()
        (root / str(i) / "data_0.pt").write_bytes(build())
        cases[name] = (root / str(i) / "data_0.pt", words)
    cases["uint16 input_ids"] = (_specforge_uint16_ids(root / "u16"), "_rebuild_tensor_v3")
    return cases


_CHILD = r"""
import contextlib, io, json, resource, sys
from eagle3_patches.cli import main
import eagle3_patches.acceptance.measure, torch
torch.set_num_threads(1)
draft, target, cases = json.loads(sys.argv[1])
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmData:")) << 10
resource.setrlimit(resource.RLIMIT_DATA, (vm + (512 << 20), vm + (512 << 20)))  # 512 MiB past the imports
for name, data in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["measure-accept", "--draft", draft, "--target", target, "--data", data])
    print(json.dumps([name, code, err.getvalue()]), flush=True)
"""


def test_crafted_torch_files_are_one_message_each_with_bounded_memory(tmp_path, models):
    """Every crafted file, through the command, in one child whose data segment is capped at 512 MiB past its
    imports: the one-layer-listed-256-times file asked 2 GiB, the hash bomb never ended, the 2M-deep tuple was a
    SIGSEGV; here each is exit 1 and one message naming the file (the command's own output, not pytest's)."""
    draft, target, _, _ = models
    cases = _crafted(tmp_path)
    arg = json.dumps(
        [
            str(draft),
            str(target),
            [[n, str(p.parent if n != "uint16 input_ids" else tmp_path / "u16")] for n, (p, _) in cases.items()],
        ]
    )
    child = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = {}
    for line in child.stdout.splitlines():
        name, code, err = json.loads(line)
        seen[name] = (code, err)
    assert set(seen) == set(cases)
    for name, (path, words) in cases.items():
        code, err = seen[name]
        assert code == 1, (name, err)
        assert err.startswith("eagle3-patches: ") and "Traceback" not in err and len(err) < 2000, (name, err)
        assert str(path) in err and words in err, (name, err)


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_each_crafted_torch_file_is_refused_naming_it(tmp_path, name, monkeypatch):
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load read a stranger's file"))
    build, words = CRAFTED[name]
    (tmp_path / "data_0.pt").write_bytes(build())
    with pytest.raises(CheckpointError) as info:
        list(td.read_speculators(tmp_path))
    assert info.value.where == str(tmp_path / "data_0.pt") and words in str(info.value)


def test_uint16_input_ids_are_refused_by_dtype(tmp_path):
    path = _specforge_uint16_ids(tmp_path)
    with pytest.raises(CheckpointError, match="a dtype training data is never written in") as info:
        list(td.read_specforge(tmp_path))
    assert info.value.where == str(path)
    assert info.value.found == "torch._utils._rebuild_tensor_v3 (a dtype without a storage class: uint16, uint32, ...)"


def _refusal_of(tmp_path: Path, raw: bytes) -> CheckpointError:
    (tmp_path / "data_0.pt").write_bytes(raw)
    with pytest.raises(CheckpointError) as info:
        list(td.read_speculators(tmp_path))
    assert info.value.where == str(tmp_path / "data_0.pt")
    return info.value


def test_a_torch_file_is_read_as_torch_load_reads_it(tmp_path):
    """torch.save's own layout (zip64 end records, data descriptors, 64-byte aligned storages, the file's stem as
    the archive's name), views at an offset and with strides included: the same tensors torch.load gives."""
    base = torch.arange(40, dtype=torch.float32).view(10, 4)
    record = {
        "input_ids": torch.arange(12)[2:7],
        "hidden_states": [base[:5], base[5:], base[::2]],  # three views of one storage, the last strided
        "loss_mask": torch.tensor([0, 1, 1, 1, 1], dtype=torch.bool),
    }
    torch.save(record, tmp_path / "data_0.pt")
    (st,) = td.read_speculators(tmp_path)
    want = torch.load(tmp_path / "data_0.pt", weights_only=True)
    assert st.tokens.tolist() == want["input_ids"].tolist() == [2, 3, 4, 5, 6]
    assert torch.equal(st.aux, torch.cat(want["hidden_states"][:-1], -1))
    assert st.labelled.tolist() == [False, True, True, True, True]


@pytest.mark.parametrize(
    "case, words",
    [
        ("a byte of a storage changed", "a record's bytes do not match its CRC"),
        ("bytes after the end record", "no zip end record in the last 22 bytes"),
        ("an end record that disagrees with the zip64 one", "two end records that disagree"),
        ("a storage record of another size", "without a record of"),
        ("a storage record no tensor uses", "a storage record no tensor uses"),
        ("a view past its storage", "repeats stored elements or reaches past them"),
        ("a dimension of 2**62 beside one of 0", "integers in [0, 2**40)"),
        ("a directory size both end records misstate", "the directory does not end where the end record begins"),
        ("an end record announcing a comment", "no zip end record in the last 22 bytes"),
        ("a local header's CRC that is not the directory's", "a local header that differs from the directory"),
    ],
)
def test_each_structural_defect_is_refused_by_name(tmp_path, case, words):
    raw = bytearray(_saved({**_good(), "hidden_states": [torch.ones(5, 4), torch.zeros(5, 4)]}))
    if case == "a byte of a storage changed":
        raw[raw.index(struct.pack("<f", 1.0) * 4) + 2] ^= 1
    elif case == "bytes after the end record":
        raw += b"\0"
    elif case == "an end record that disagrees with the zip64 one":
        raw[-12:-8] = struct.pack("<I", 7)  # the directory's size
    elif case == "an end record announcing a comment":
        raw[-2:] = struct.pack("<H", 5)
    elif case == "a directory size both end records misstate":
        end64 = raw.rindex(b"PK\x06\x06")
        size = struct.unpack_from("<Q", raw, end64 + 40)[0] - 46 - len("archive/.data/serialization_id")
        struct.pack_into("<Q", raw, end64 + 40, size)  # the last entry left out of both
        struct.pack_into("<I", raw, len(raw) - 10, size)
    elif case == "a local header's CRC that is not the directory's":
        struct.pack_into("<I", raw, 14, 12345)  # data.pkl's local header: torch.save writes 0 (a descriptor follows)
    else:
        records = _records(bytes(raw))
        pkl = records[0][1]
        if case == "a storage record of another size":
            records = [(n, d + b"\0" * 4 if n == "archive/data/1" else d) for n, d in records]
        elif case == "a storage record no tensor uses":
            records.insert(5, ("archive/data/9", b"\0" * 8))
        elif case == "a dimension of 2**62 beside one of 0":  # input_ids' size (5,) made (0, 2**62): no element
            at = pkl.index(b"K\x05\x85")
            big = b"K\x00\x8a\x08" + struct.pack("<q", 2**62) + b"\x86"
            records[0] = (records[0][0], pkl[:at] + big + pkl[at + 3 :])
        else:  # hidden_states[1]'s size (5, 4) made (6, 4): one row past its 20 elements
            at = pkl.index(b"K\x05K\x04\x86", pkl.index(b"hidden_states"))
            at = pkl.index(b"K\x05K\x04\x86", at + 1)
            records[0] = (records[0][0], pkl[:at] + b"K\x06" + pkl[at + 2 :])
        raw = bytearray(_torch_zip(records))  # storages 64-aligned, as torch.save writes them
    err = _refusal_of(tmp_path, bytes(raw))
    assert words in str(err), str(err)


def test_the_file_size_bound_is_silent_on_the_smallest_dtypes_a_valid_file_has(tmp_path, monkeypatch):
    """int8 ids, a bool mask and float16 states of width 1: a sequence of 13 bytes a position from a file of 4 bytes
    a position (3.25 times), read; at a factor of 3 the same file is refused, naming the bound."""
    n = 1 << 21
    write_specforge(
        tmp_path,
        0,
        input_ids=torch.zeros(n, dtype=torch.int8),
        loss_mask=torch.ones(n, dtype=torch.bool),
        aux_hidden_state=torch.zeros(1, n, 1, dtype=torch.float16),
        hidden_state=None,
    )
    (st,) = td.read_specforge(tmp_path)
    assert st.aux.shape == (n, 1)
    monkeypatch.setattr(td, "AMPLIFICATION", 3)
    with pytest.raises(CheckpointError, match="one stored tensor listed many times") as info:
        list(td.read_specforge(tmp_path))
    assert info.value.found == f"{n} positions of 1 aux values: {13 * n} bytes as int64 ids and float32 states"
