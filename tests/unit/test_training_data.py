"""The readers of SpecForge's and speculators' offline training data (``eagle3_patches.acceptance.training_data``).

The fixtures are written the way the tools write them (neither tool is installed here): ``torch.save`` of the
dict each tool's source builds, at the path it chooses; each writer names the source it follows.
"""

from __future__ import annotations

import gzip
import pathlib

import pytest
import torch

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


def test_limit_leaves_a_bad_file_past_it_unread(tmp_path):
    write_speculators(tmp_path, 0)
    (tmp_path / "data_1.pt").write_bytes(b"not a torch file")
    assert len(list(td.read_speculators(tmp_path, limit=1))) == 1
    with pytest.raises(CheckpointError, match="not a readable torch file"):
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
    (tmp_path / "new" / "hidden_states").mkdir(parents=True)
    (tmp_path / "new" / "hidden_states" / "hs_0.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as exc:
        td.read_speculators(tmp_path / "new")
    _refusal(exc, tmp_path / "new" / "hidden_states" / "hs_0.safetensors", "speculators 0.5 and later", "Arrow")
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
    obj, name = (Custom(), "Custom") if kind == "custom class" else (Payload(marker), "GLOBAL getattr")
    write_speculators(tmp_path / "data", 0, loss_mask=obj)
    with pytest.raises(CheckpointError) as exc:
        list(td.read_speculators(tmp_path / "data"))
    _refusal(exc, tmp_path / "data" / "data_0.pt", "objects other than tensors", "Unsupported global", name)
    assert "was not an allowed" not in str(exc.value)  # torch's advice to allow it is not repeated
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
    monkeypatch.setattr(td, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path / "plain"))
    _refusal(exc, tmp_path / "plain" / "rows_0-2000" / "data_0.ckpt", "too large", f"{size} bytes", f"<= {size - 1}")
    monkeypatch.setattr(td, "MAX_FILE_BYTES", gz_size + 1)  # the stream passes, what it inflates to does not
    with pytest.raises(CheckpointError) as exc:
        list(td.read_specforge(tmp_path / "gz"))
    _refusal(exc, tmp_path / "gz" / "rows_0-2000" / "data_0.ckpt.gz", "too large", "inflated")


def test_at_the_size_bound_a_file_is_read(tmp_path, monkeypatch):
    write_specforge(tmp_path / "gz", 0, compress=True)
    write_specforge(tmp_path / "plain", 0)
    raw = gzip.decompress((tmp_path / "gz" / "rows_0-2000" / "data_0.ckpt.gz").read_bytes())
    monkeypatch.setattr(td, "MAX_FILE_BYTES", len(raw))
    assert len(list(td.read_specforge(tmp_path / "gz"))) == 1
    monkeypatch.setattr(td, "MAX_FILE_BYTES", (tmp_path / "plain" / "rows_0-2000" / "data_0.ckpt").stat().st_size)
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
    layers = [torch.full((2, 1), float(j)) for j in range(td.MAX_LAYERS)]
    write_speculators(tmp_path / "c", 0, length=2, hidden_states=layers)
    (c,) = td.read_speculators(tmp_path / "c")
    assert c.aux.shape == (2, td.MAX_LAYERS - 1) and c.aux[0].tolist() == list(range(td.MAX_LAYERS - 1))
