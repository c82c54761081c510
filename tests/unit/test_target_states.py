"""The reader of this library's ``hidden_state_dump`` shards (what ``eagle3-patches measure-accept`` measures a draft
on).  A dump directory may come from a stranger: every refusal names the file, what was found, what was expected
and the fix, and no shard, however malformed, ends in a traceback.  The happy path and the layer check against the
draft: tests/unit/test_measure_accept.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from eagle3_patches.acceptance.target_states import dump_shards, read_dump
from eagle3_patches.checkpoint.safe_io import CheckpointError
from eagle3_patches.instruments.hidden_state_dump import FORMAT

W = 6  # aux width
NEED = "['hidden_states', 'input_ids', 'positions', 'seq_ids']"
SHARD = "shard-1-00000.safetensors"


def _tensors(rows):
    """The instrument's tensors for ``rows`` of (token id, position, sequence id, decoded)."""
    ids, pos, seq, dec = zip(*rows)
    return {
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "positions": torch.tensor(pos, dtype=torch.int64),
        "seq_ids": torch.tensor(seq, dtype=torch.int64),
        "hidden_states": torch.arange(len(rows) * W, dtype=torch.float32).view(len(rows), W),
        "decoded": torch.tensor(dec, dtype=torch.int8),
    }


def _write(path, tensors, *, layer_ids="[1, 2, 3]", fmt=FORMAT):
    meta = {} if layer_ids is None else {"layer_ids": layer_ids}
    if fmt is not None:
        meta["format"] = fmt
    save_file(tensors, str(path), metadata=meta)


def _shard(path, rows, **kw):
    _write(path, _tensors(rows), **kw)


def _refusal(root) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        read_dump(root)
    return info.value


SEQ_7 = [(5, 0, 7, 0), (6, 1, 7, 1), (7, 2, 7, 1)]


# ---------------------------------------------------------------------- which files
def test_only_shard_files_are_the_dump_other_files_beside_them_are_left_alone(tmp_path):
    _shard(tmp_path / SHARD, SEQ_7)
    (tmp_path / "shard-notes.txt").write_text("not safetensors")
    _write(tmp_path / "model.safetensors", {"w": torch.zeros(2)}, fmt="something")
    assert dump_shards(tmp_path) == [SHARD]
    (st,), _ = read_dump(tmp_path)
    assert st.tokens.tolist() == [5, 6, 7]


# ---------------------------------------------------------------------- a file that is not a dump shard
@pytest.mark.parametrize(
    ("fmt", "drop", "found"),
    [
        # an older or other format (sorting before the instrument's name, and after it)
        (
            "eagle3-patches/hidden-state-dump/0",
            None,
            "format 'eagle3-patches/hidden-state-dump/0', tensors "
            "['decoded', 'hidden_states', 'input_ids', 'positions', 'seq_ids']",
        ),
        (
            "zz-other/1",
            None,
            "format 'zz-other/1', tensors ['decoded', 'hidden_states', 'input_ids', 'positions', 'seq_ids']",
        ),
        (None, None, "format 'None', tensors ['decoded', 'hidden_states', 'input_ids', 'positions', 'seq_ids']"),
        # the instrument's format but a tensor missing
        (FORMAT, "input_ids", f"format '{FORMAT}', tensors ['decoded', 'hidden_states', 'positions', 'seq_ids']"),
        (FORMAT, "positions", f"format '{FORMAT}', tensors ['decoded', 'hidden_states', 'input_ids', 'seq_ids']"),
        (FORMAT, "seq_ids", f"format '{FORMAT}', tensors ['decoded', 'hidden_states', 'input_ids', 'positions']"),
        (FORMAT, "hidden_states", f"format '{FORMAT}', tensors ['decoded', 'input_ids', 'positions', 'seq_ids']"),
    ],
)
def test_a_shard_that_is_not_the_instruments_is_refused_saying_what_it_holds(tmp_path, fmt, drop, found):
    tensors = _tensors(SEQ_7)
    tensors.pop(drop, None)
    _write(tmp_path / SHARD, tensors, fmt=fmt)
    err = _refusal(tmp_path)
    assert err.what == "a dump shard cannot be read"
    assert err.where == str(tmp_path / SHARD)
    assert err.found == f"ValueError: {found}: not a hidden_state_dump shard ({FORMAT}, tensors {NEED})"
    assert err.expected == "a shard written by the hidden_state_dump instrument"
    assert err.fix == "dump again, or leave the file out of the directory"


