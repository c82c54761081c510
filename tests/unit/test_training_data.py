"""The readers of SpecForge's and speculators' offline training data (``eagle3_patches.acceptance.training_data``).

The fixtures are written the way the tools write them (neither tool is installed here): ``torch.save`` of the
dict each tool's source builds, at the path it chooses; each writer names the source it follows.
"""

from __future__ import annotations

import gzip
import os
import pathlib
import struct
import subprocess
import sys
import types
import zipfile
import zlib

import pytest
import torch

from eagle3_patches.acceptance import torch_file
from eagle3_patches.acceptance import training_data as td
from eagle3_patches.checkpoint.safe_io import CheckpointError, UnsafeFileError

H, K = 4, 3  # hidden size, number of aux layers


def _layers(length: int, seed: int) -> list[torch.Tensor]:
    """K aux layers then the last layer, each [L, H] bf16; layer j of position i holds 100*j + i + seed/10 in
    every slot, so a test can tell which layer (and position) landed where."""
    pos = torch.arange(length, dtype=torch.float32)[:, None].expand(length, H)
    return [(100 * j + pos + seed / 10).to(torch.bfloat16) for j in range(K + 1)]


def write_specforge(root: pathlib.Path, idx: int, length: int = 5, *, compress: bool = False, **override) -> dict:
    """One sample as SpecForge's ``scripts/prepare_hidden_states.py`` writes it (``HiddenStatesGenerator``:
    ``_get_file_path`` -> ``rows_<g>-<g+2000>/data_<idx>.ckpt``; ``_save_tensor_sync`` -> ``torch.save`` of the
    eagle3 ``OfflineCaptureLayout`` record, ``gzip.open`` + ``torch.save`` with ``--compress``): ``input_ids`` and
    ``loss_mask`` a row ``[L]``, ``aux_hidden_state`` ``[1, L, 3H]`` (sglang's concatenation of the captured
    layers, ``unsqueeze(0)``), ``hidden_state`` ``[1, L, H]``."""
    layers = _layers(length, idx)
    record = {
        "input_ids": torch.arange(length, dtype=torch.long) + 1000 * idx,
        "loss_mask": torch.tensor([0] * (length // 2) + [1] * (length - length // 2), dtype=torch.long),
        "aux_hidden_state": torch.cat(layers[:-1], dim=-1).unsqueeze(0),
        "hidden_state": layers[-1].unsqueeze(0),
    }
    record.update(override)
    record = {k: v for k, v in record.items() if v is not None}
    group = (idx // 2000) * 2000
    path = root / f"rows_{group}-{group + 2000}" / f"data_{idx}.ckpt{'.gz' if compress else ''}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        with gzip.open(path, "wb", compresslevel=6) as f:
            torch.save(record, f)
    else:
        torch.save(record, path)
    return record


def write_speculators(root: pathlib.Path, idx: int, length: int = 5, **override) -> dict:
    """One sample as speculators' ``scripts/data_generation_offline.py`` (v0.3.0, v0.4.x) writes it
    (``generate_and_save_hidden_states``: ``torch.save`` of ``{"input_ids", "hidden_states": [one [L, H] tensor
    per layer of layer_ids, the last layer last], "loss_mask"}`` to ``<out>/data_<idx>.pt``)."""
    layers = _layers(length, idx)
    record = {
        "input_ids": torch.arange(length, dtype=torch.long) + 1000 * idx,
        "hidden_states": [h.contiguous() for h in layers],
        "loss_mask": torch.tensor([0, 0] + [1] * (length - 2), dtype=torch.long),
    }
    record.update(override)
    record = {k: v for k, v in record.items() if v is not None}
    root.mkdir(parents=True, exist_ok=True)
    torch.save(record, root / f"data_{idx}.pt")
    return record


def _refusal(exc: pytest.ExceptionInfo, path: pathlib.Path, *parts: str) -> str:
    text = str(exc.value)
    assert exc.value.code == td.CODE, text
    assert exc.value.where == str(path), text
    for part in parts:
        assert part in text, text
    return text


# ------------------------------------------------------------------ reading right
def test_specforge_read_tokens_aux_in_capture_order_and_loss_mask(tmp_path):
    written = {i: write_specforge(tmp_path, i, length=3 + i) for i in (0, 2, 10)}
    write_specforge(tmp_path, 2001, length=4)  # the next group's subdirectory
    got = list(td.read_specforge(tmp_path))
    assert [s.source for s in got] == [
        "rows_0-2000/data_0.ckpt",
        "rows_0-2000/data_2.ckpt",
        "rows_0-2000/data_10.ckpt",  # index order, not the text order data_10 < data_2
        "rows_2000-4000/data_2001.ckpt",
    ]
    for s, (i, rec) in zip(got, written.items()):
        length = 3 + i
        assert s.tokens.dtype == torch.int64 and s.tokens.tolist() == rec["input_ids"].tolist()
        assert s.aux.dtype == torch.float32 and s.aux.shape == (length, K * H)
        for j in range(K):  # layer j's states at columns j*H..(j+1)*H, every position in place
            expected = (100 * j + torch.arange(length)[:, None] + i / 10).to(torch.bfloat16).float().expand(length, H)
            assert torch.equal(s.aux[:, j * H : (j + 1) * H], expected)
        assert s.labelled.dtype == torch.bool and s.labelled.tolist() == rec["loss_mask"].bool().tolist()
        assert s.labelled.tolist() != [True] * length and s.labelled.tolist() != [False] * length


def test_specforge_compressed_and_squeezed_rows_read_the_same(tmp_path):
    plain = write_specforge(tmp_path / "a", 0)
    write_specforge(tmp_path / "b", 0, compress=True)
    write_specforge(  # the shapes SpecForge's reader also takes: [1, L] rows, [L, k*H] aux, a bool mask
        tmp_path / "c",
        0,
        input_ids=plain["input_ids"][None, :],
        loss_mask=plain["loss_mask"].bool()[None, :],
        aux_hidden_state=plain["aux_hidden_state"][0],
    )
    (a,), (b,), (c,) = (list(td.read_specforge(tmp_path / d)) for d in "abc")
    assert b.source == "rows_0-2000/data_0.ckpt.gz"
    for other in (b, c):
        assert torch.equal(a.tokens, other.tokens) and torch.equal(a.aux, other.aux)
        assert torch.equal(a.labelled, other.labelled)


def test_speculators_read_aux_is_every_layer_but_the_last(tmp_path):
    written = {i: write_speculators(tmp_path, i, length=4 + i) for i in (1, 0, 11)}
    got = list(td.read_speculators(tmp_path))
    assert [s.source for s in got] == ["data_0.pt", "data_1.pt", "data_11.pt"]
    for s in got:
        i = int(s.source[5:-3])
        rec, length = written[i], 4 + i
        assert s.tokens.tolist() == rec["input_ids"].tolist()
        assert s.aux.dtype == torch.float32 and s.aux.shape == (length, K * H)  # the last layer left out
        assert torch.equal(s.aux, torch.cat([h.float() for h in rec["hidden_states"][:-1]], dim=-1))
        assert s.labelled.tolist() == [False, False] + [True] * (length - 2)


def test_one_file_can_be_read_alone(tmp_path):
    write_specforge(tmp_path, 0)
    write_specforge(tmp_path, 1)
    (s,) = td.read_specforge(tmp_path / "rows_0-2000" / "data_1.ckpt")
    assert s.source == "data_1.ckpt" and s.tokens[0] == 1000


def test_limit_bounds_the_files_read(tmp_path):
    for i in range(4):
        write_speculators(tmp_path, i)
    assert [s.source for s in td.read_speculators(tmp_path, limit=2)] == ["data_0.pt", "data_1.pt"]
    assert len(list(td.read_speculators(tmp_path, limit=9))) == 4
    assert len(list(td.read_speculators(tmp_path))) == 4
    for bad in (0, -1, True, 1.5):
        with pytest.raises(CheckpointError, match="positive integer"):
            td.read_speculators(tmp_path, limit=bad)
    with pytest.raises(CheckpointError) as exc:  # a hostile limit is shown cut to 40 characters
        td.read_speculators(tmp_path, limit="9" * 50)
    assert exc.value.found == "'" + "9" * 39 and exc.value.expected == "an integer >= 1, or no limit"
    for i in range(3):  # SpecForge's reader takes the limit too
        write_specforge(tmp_path / "sf", i)
    assert [s.source for s in td.read_specforge(tmp_path / "sf", limit=2)] == [
        "rows_0-2000/data_0.ckpt",
        "rows_0-2000/data_1.ckpt",
    ]
    with pytest.raises(CheckpointError, match="positive integer"):
        td.read_specforge(tmp_path / "sf", limit=0)


def test_limit_leaves_a_bad_file_past_it_unread(tmp_path):
    write_speculators(tmp_path, 0)
    (tmp_path / "data_1.pt").write_bytes(b"not a torch file")
    assert len(list(td.read_speculators(tmp_path, limit=1))) == 1
    with pytest.raises(CheckpointError, match="not a torch zip file"):
        list(td.read_speculators(tmp_path))


# ------------------------------------------------------------------ detect
def test_detect(tmp_path):
    write_specforge(tmp_path / "sf", 0, compress=True)
    write_speculators(tmp_path / "sp", 0)
    (tmp_path / "new" / "hidden_states").mkdir(parents=True)
    (tmp_path / "new" / "hidden_states" / "hs_0.safetensors").write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shard-1-00000.safetensors").write_bytes(b"")  # a hidden_state_dump is neither
    assert td.detect(tmp_path / "sf") == "specforge"
    assert td.detect(tmp_path / "sf" / "rows_0-2000" / "data_0.ckpt.gz") == "specforge"
    assert td.detect(tmp_path / "sp") == "speculators"
    assert td.detect(tmp_path / "new") == "speculators"
    assert td.detect(tmp_path / "other") is None
    write_speculators(tmp_path / "sf", 1)  # both kinds: ambiguous
    assert td.detect(tmp_path / "sf") is None


def test_detect_loads_nothing(tmp_path, monkeypatch):
    write_specforge(tmp_path, 0)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("detect loaded a file"))
    assert td.detect(tmp_path) == "specforge"


def test_wrong_reader_and_newer_speculators_layout_are_named(tmp_path):
    write_specforge(tmp_path / "sf", 0)
    with pytest.raises(CheckpointError) as exc:
        td.read_speculators(tmp_path / "sf")
    _refusal(exc, tmp_path / "sf", "no speculators hidden-state files", "looks like specforge data")
    assert exc.value.fix == "read it as specforge data"
    write_speculators(tmp_path / "sp", 0)
    with pytest.raises(CheckpointError) as exc:
        td.read_specforge(tmp_path / "sp")
    _refusal(exc, tmp_path / "sp", "1 file(s), none named data_<i>.ckpt or data_<i>.ckpt.gz")
    assert exc.value.what == "no SpecForge hidden-state files here; this looks like speculators data"
    assert exc.value.fix == "read it as speculators data"
    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "shard-1-00000.safetensors").write_bytes(b"")
    for read, what in ((td.read_speculators, "speculators"), (td.read_specforge, "SpecForge")):
        with pytest.raises(CheckpointError) as exc:  # neither kind: no other kind suggested
            read(tmp_path / "neither")
        _refusal(exc, tmp_path / "neither", "1 file(s), none named")
        assert exc.value.what == f"no {what} hidden-state files here"
        assert exc.value.fix == "pass the directory the tool wrote its output to"
    (tmp_path / "new" / "hidden_states").mkdir(parents=True)
    for i in (10, 0, 2):
        (tmp_path / "new" / "hidden_states" / f"hs_{i}.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as exc:  # named by its first file in index order
        td.read_speculators(tmp_path / "new")
    _refusal(exc, tmp_path / "new" / "hidden_states" / "hs_0.safetensors", "speculators 0.5 and later", "Arrow")
    assert exc.value.found == "3 hs_<i>.safetensors file(s)"
    write_speculators(tmp_path / "new", 0)  # data_<i>.pt beside them: those are read
    assert [s.source for s in td.read_speculators(tmp_path / "new")] == ["data_0.pt"]
    with pytest.raises(CheckpointError, match="does not exist"):
        td.read_specforge(tmp_path / "missing")


# ------------------------------------------------------------------ malformed files
@pytest.mark.parametrize(
    ("override", "parts"),
    [
        ({"aux_hidden_state": None}, ["no aux_hidden_state", "only the last layer"]),
        ({"aux_hidden_state": None, "hidden_state": None}, ["lacks aux_hidden_state", "'input_ids'"]),
        ({"loss_mask": torch.ones(4, dtype=torch.long)}, ["differ in length", "loss_mask 4, input_ids 5"]),
        ({"input_ids": torch.arange(5).float()}, ["input_ids has the wrong dtype", "torch.float32"]),
        ({"input_ids": torch.arange(5) - 1}, ["negative token ids"]),
        ({"loss_mask": torch.tensor([0, 1, 2, 1, 1])}, ["other than 0 and 1", "max 2"]),
        ({"loss_mask": torch.ones(2, 5, dtype=torch.long)}, ["loss_mask has the wrong shape", "[2, 5]"]),
        ({"aux_hidden_state": torch.ones(2, 5, K * H)}, ["aux_hidden_state has the wrong shape", "[2, 5, 12]"]),
        ({"aux_hidden_state": torch.ones(1, 6, K * H)}, ["aux hidden states and input_ids differ", "aux 6"]),
        ({"aux_hidden_state": torch.ones(1, 5, K * H, dtype=torch.long)}, ["wrong dtype", "torch.int64"]),
        ({"aux_hidden_state": torch.full((1, 5, K * H), float("nan"))}, ["NaN or infinite", "60 non-finite"]),
        ({"aux_hidden_state": torch.zeros(1, 1, 1).expand(1, 5, K * H)}, ["repeats stored elements"]),
        ({"aux_hidden_state": [1.0, 2.0]}, ["aux_hidden_state is not a tensor", "list"]),
        ({"input_ids": torch.empty(0, dtype=torch.long)}, ["input_ids has the wrong shape", "L >= 1"]),
        ({"input_ids": torch.tensor(5)}, ["input_ids has the wrong shape", "found:    []"]),
        ({"loss_mask": torch.tensor([0, 1, -1, 1, 1])}, ["other than 0 and 1", "min -1, max 1"]),
        (
            {"aux_hidden_state": torch.ones(1, 4, K * H)},
            ["aux hidden states and input_ids", "aux 4 positions, input_ids 5"],
        ),
        ({"aux_hidden_state": torch.ones(5)}, ["aux_hidden_state has the wrong shape", "found:    [5]\n"]),
        ({"aux_hidden_state": torch.ones(1, 5, 0)}, ["aux_hidden_state has the wrong shape", "found:    [5, 0]"]),
        ({"input_ids": None}, ["lacks input_ids", "expected: the keys input_ids, loss_mask, aux_hidden_state"]),
        ({"loss_mask": None}, ["lacks loss_mask", "keys: 'input_ids', 'aux_hidden_state', 'hidden_state'"]),
        (
            {"aux_hidden_state": torch.ones(1, 5, K * H, device="meta")},
            ["holds objects other than tensors", "found:    torch._utils._rebuild_meta_tensor_no_storage"],
        ),
        (
            {"input_ids": torch.arange(5).to_sparse()},
            ["holds objects other than tensors", "found:    torch._utils._rebuild_sparse_tensor"],
        ),
    ],
)
def test_malformed_specforge_file_refused_naming_it(tmp_path, override, parts):
    write_specforge(tmp_path, 0)
    write_specforge(tmp_path, 7, **override)
    it = td.read_specforge(tmp_path)
    assert next(it).source == "rows_0-2000/data_0.ckpt"  # the good file reads; the bad one is named
    with pytest.raises(CheckpointError) as exc:
        next(it)
    _refusal(exc, tmp_path / "rows_0-2000" / "data_7.ckpt", *parts)


@pytest.mark.parametrize(
    ("override", "parts"),
    [
        ({"hidden_states": torch.ones(5, K * H)}, ["not a list", "Tensor"]),
        ({"hidden_states": [torch.ones(5, H)]}, ["not a list", "list of 1", "2 to 256"]),
        ({"hidden_states": [torch.ones(5, H)] * 257}, ["list of 257"]),
        ({"hidden_states": [torch.ones(5, H), torch.ones(5, H + 1)]}, ["hidden_states[1] has the wrong shape"]),
        ({"hidden_states": [torch.ones(1, 5, H)] * 2}, ["hidden_states[0] has the wrong shape", "[1, 5, 4]"]),
        ({"hidden_states": [torch.ones(5, H), "x"]}, ["hidden_states[1] is not a tensor", "str"]),
        ({"loss_mask": torch.ones(6, dtype=torch.long)}, ["differ in length", "loss_mask 6, input_ids 5"]),
        ({"aux_hidden_state": torch.ones(1, 5, H)}, ["SpecForge's keys"]),
        (
            {"hidden_states": [torch.ones(5, H + 1), torch.ones(5, H)]},
            ["[1] has the wrong", "[5, 4] (hidden_states[0]: [5, 5])"],
        ),
        (
            {"hidden_states": [torch.ones(5)] * 2},
            ["hidden_states[0] has the wrong shape", "[5] (hidden_states[0]: [5])"],
        ),
        ({"hidden_states": [torch.ones(5, 0)] * 2}, ["hidden_states[0] has the wrong shape", "[5, 0] (hidden_states"]),
        ({"input_ids": None}, ["lacks input_ids", "expected: the keys input_ids, hidden_states, loss_mask"]),
    ],
)
def test_malformed_speculators_file_refused_naming_it(tmp_path, override, parts):
    write_speculators(tmp_path, 3, **override)
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(tmp_path))
    _refusal(exc, tmp_path / "data_3.pt", *parts)


def test_missing_key_and_non_dict_payload_refused(tmp_path):
    torch.save({"input_ids": torch.arange(3)}, tmp_path / "data_0.pt")
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(tmp_path))
    _refusal(exc, tmp_path / "data_0.pt", "lacks hidden_states, loss_mask", "keys: 'input_ids'")
    torch.save([torch.arange(3)], tmp_path / "data_0.pt")
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(tmp_path))
    _refusal(exc, tmp_path / "data_0.pt", "holds a list, not a dict")


