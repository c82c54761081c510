"""measure-accept's inputs as hostile as the doctor's (docs/security.md, "measure-accept's inputs"): a dump, SpecForge's
and speculators' training data from a stranger.  Each class of defect: a guard that fires on the hostile input, named
in one message, and stays silent on the good one; no traceback, no NaN, no unbounded allocation."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tracemalloc
import zipfile

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


def test_overlapping_records_are_refused(tmp_path, monkeypatch):
    write_speculators(tmp_path, 0, length=4000)  # the storages, not the zip's own headers, fill the file
    size = (tmp_path / "data_0.pt").stat().st_size
    real = zipfile.ZipFile.infolist
    monkeypatch.setattr(zipfile.ZipFile, "infolist", lambda self: real(self) * 2)  # every record listed twice
    with pytest.raises(CheckpointError, match="records overlap") as info:
        list(td.read_speculators(tmp_path))
    assert info.value.found.endswith(f"in a file of {size}")


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
    assert (torch_file.MAX_FILE_BYTES, torch_file.MAX_PICKLE_BYTES, torch_file.MAX_RECORDS) == (4 << 30, 16 << 20, 4096)


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