def test_a_hostile_format_name_is_cut_to_80_characters_in_the_message(tmp_path):
    _write(tmp_path / SHARD, _tensors(SEQ_7), fmt="x" * 200)
    assert f"format '{'x' * 80}', tensors [" in _refusal(tmp_path).found


def test_a_file_of_many_tensors_lists_its_first_8_names(tmp_path):
    _write(tmp_path / SHARD, {f"t{i}": torch.zeros(1) for i in range(12)}, fmt="other")
    names = str([f"t{i}" for i in sorted(range(12), key=str)][:8])  # t0 t1 t10 t11 t2 ... t5
    assert f"format 'other', tensors {names}: not a hidden_state_dump shard" in _refusal(tmp_path).found


def test_the_refusal_of_a_shard_of_long_tensor_names_is_cut_to_300_characters(tmp_path):
    _write(tmp_path / SHARD, {f"{'n' * 100}{i}": torch.zeros(1) for i in range(8)}, fmt="other")
    found = _refusal(tmp_path).found
    assert len(found) == 300 and found.startswith("ValueError: format 'other', tensors ['nnnn")


def test_a_file_that_is_not_safetensors_is_refused_naming_it(tmp_path):
    (tmp_path / SHARD).write_bytes(b"\xff" * 64)
    err = _refusal(tmp_path)
    assert err.what == "a dump shard cannot be read" and err.where == str(tmp_path / SHARD)
    assert err.found == "safetensors header length is implausible (corrupted file?): 18446744073709551615 bytes"


# ---------------------------------------------------------------------- tensors of the wrong shape or dtype
def _row_shapes(ids="int64 [3]", pos="int64 [3]", seq="int64 [3]", hid=f"float32 [3, {W}]", dec="int8 [3]"):
    found = f"input_ids {ids}, positions {pos}, seq_ids {seq}, hidden_states {hid}"
    return found + (f", decoded {dec}" if dec else "")