def test_aux_width_must_match_across_files(tmp_path):
    write_specforge(tmp_path, 0)
    write_specforge(tmp_path, 1, aux_hidden_state=torch.ones(1, 5, 2 * H))
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path))
    _refusal(exc, tmp_path / "rows_0-2000" / "data_1.ckpt", "differ in width", "8 here, 12 in rows_0-2000/data_0")
    write_specforge(tmp_path / "wider", 0, aux_hidden_state=torch.ones(1, 5, 2 * H))
    write_specforge(tmp_path / "wider", 1)  # a later file wider than the first is refused as well
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path / "wider"))
    _refusal(exc, tmp_path / "wider" / "rows_0-2000" / "data_1.ckpt", "12 here, 8 in rows_0-2000/data_0")


def test_corrupt_gzip_refused(tmp_path):
    (tmp_path / "data_0.ckpt.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path))
    _refusal(exc, tmp_path / "data_0.ckpt.gz", "not a readable gzip stream")


# ------------------------------------------------------------------ hostile files
class Custom:
    """A class of the test module: a plain unpickler imports it to rebuild the object."""


class Payload:
    """Pickled as a call of ``pathlib.Path.touch``: what a plain unpickler would run when loading."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


@pytest.mark.parametrize("kind", ["custom class", "reduce"])
def test_a_pickle_with_a_custom_class_is_refused_unrun(tmp_path, kind):
    marker = tmp_path / "ran"
    obj, name = (Custom(), "test_training_data.Custom") if kind == "custom class" else (Payload(marker), "getattr")
    write_speculators(tmp_path / "data", 0, loss_mask=obj)
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(tmp_path / "data"))
    _refusal(exc, tmp_path / "data" / "data_0.pt", "objects other than tensors", name)
    assert not marker.exists()
    torch.save({"x": obj}, tmp_path / "plain.pt")  # the payload does run under a plain load: the test can fail
    torch.load(tmp_path / "plain.pt", weights_only=False)
    assert marker.exists() == (kind == "reduce")


def test_a_link_out_of_the_data_directory_is_refused(tmp_path):
    write_specforge(tmp_path / "elsewhere", 5)
    (tmp_path / "data" / "rows_0-2000").mkdir(parents=True)
    link = tmp_path / "data" / "rows_0-2000" / "data_5.ckpt"
    link.symlink_to(tmp_path / "elsewhere" / "rows_0-2000" / "data_5.ckpt")
    assert td.detect(tmp_path / "data") == "specforge"
    with pytest.raises(UnsafeFileError) as exc:
        list(td.read_specforge(tmp_path / "data"))
    assert exc.value.code == "unsafe-file" and exc.value.where == str(link)
    assert "resolves outside" in str(exc.value)


def test_a_linked_subdirectory_is_not_followed(tmp_path):
    write_speculators(tmp_path / "elsewhere", 0)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert td.detect(tmp_path / "data") is None
    with pytest.raises(CheckpointError, match="no speculators hidden-state files"):
        td.read_speculators(tmp_path / "data")


def test_size_bound_refuses_before_loading(tmp_path, monkeypatch):
    write_specforge(tmp_path / "plain", 0)
    write_specforge(tmp_path / "gz", 0, length=64, compress=True)
    size = (tmp_path / "plain" / "rows_0-2000" / "data_0.ckpt").stat().st_size
    gz_size = (tmp_path / "gz" / "rows_0-2000" / "data_0.ckpt.gz").stat().st_size
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("loaded a file over the bound"))
    monkeypatch.setattr(torch_file, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path / "plain"))
    _refusal(exc, tmp_path / "plain" / "rows_0-2000" / "data_0.ckpt", "too large", f"{size} bytes", f"<= {size - 1}")
    monkeypatch.setattr(torch_file, "MAX_FILE_BYTES", gz_size + 1)  # the stream passes, what it inflates to does not
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path / "gz"))
    _refusal(exc, tmp_path / "gz" / "rows_0-2000" / "data_0.ckpt.gz", "too large", "inflated")


def test_at_the_size_bound_a_file_is_read(tmp_path, monkeypatch):
    write_specforge(tmp_path / "gz", 0, compress=True)
    write_specforge(tmp_path / "plain", 0)
    raw = gzip.decompress((tmp_path / "gz" / "rows_0-2000" / "data_0.ckpt.gz").read_bytes())
    monkeypatch.setattr(torch_file, "MAX_FILE_BYTES", len(raw))
    assert len(list(td.read_specforge(tmp_path / "gz"))) == 1
    monkeypatch.setattr(
        torch_file, "MAX_FILE_BYTES", (tmp_path / "plain" / "rows_0-2000" / "data_0.ckpt").stat().st_size
    )
    assert len(list(td.read_specforge(tmp_path / "plain"))) == 1


def test_directory_entries_bounded(tmp_path, monkeypatch):
    for i in range(3):
        write_speculators(tmp_path, i)
    monkeypatch.setattr(td, "MAX_DIR_ENTRIES", 3)
    assert td.detect(tmp_path) == "speculators"
    monkeypatch.setattr(td, "MAX_DIR_ENTRIES", 2)
    with pytest.raises(CheckpointError) as exc:
        td.detect(tmp_path)
    _refusal(exc, tmp_path, "implausibly many entries", "more than 2")


def test_one_position_and_the_most_layers_read(tmp_path):
    rec = write_specforge(tmp_path / "a", 0, length=1)
    write_specforge(  # [1, 1] rows and a [1, k*H] aux: squeezed only where they carry the batch dimension
        tmp_path / "b",
        0,
        input_ids=rec["input_ids"][None, :],
        loss_mask=rec["loss_mask"][None, :],
        aux_hidden_state=rec["aux_hidden_state"][0],
    )
    (a,), (b,) = td.read_specforge(tmp_path / "a"), td.read_specforge(tmp_path / "b")
    for s in (a, b):
        assert s.tokens.tolist() == [0] and s.labelled.tolist() == [True] and s.aux.shape == (1, K * H)
    write_specforge(tmp_path / "d", 0, aux_hidden_state=torch.full((1, 5, 1), 2.5))  # k*H = 1: the narrowest
    (d,) = td.read_specforge(tmp_path / "d")
    assert d.aux.shape == (5, 1) and d.aux.flatten().tolist() == [2.5] * 5
    layers = [torch.full((2, 1), float(j)) for j in range(td.MAX_LAYERS)]
    write_speculators(tmp_path / "c", 0, length=2, hidden_states=layers)
    (c,) = td.read_speculators(tmp_path / "c")
    assert c.aux.shape == (2, td.MAX_LAYERS - 1) and c.aux[0].tolist() == list(range(td.MAX_LAYERS - 1))


def test_missing_keys_listing_shows_twelve_keys_of_forty_characters(tmp_path):
    long = "L" * 45  # repr 47 characters: shown cut to 40
    shown = ["'" + "L" * 39] + [f"'k{i}'" for i in range(1, 12)]
    for extra, tail in ((0, ""), (1, " ...")):  # 12 keys: all shown; 13: the first 12 and "..."
        keys = [long] + [f"k{i}" for i in range(1, 12 + extra)]
        torch.save(dict.fromkeys(keys, 0), tmp_path / "data_0.pt")
        with pytest.raises(CheckpointError) as exc:
            list(td.read_speculators(tmp_path))
        _refusal(exc, tmp_path / "data_0.pt", "lacks input_ids, hidden_states, loss_mask")
        assert exc.value.found == "keys: " + ", ".join(shown) + tail
    torch.save({}, tmp_path / "data_0.pt")
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(tmp_path))
    assert exc.value.found == "keys: none"


def test_specforge_without_aux_lists_its_first_twelve_keys(tmp_path):
    keys = ["L" * 45, "hidden_state"] + [f"k{i}" for i in range(2, 13)]  # 13 keys
    write_specforge(tmp_path, 0, aux_hidden_state=None, input_ids=None, loss_mask=None, hidden_state=None)
    torch.save(dict.fromkeys(keys, 0), tmp_path / "rows_0-2000" / "data_0.ckpt")
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path))
    _refusal(exc, tmp_path / "rows_0-2000" / "data_0.ckpt", "no aux_hidden_state, only the last layer's")
    shown = ["'" + "L" * 39, "'hidden_state'"] + [f"'k{i}'" for i in range(2, 12)]
    assert exc.value.found == "keys: " + ", ".join(shown)


# ------------------------------------------------------------------ hostile pickles, written opcode by opcode
def _pickle(path: pathlib.Path, ops: bytes) -> pathlib.Path:
    """A protocol-2 pickle of ``ops`` in a torch zip, stored as torch.save stores its records."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02" + ops + b".")
        zf.writestr("archive/version", b"3\n")
    return path


def _text(s: str) -> bytes:  # BINUNICODE
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _refused(path: pathlib.Path) -> CheckpointError:
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(path))
    assert exc.value.code == td.CODE and exc.value.where == str(path)
    return exc.value


def test_unreadable_file_found_is_the_line_that_names_the_problem(tmp_path):
    err = _refused(_pickle(tmp_path / "data_0.pt", b"n"))  # no pickle opcode: the reader refuses it
    assert err.what == "speculators hidden-state file is not a readable torch file"
    assert err.found == "its pickle: opcode b'n', which torch.save's pickles never hold at byte 2"
    (tmp_path / "data_0.pt").write_bytes(b"")
    err = _refused(tmp_path / "data_0.pt")
    assert err.what == "speculators hidden-state file is not a torch zip file"
    assert err.found == "no zip archive (an older torch.save format, or another file)"
    # a string called as a function (no global names it) is refused as a call, the string never shown
    _pickle(tmp_path / "data_0.pt", _text("A" * 250 + "\nWeightsUnpickler error:\nforged") + b")R")
    err = _refused(tmp_path / "data_0.pt")
    assert err.found == "a call of a str (only torch.save's own rebuild functions)"


def test_a_global_is_refused_unloaded_naming_it_cut_to_200_characters(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a pickle naming a foreign global was loaded"))
    err = _refused(_pickle(tmp_path / "data_0.pt", b"cevil\n" + b"B" * 300 + b"\n)R"))
    assert err.what.endswith(
        "holds objects other than tensors and plain containers; refused (loading it could run code)"
    )
    assert err.found == ("evil." + "B" * 300)[:200]
    for ops, found in (
        (b"c__builtin__\nbytearray\nJ\x00\x00\x00\x40\x85R", "__builtin__.bytearray"),  # 1 GiB of zeros
        (b"ctorch._utils\n_rebuild_nested_tensor\n)R", "torch._utils._rebuild_nested_tensor"),
        (b"ctorch._tensor\n_rebuild_from_type_v2\n)R", "torch._tensor._rebuild_from_type_v2"),  # a subclass
        (_text("torch") + _text("x") + b"\x93", "an object built by the STACK_GLOBAL opcode (torch.save writes none)"),
    ):
        assert _refused(_pickle(tmp_path / "data_0.pt", ops)).found == found


@pytest.mark.parametrize("module", ["os", "posix", "sys"])
def test_a_global_of_a_module_torch_blocks_is_refused_as_code(tmp_path, module):
    err = _refused(_pickle(tmp_path / "data_0.pt", f"c{module}\nsystem\n".encode() + _text("true") + b"\x85R"))
    assert err.what.endswith(
        "holds objects other than tensors and plain containers; refused (loading it could run code)"
    )
    assert err.found == f"{module}.system"


def test_gzip_error_is_shown_cut_to_200_characters(tmp_path, monkeypatch):
    write_specforge(tmp_path, 0, compress=True)

    def fail(self, size=-1):
        raise zlib.error("E" * 300)

    monkeypatch.setattr(gzip.GzipFile, "read", fail)
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path))
    _refusal(exc, tmp_path / "rows_0-2000" / "data_0.ckpt.gz", "not a readable gzip stream")
    assert exc.value.found == "E" * 200