@pytest.mark.parametrize(
    ("name", "value", "found"),
    [
        ("positions", torch.tensor([0, 1]), _row_shapes(pos="int64 [2]")),
        ("positions", torch.tensor([0, 1, 2, 3]), _row_shapes(pos="int64 [4]")),
        ("seq_ids", torch.tensor([7, 7]), _row_shapes(seq="int64 [2]")),
        ("seq_ids", torch.tensor([7, 7, 7, 7]), _row_shapes(seq="int64 [4]")),
        ("hidden_states", torch.zeros(2, W), _row_shapes(hid=f"float32 [2, {W}]")),
        ("hidden_states", torch.zeros(3), _row_shapes(hid="float32 [3]")),  # no width
        ("hidden_states", torch.zeros(3, 2, W), _row_shapes(hid=f"float32 [3, 2, {W}]")),
        ("decoded", torch.tensor([0, 1], dtype=torch.int8), _row_shapes(dec="int8 [2]")),
        ("decoded", torch.tensor([0, 1, 1, 1], dtype=torch.int8), _row_shapes(dec="int8 [4]")),
        # one row of several values per token (read as numbers, they would be a traceback)
        ("input_ids", torch.zeros(3, 2, dtype=torch.int64), _row_shapes(ids="int64 [3, 2]")),
        ("positions", torch.tensor([[0, 0], [1, 1], [2, 2]]), _row_shapes(pos="int64 [3, 2]")),
        ("seq_ids", torch.full((3, 2), 7), _row_shapes(seq="int64 [3, 2]")),
        ("decoded", torch.ones(3, 2, dtype=torch.int8), _row_shapes(dec="int8 [3, 2]")),
        ("input_ids", torch.tensor(5), _row_shapes(ids="int64 []")),
        ("decoded", torch.tensor(1, dtype=torch.int8), _row_shapes(dec="int8 []")),
        # numbers that are no token id, position or sequence (NaN cannot be an int), states that are no states
        ("positions", torch.tensor([0.0, float("nan"), 2.0]), _row_shapes(pos="float32 [3]")),
        ("input_ids", torch.tensor([5.0, 6.0, 7.0]), _row_shapes(ids="float32 [3]")),
        ("seq_ids", torch.tensor([7.0, 7.0, 7.0], dtype=torch.float64), _row_shapes(seq="float64 [3]")),
        ("decoded", torch.tensor([0.0, 1.0, 1.0]), _row_shapes(dec="float32 [3]")),
        ("hidden_states", torch.zeros(3, W, dtype=torch.int64), _row_shapes(hid=f"int64 [3, {W}]")),
    ],
)
def test_tensors_that_are_not_one_row_per_token_are_refused_with_every_shape(tmp_path, name, value, found):
    tensors = _tensors(SEQ_7)
    tensors[name] = value
    _write(tmp_path / SHARD, tensors)
    err = _refusal(tmp_path)
    assert err.what == "a dump shard's tensors are not one row per token"
    assert err.where == str(tmp_path / SHARD)
    assert err.found == found
    assert err.expected == (
        "integer input_ids, positions, seq_ids and decoded of shape [N], floating hidden_states [N, width] "
        "(width >= 1) and final_hidden_states [N, H] where present"
    )
    assert err.fix == "dump again"


def test_an_old_dump_without_decoded_is_checked_without_it(tmp_path):
    tensors = _tensors(SEQ_7)
    del tensors["decoded"]
    tensors["positions"] = torch.tensor([0, 1])
    _write(tmp_path / SHARD, tensors)
    assert _refusal(tmp_path).found == _row_shapes(pos="int64 [2]", dec=None)


# ---------------------------------------------------------------------- shards of different layers
@pytest.mark.parametrize(("first", "second"), [("[1, 2, 3]", "[2, 30, 58]"), ("[2, 30, 58]", "[1, 2, 3]")])
def test_shards_of_different_layers_are_refused_naming_the_odd_one(tmp_path, first, second):
    _shard(tmp_path / "shard-1-00000.safetensors", SEQ_7, layer_ids=first)
    _shard(tmp_path / "shard-1-00001.safetensors", [(8, 3, 7, 1)], layer_ids=second)
    err = _refusal(tmp_path)
    assert err.what == "dump shards captured different layers"
    assert err.where == str(tmp_path / "shard-1-00001.safetensors")
    assert err.found == f"layer_ids {second}"
    assert err.expected == f"layer_ids {first} as shard-1-00000.safetensors"
    assert err.fix == "keep one server's dump in one directory"


def test_a_long_layer_ids_list_is_cut_to_its_first_8_ids_in_the_message(tmp_path):
    _shard(tmp_path / "shard-1-00000.safetensors", SEQ_7)
    _shard(tmp_path / "shard-1-00001.safetensors", [(8, 3, 7, 1)], layer_ids=json.dumps(list(range(1000))))
    assert _refusal(tmp_path).found == "layer_ids [0, 1, 2, 3, 4, 5, 6, 7 ...] (1000 ids)"