# ------------------------------------------------------------------ listing
def test_an_unlistable_directory_is_refused_with_the_system_error(tmp_path, monkeypatch):
    write_speculators(tmp_path, 0)
    for error, found in (
        (PermissionError(13, "Permission denied", str(tmp_path)), "PermissionError: Permission denied"),
        (OSError("no strerror"), "OSError: no strerror"),
    ):

        def scandir(path, error=error):
            raise error

        monkeypatch.setattr(os, "scandir", scandir)
        with pytest.raises(CheckpointError) as exc:
            td.read_speculators(tmp_path)
        _refusal(exc, tmp_path, "cannot list the training data directory")
        assert exc.value.found == found and exc.value.fix == "check the path and its permissions"


def test_a_link_to_a_directory_one_level_down_is_listed_and_refused(tmp_path):
    write_specforge(tmp_path, 0)
    (tmp_path / "rows_0-2000" / "inner").mkdir()
    link = tmp_path / "rows_0-2000" / "data_1.ckpt"
    link.symlink_to(tmp_path / "rows_0-2000" / "inner", target_is_directory=True)
    it = td.read_specforge(tmp_path)
    assert next(it).source == "rows_0-2000/data_0.ckpt"
    with pytest.raises(UnsafeFileError) as exc:  # not skipped in silence: named and refused unread
        next(it)
    assert exc.value.where == str(link) and "not a regular file" in exc.value.what