@pytest.mark.parametrize(
    ("layer_ids", "found"),
    [
        ("1,2,3", "layer_ids '1,2,3'"),
        ("[" * 100_000, f"layer_ids {'[' * 80!r} ..."),
        ("5", "layer_ids '5'"),
        ('{"a": 1}', """layer_ids '{"a": 1}'"""),
        ("[2.0, 30.0, 58.0]", "layer_ids '[2.0, 30.0, 58.0]'"),  # another writer's floats: other layers, maybe
        ("[true]", "layer_ids '[true]'"),
        ("null", "layer_ids 'null'"),
        ("[]", "layer_ids '[]'"),
        ("[-1]", "layer_ids '[-1]'"),
        (json.dumps(list(range(1025))), f"layer_ids {json.dumps(list(range(1025)))[:80]!r} ..."),
    ],
)
def test_layer_ids_that_are_not_a_list_of_layer_numbers_are_refused(tmp_path, layer_ids, found):
    _shard(tmp_path / SHARD, SEQ_7, layer_ids=layer_ids)
    err = _refusal(tmp_path)
    assert err.what == "the dump's layer_ids are not a list of layer numbers" and err.found == found
    assert err.where == str(tmp_path / SHARD)


def test_a_dump_that_records_no_layer_ids_is_read_and_its_layers_are_the_users_word(tmp_path):
    _shard(tmp_path / SHARD, SEQ_7, layer_ids=None)
    (st,), meta = read_dump(tmp_path)
    assert meta["layer_ids"] is None and st.tokens.tolist() == [5, 6, 7]


# ---------------------------------------------------------------------- which sequences are whole
def test_a_two_token_sequence_is_read_and_a_one_token_one_is_not(tmp_path):
    _shard(tmp_path / SHARD, [(5, 0, 1, 0), (6, 0, 2, 0), (7, 1, 2, 1)])
    (st,), _ = read_dump(tmp_path)
    assert st.source == f"{tmp_path.name}: sequence 2" and st.tokens.tolist() == [6, 7]


def test_a_sequence_that_cannot_be_lined_up_is_skipped_and_the_ones_after_it_are_read(tmp_path):
    rows = [
        (3, 2, 1, 0),  # sequence 1: a cached prefix (starts at position 2)
        (4, 0, 2, 0),
        (4, 2, 2, 1),  # sequence 2: a hole at position 1
        (5, -1, 3, 0),
        (6, 1, 3, 1),  # sequence 3: a negative position and a hole
        (7, 0, 4, 0),
        (8, 2**62, 4, 1),  # sequence 4: a hostile position far away
        (9, 0, 5, 0),
        (10, 1, 5, 1),  # sequence 5: whole
    ]
    _shard(tmp_path / SHARD, rows)
    (st,), _ = read_dump(tmp_path)
    assert st.source == f"{tmp_path.name}: sequence 5" and st.tokens.tolist() == [9, 10]


@pytest.mark.parametrize(("limit", "read"), [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (None, [1, 2, 3])])
def test_at_most_limit_sequences_are_read_in_the_order_of_their_ids(tmp_path, limit, read):
    rows = [(t, p, s, p) for s in (3, 1, 2) for t, p in ((10 * s, 0), (10 * s + 1, 1))]
    _shard(tmp_path / SHARD, rows)
    states, _ = read_dump(tmp_path, limit=limit)
    assert [st.source for st in states] == [f"{tmp_path.name}: sequence {s}" for s in read]
    assert [st.tokens.tolist() for st in states] == [[10 * s, 10 * s + 1] for s in read]


# ---------------------------------------------------------------------- the bound
def test_a_dump_of_more_than_4194304_rows_is_refused_before_its_rows_are_read(tmp_path):
    n = (1 << 22) + 1
    tensors = {k: torch.zeros(n, dtype=torch.int8) for k in ("input_ids", "positions", "seq_ids", "decoded")}
    _write(tmp_path / SHARD, {**tensors, "hidden_states": torch.zeros(n, 1, dtype=torch.float16)})
    err = _refusal(tmp_path)
    assert err.what == "the dump is too large to measure at once" and err.where == str(tmp_path)
    assert err.found == "more than 4194304 rows" and err.expected == "at most 4194304 rows (MAX_DUMP_ROWS)"
    assert err.fix == "measure on a directory with fewer shards"


# ---------------------------------------------------------------------- importing
def test_importing_the_reader_does_not_import_torch():
    """torch is no dependency of eagle3-patches (sglang brings it): the module imports it when a dump is read."""
    code = "import sys, eagle3_patches.acceptance.target_states; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