def test_the_file_size_bound_is_4_gib(tmp_path):
    """Sparse files (no disk used): one byte over 4 GiB is refused unread; at 4 GiB it is loaded (zeros: no torch
    file)."""
    for size, what in (((4 << 30) + 1, "too large"), (4 << 30, "not a torch zip file")):
        path = tmp_path / "data_0.pt"
        with open(path, "wb") as f:
            f.truncate(size)
        err = _refused(path)
        assert what in err.what
        if what == "too large":
            assert err.found == "4294967297 bytes" and err.expected == "<= 4294967296 bytes (MAX_FILE_BYTES)"


def test_the_directory_entry_bound_is_4m(tmp_path, monkeypatch):
    """A directory of 2**22 + 1 entries (listed by a stand-in for os.scandir) is refused naming the bound."""
    entry = types.SimpleNamespace(name="x", path=str(tmp_path / "x"), is_dir=lambda follow_symlinks=True: False)

    class Listing:
        def __enter__(self):
            return iter([entry] * ((1 << 22) + 1))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(os, "scandir", lambda path: Listing())
    with pytest.raises(CheckpointError) as exc:
        td.detect(tmp_path)
    _refusal(exc, tmp_path, "implausibly many entries")
    assert exc.value.found == "more than 4194304" and exc.value.expected == "<= 4194304 entries per directory"


def test_detect_does_not_import_torch(tmp_path):
    write_specforge(tmp_path, 0)
    code = (
        "import sys; from eagle3_patches.acceptance import training_data as td;"
        f"print(td.detect({str(tmp_path)!r}), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["specforge", "False"]
