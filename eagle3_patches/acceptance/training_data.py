"""Readers of EAGLE-3 training data: the target's hidden states SpecForge and speculators save for offline training.

A draft trained offline was trained on files holding, per sequence, the token ids, the loss mask (which tokens are
the response the target produced) and the target's aux hidden states at every position.  Read back, they are what
the draft is run on teacher-forced to measure its expected accept length: one :class:`TargetStates` per file.

**SpecForge** (github.com/sgl-project/SpecForge), ``scripts/prepare_hidden_states.py`` (v0.1.0 to the newest):
one file per sequence, ``<out>/rows_<g>-<g+group>/data_<i>.ckpt`` (``HiddenStatesGenerator._get_file_path``;
``.ckpt.gz``, a gzip stream of the same bytes, with ``--compress``), written by ``torch.save`` of a dict
(``_save_tensor_sync``; the keys are the eagle3 ``OfflineCaptureLayout`` of
``specforge/algorithms/eagle3/providers.py``):

==================== ================ =================================================================
key                  shape            what
==================== ================ =================================================================
``input_ids``        ``[L]`` int64    the token ids (a row of the tokenized batch)
``loss_mask``        ``[L]`` int64    1 on the assistant's tokens (``specforge/data/preprocessing.py``)
``aux_hidden_state`` ``[1, L, k*H]``  the captured layers' states, concatenated in capture order by
                                      sglang's logits processor (``unsqueeze(0)``: a batch dimension)
``hidden_state``     ``[1, L, H]``    the last layer's state after the target's final norm: what SpecForge's
                                      ``TargetHead`` (the target's ``lm_head`` alone) turns into the target's
                                      logits; read only for ``measure-accept --temperature``
==================== ================ =================================================================

Its offline reader (``OfflineEagle3Dataset.process_data`` in ``specforge/data/preprocessing.py``, and
``normalize_offline_sample`` in ``specforge/algorithms/eagle3/data.py``) squeezes the batch dimension, so
``[L, k*H]`` and ``[1, L]`` rows are accepted too; it also zeroes the loss mask's last position when training (no
next token there), which :attr:`TargetStates.labelled` leaves as stored.

**speculators** (github.com/vllm-project/speculators), ``scripts/data_generation_offline.py`` of v0.3.0 and
v0.4.x (``generate_and_save_hidden_states``): one file per sequence, ``<out>/data_<i>.pt``, written by
``torch.save`` of ``{"input_ids": [L] int64, "hidden_states": [k+1 tensors of [L, H]], "loss_mask": [L]}``; the
list holds one tensor per captured layer in ``layer_ids`` order
(``src/speculators/data_generation/vllm_hidden_states_generator.py``; by default ``[2, n//2, n-3, n-1]``), and the
trainer (``standardize_data_v1`` in ``src/speculators/train/data.py``) feeds the draft
``torch.cat(hidden_states[:-1], -1)`` and takes ``hidden_states[-1]`` as the last layer's state (before the target's
final norm, at a layer the files do not record: no target distribution is rebuilt from it).  From v0.5.0
speculators writes ``hidden_states/hs_<i>.safetensors`` (``token_ids``, ``hidden_states [L, k+1, H]``,
``src/speculators/data_generation/offline.py``) and keeps the loss mask only in the preprocessed Arrow dataset
beside it (``ArrowDataset`` in ``src/speculators/train/data.py``): :func:`detect` recognizes that layout and
:func:`read_speculators` refuses it by name (the loss mask cannot be read without Arrow).

These files come from strangers and are torch pickles: each is opened through
:func:`eagle3_patches.checkpoint.safe_io.open_checkpoint_file` (no link out of the data directory, regular files
only) and read by :mod:`.torch_file` alone, never by ``torch.load`` (one strict reading of the zip, a pickle
reader that knows only these files' grammar, storages mapped).  Every key, shape, dtype and value range is
checked, and what a sequence becomes in float32 is bounded before it is allocated, by :data:`MAX_SEQUENCE_BYTES`
and by :data:`AMPLIFICATION` times the file's size (a tensor stored once may be listed many times); two files
of one index (``data_0.ckpt`` and ``data_0.ckpt.gz``) are refused naming both.  Every
problem is a :class:`~eagle3_patches.checkpoint.safe_io.CheckpointError` (code ``training-data``, or
``unsafe-file``) naming the file, what was found and what was expected.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.safe_io import CheckpointError, checked_root, checkpoint_error
from . import torch_file
from .target_states import MAX_SEQUENCE_BYTES, TargetStates

if TYPE_CHECKING:
    import torch

SPECFORGE = "specforge"
SPECULATORS = "speculators"
#: the error code of a training-data file that is not what its tool writes
CODE = "training-data"
#: a speculators ``hidden_states`` list longer than this is refused (a model has at most a few hundred layers)
MAX_LAYERS = 256
#: what one file's sequence may become (int64 ids, bool mask, float32 states), per byte of the file (inflated): a
#: valid file, in any dtype these tools write (int8 ids and 16-bit states at the least), needs at most 3.25; more is
#: one stored tensor listed many times
AMPLIFICATION = 4
AMPLIFICATION_SLACK = 1 << 20
#: a data directory (or one of its subdirectories) with more entries than this is refused, unlisted further
MAX_DIR_ENTRIES = 1 << 22

_SPECFORGE_SUFFIXES = (".ckpt", ".ckpt.gz")
_SPECULATORS_SUFFIX = ".pt"
_SPECULATORS_SAFETENSORS = re.compile(r"hs_\d+\.safetensors")
_INDEX = re.compile(r"data_(\d{1,18})\.(?:ckpt|ckpt\.gz|pt)")
_WHAT = {SPECFORGE: "SpecForge hidden-state file", SPECULATORS: "speculators hidden-state file"}
_PATTERN = {SPECFORGE: "data_<i>.ckpt or data_<i>.ckpt.gz", SPECULATORS: "data_<i>.pt"}
_REGENERATE = {
    SPECFORGE: "regenerate it with SpecForge's scripts/prepare_hidden_states.py, or leave it out of the directory",
    SPECULATORS: "regenerate it with speculators' scripts/data_generation_offline.py, or leave it out",
}


# ------------------------------------------------------------------ finding the files
def _natural(rel: str) -> tuple:
    """``rows_0-2000/data_10.ckpt`` after ``data_9``: digits compare as numbers (text and numbers alternate)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", rel)))


def _scan(directory: Path, shown: str) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            entries = []
            for entry in it:
                entries.append(entry)
                if len(entries) > MAX_DIR_ENTRIES:
                    raise checkpoint_error(
                        CODE,
                        "the training data directory has implausibly many entries",
                        where=shown,
                        found=f"more than {MAX_DIR_ENTRIES}",
                        expected=f"<= {MAX_DIR_ENTRIES} entries per directory",
                        fix="point at the directory the tool wrote, or split it",
                    )
            return entries
    except OSError as exc:
        raise checkpoint_error(
            CODE,
            "cannot list the training data directory",
            where=shown,
            found=f"{type(exc).__name__}: {exc.strerror or exc}",
            fix="check the path and its permissions",
        ) from None


def _listing(root: Path, shown: Path) -> list[str]:
    """The files in ``root`` and in its subdirectories one level down (where SpecForge's ``rows_*`` and
    speculators' ``hidden_states`` are), as relative POSIX paths; links to directories are not followed, and a
    link to a file is listed (opening it refuses it when it leads out of ``root``)."""
    found = []
    for entry in _scan(root, str(shown)):
        if entry.is_dir(follow_symlinks=False):
            for sub in _scan(Path(entry.path), str(shown / entry.name)):
                if not sub.is_dir(follow_symlinks=False):
                    found.append(f"{entry.name}/{sub.name}")
        else:
            found.append(entry.name)
    return found


def _kinds(names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {SPECFORGE: [], SPECULATORS: [], "speculators-safetensors": []}
    for rel in names:
        base = rel.rsplit("/", 1)[-1]
        if base.endswith(_SPECFORGE_SUFFIXES):
            out[SPECFORGE].append(rel)
        elif base.endswith(_SPECULATORS_SUFFIX):
            out[SPECULATORS].append(rel)
        elif _SPECULATORS_SAFETENSORS.fullmatch(base):
            out["speculators-safetensors"].append(rel)
    return out


def _root(path: os.PathLike | str) -> tuple[Path, Path, list[str]]:
    """``(root, shown root, names)``: a directory and its listing, or a single file's directory and its name."""
    p = Path(path)
    if not p.exists():
        raise checkpoint_error(
            CODE, "the training data path does not exist", where=str(p), fix="pass the directory the tool wrote"
        )
    if p.is_dir():
        root = checked_root(p, "training data")
        return root, p, _listing(root, p)
    return checked_root(p.parent, "training data"), p.parent, [p.name]


def detect(path: os.PathLike | str) -> str | None:
    """``"specforge"`` or ``"speculators"`` from the names of the files at ``path`` (a directory, or one of its
    files); ``None`` when it holds neither, or both.  Nothing is loaded."""
    _, _, names = _root(path)
    kinds = _kinds(names)
    found = {SPECFORGE} if kinds[SPECFORGE] else set()
    if kinds[SPECULATORS] or kinds["speculators-safetensors"]:
        found.add(SPECULATORS)
    return found.pop() if len(found) == 1 else None


def _files(path: os.PathLike | str, kind: str, limit: int | None) -> tuple[Path, Path, list[str]]:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise checkpoint_error(
            CODE,
            "the number of training-data files to read must be a positive integer",
            found=repr(limit)[:40],
            expected="an integer >= 1, or no limit",
        )
    root, shown, names = _root(path)
    kinds = _kinds(names)
    if kind == SPECULATORS and not kinds[SPECULATORS] and kinds["speculators-safetensors"]:
        first = sorted(kinds["speculators-safetensors"], key=_natural)[0]
        raise checkpoint_error(
            CODE,
            "this is the data layout of speculators 0.5 and later, which this reader does not read: its loss mask "
            "lives only in the preprocessed Arrow dataset beside the hidden states",
            where=str(shown / first),
            found=f"{len(kinds['speculators-safetensors'])} hs_<i>.safetensors file(s)",
            expected="speculators 0.3/0.4 data (data_<i>.pt), SpecForge data, or a hidden_state_dump",
            fix="measure on a hidden_state_dump taken from a known-good server instead",
        )
    files = sorted(kinds[kind], key=_natural)
    _one_file_per_index(files, shown, kind)
    if not files:
        other = next((k for k in (SPECFORGE, SPECULATORS) if k != kind and kinds[k]), None)
        raise checkpoint_error(
            CODE,
            f"no {_WHAT[kind]}s here" + (f"; this looks like {other} data" if other else ""),
            where=str(shown),
            found=f"{len(names)} file(s), none named {_PATTERN[kind]}",
            expected=f"{_PATTERN[kind]} files, in the directory or one level below it",
            fix=f"read it as {other} data" if other else "pass the directory the tool wrote its output to",
        )
    return root, shown, files if limit is None else files[:limit]


def _one_file_per_index(files: list[str], shown: Path, kind: str) -> None:
    """Refuses two files of one sequence index (``data_0.ckpt`` beside ``data_0.ckpt.gz``, or in two groups)."""
    seen: dict[int, str] = {}
    for rel in files:
        m = _INDEX.fullmatch(rel.rsplit("/", 1)[-1])
        if m is None:
            continue
        other = seen.setdefault(int(m.group(1)), rel)
        if other != rel:
            raise _bad(
                str(shown / rel),
                f"two {_WHAT[kind]}s of one index",
                found=f"{other} and {rel}",
                expected="one file per sequence index",
                kind=kind,
            )


# ------------------------------------------------------------------ loading one file
def _bad(where: str, what: str, *, found: str = "", expected: str = "", kind: str) -> CheckpointError:
    return checkpoint_error(CODE, what, where=where, found=found, expected=expected, fix=_REGENERATE[kind])


def _load(root: Path, shown: Path, rel: str, kind: str) -> tuple[Any, int]:
    """The object ``torch.save`` wrote to ``root/rel`` and the file's size, read by :mod:`.torch_file`."""
    return torch_file.load(root, str(shown / rel), rel, label=_WHAT[kind], fix=_REGENERATE[kind], code=CODE)


def _bounded(where: str, length: int, width: int, kind: str, stored: int) -> None:
    """Refuses a sequence of ``length`` positions of aux ``width`` whose :class:`TargetStates` (int64 tokens, bool
    mask, float32 states) would exceed the per-sequence bound, or :data:`AMPLIFICATION` times the ``stored`` bytes
    of its file, before it is allocated."""
    nbytes = length * (9 + 4 * width)
    bound = min(MAX_SEQUENCE_BYTES, AMPLIFICATION * stored + AMPLIFICATION_SLACK)
    if nbytes > bound:
        by_file = bound < MAX_SEQUENCE_BYTES
        raise _bad(
            where,
            "the sequence is too large to measure"
            + (" from a file of its size (one stored tensor listed many times?)" if by_file else ""),
            found=f"{length} positions of {width} aux values: {nbytes} bytes as int64 ids and float32 states",
            expected=(
                f"<= {bound} bytes: {AMPLIFICATION} times the file's {stored} bytes, plus {AMPLIFICATION_SLACK}"
                if by_file
                else f"<= {MAX_SEQUENCE_BYTES} bytes per sequence (MAX_SEQUENCE_BYTES)"
            ),
            kind=kind,
        )


# ------------------------------------------------------------------ checking what was loaded
class _Record:
    """The loaded dict of one file, with the checks its entries must pass."""

    def __init__(self, payload: Any, where: str, kind: str, required: tuple[str, ...]):
        self.where, self.kind = where, kind
        if not isinstance(payload, dict):
            raise self.bad(
                f"{_WHAT[kind]} holds a {type(payload).__name__}, not a dict",
                expected=f"a dict with the keys {', '.join(required)}",
            )
        self.payload = payload
        missing = [k for k in required if k not in payload]
        if missing:
            keys = [repr(k)[:40] for k in list(payload)[:12]]
            raise self.bad(
                f"{_WHAT[kind]} lacks {', '.join(missing)}",
                found="keys: " + (", ".join(keys) + (" ..." if len(payload) > 12 else "") if keys else "none"),
                expected=f"the keys {', '.join(required)}",
            )

    def bad(self, what: str, *, found: str = "", expected: str = "") -> CheckpointError:
        return _bad(self.where, what, found=found, expected=expected, kind=self.kind)

    def tensor(self, value: Any, name: str, kind: str) -> torch.Tensor:
        """``value`` checked to be a dense CPU tensor of ``kind`` ("ids", "mask" or "float") (that its elements
        are all stored in the file, :mod:`.torch_file` has checked)."""
        import torch

        if type(value) is not torch.Tensor:  # a subclass's attributes may shadow the methods checked below
            raise self.bad(f"{name} is not a tensor", found=type(value).__name__[:80], expected="a tensor")
        if value.is_nested or value.layout != torch.strided or value.device.type != "cpu" or value.is_quantized:
            raise self.bad(
                f"{name} is not a plain dense tensor",
                found=f"layout {value.layout}, nested {value.is_nested}, device {value.device.type}, quantized "
                f"{value.is_quantized}",
                expected="a dense CPU tensor",
            )
        floating = value.is_floating_point()
        integral = not floating and not value.is_complex() and value.dtype != torch.bool
        ok = {"ids": integral, "mask": integral or value.dtype == torch.bool, "float": floating}[kind]
        if not ok:
            expected = {"ids": "an integer dtype", "mask": "an integer or bool dtype", "float": "a floating dtype"}
            raise self.bad(f"{name} has the wrong dtype", found=str(value.dtype), expected=expected[kind])
        if kind == "ids" and value.numel() and int(value.min()) < 0:
            raise self.bad(f"{name} holds negative token ids", found=f"min {int(value.min())}", expected=">= 0")
        if kind == "mask" and value.numel() and bool(((value != 0) & (value != 1)).any()):
            raise self.bad(
                f"{name} holds values other than 0 and 1",
                found=f"min {value.min().item()}, max {value.max().item()}",
                expected="0 (prompt) or 1 (response)",
            )
        if kind == "float" and not bool(torch.isfinite(value).all()):
            raise self.bad(
                f"{name} holds NaN or infinite values",
                found=f"{int((~torch.isfinite(value)).sum())} non-finite of {value.numel()}",
                expected="finite hidden states",
            )
        return value

    def row(self, key: str, kind: str) -> torch.Tensor:
        """``payload[key]`` as ``[L]`` (a ``[1, L]`` row is accepted: a batch dimension)."""
        t = self.tensor(self.payload[key], key, kind)
        if t.dim() == 2 and t.shape[0] == 1:
            t = t[0]
        if t.dim() != 1 or t.shape[0] < 1:
            raise self.bad(f"{key} has the wrong shape", found=str(list(t.shape)), expected="[L] (or [1, L]), L >= 1")
        return t

    def states(self, tokens: torch.Tensor, mask: torch.Tensor, aux: torch.Tensor, rel: str) -> TargetStates:
        import torch

        if mask.shape[0] != tokens.shape[0]:
            raise self.bad(
                "loss_mask and input_ids differ in length",
                found=f"loss_mask {mask.shape[0]}, input_ids {tokens.shape[0]}",
                expected="one mask entry per token",
            )
        if aux.shape[0] != tokens.shape[0]:
            raise self.bad(
                "the aux hidden states and input_ids differ in length",
                found=f"aux {aux.shape[0]} positions, input_ids {tokens.shape[0]}",
                expected="one aux row per token",
            )
        return TargetStates(
            tokens=tokens.to(torch.int64).contiguous(),
            aux=aux.to(torch.float32).contiguous(),
            labelled=(mask != 0).contiguous(),
            source=rel,
        )


def _specforge_states(payload: Any, where: str, rel: str, stored: int, final: bool = False) -> TargetStates:
    import torch

    if isinstance(payload, dict) and "aux_hidden_state" not in payload and "hidden_state" in payload:
        raise _bad(
            where,
            "SpecForge hidden-state file holds no aux_hidden_state, only the last layer's hidden_state: it was "
            "prepared without aux hidden states, which EAGLE-3 runs on",
            found="keys: " + ", ".join(repr(k)[:40] for k in list(payload)[:12]),
            expected="aux_hidden_state [1, L, k*H]",
            kind=SPECFORGE,
        )
    rec = _Record(payload, where, SPECFORGE, ("input_ids", "loss_mask", "aux_hidden_state"))
    tokens, mask = rec.row("input_ids", "ids"), rec.row("loss_mask", "mask")
    aux = rec.tensor(payload["aux_hidden_state"], "aux_hidden_state", "float")
    if aux.dim() == 3 and aux.shape[0] == 1:
        aux = aux[0]
    if aux.dim() != 2 or aux.shape[1] < 1:
        raise rec.bad(
            "aux_hidden_state has the wrong shape", found=str(list(aux.shape)), expected="[1, L, k*H] (or [L, k*H])"
        )
    last = _final_state(rec, payload, aux.shape[0]) if final else None
    _bounded(where, aux.shape[0], aux.shape[1] + (0 if last is None else last.shape[1]), SPECFORGE, stored)
    states = rec.states(tokens, mask, aux, rel)
    if last is not None:
        states.final = last.to(torch.float32).contiguous()
    return states


def _final_state(rec: _Record, payload: dict, length: int) -> torch.Tensor:
    """SpecForge's ``hidden_state`` as ``[L, H]``: the target's final normed state, checked."""
    if "hidden_state" not in payload:
        raise rec.bad(
            "SpecForge hidden-state file holds no hidden_state (the target's final normed state, which gives its "
            "distribution at temperature)",
            found="keys: " + ", ".join(repr(k)[:40] for k in list(payload)[:12]),
            expected="hidden_state [1, L, H] beside aux_hidden_state",
        )
    last = rec.tensor(payload["hidden_state"], "hidden_state", "float")
    if last.dim() == 3 and last.shape[0] == 1:
        last = last[0]
    if last.dim() != 2 or last.shape[0] != length or last.shape[1] < 1:
        raise rec.bad(
            "hidden_state has the wrong shape",
            found=str(list(last.shape)),
            expected=f"[1, {length}, H] (or [{length}, H]): one row per token",
        )
    return last


def _speculators_states(payload: Any, where: str, rel: str, stored: int) -> TargetStates:
    import torch

    if isinstance(payload, dict) and "aux_hidden_state" in payload:
        raise _bad(
            where,
            "this file has SpecForge's keys, not speculators'",
            found="aux_hidden_state",
            expected="hidden_states (a list of per-layer tensors)",
            kind=SPECULATORS,
        )
    rec = _Record(payload, where, SPECULATORS, ("input_ids", "hidden_states", "loss_mask"))
    tokens, mask = rec.row("input_ids", "ids"), rec.row("loss_mask", "mask")
    layers = payload["hidden_states"]
    if not isinstance(layers, (list, tuple)) or not 2 <= len(layers) <= MAX_LAYERS:
        shown = f"a {type(layers).__name__}" + (f" of {len(layers)}" if isinstance(layers, (list, tuple)) else "")
        raise rec.bad(
            "hidden_states is not a list of the captured layers' states",
            found=shown,
            expected=f"a list of 2 to {MAX_LAYERS} tensors [L, H]: the aux layers, then the last layer",
        )
    for i, t in enumerate(layers):  # shapes first: the bound below comes before any tensor's values are read
        if type(t) is not torch.Tensor:
            raise rec.bad(f"hidden_states[{i}] is not a tensor", found=type(t).__name__[:80], expected="a tensor")
        if t.dim() != 2 or t.shape != layers[0].shape or t.shape[1] < 1:
            raise rec.bad(
                f"hidden_states[{i}] has the wrong shape",
                found=f"{list(t.shape)} (hidden_states[0]: {list(layers[0].shape)})",
                expected="every layer's state [L, H], one shape",
            )
    # standardize_data_v1: the aux layers are every entry but the last (the last layer's state, the target); one
    # stored tensor listed many times is read once but concatenated as often: the result is what is bounded
    length, hidden = layers[0].shape
    _bounded(where, length, hidden * (len(layers) - 1), SPECULATORS, stored)
    checked: dict[int, torch.Tensor] = {}  # a tensor listed many times is checked once
    for i, t in enumerate(layers):
        checked.setdefault(id(t), rec.tensor(t, f"hidden_states[{i}]", "float"))
    aux = torch.empty(length, hidden * (len(layers) - 1), dtype=torch.float32)
    for i, t in enumerate(layers[:-1]):  # converted into place: no float32 copy of each layer beside the result
        aux[:, i * hidden : (i + 1) * hidden] = t
    return rec.states(tokens, mask, aux, rel)


def _read(path: os.PathLike | str, kind: str, limit: int | None, build) -> Iterator[TargetStates]:
    root, shown, files = _files(path, kind, limit)

    def sequences() -> Iterator[TargetStates]:
        width: tuple[int, str] | None = None
        for rel in files:
            where = str(shown / rel)
            payload, stored = _load(root, shown, rel, kind)
            states = build(payload, where, rel, stored)
            if width is None:
                width = (states.aux.shape[1], files[0])
            elif states.aux.shape[1] != width[0]:
                raise _bad(
                    where,
                    "the aux hidden states differ in width from the directory's first file",
                    found=f"{states.aux.shape[1]} here, {width[0]} in {width[1]}",
                    expected="one width k*H for every file (one target, one set of captured layers)",
                    kind=kind,
                )
            yield states

    return sequences()


def read_specforge(path: os.PathLike | str, *, limit: int | None = None, final: bool = False) -> Iterator[TargetStates]:
    """The sequences of SpecForge's offline training data at ``path`` (the ``--output-path`` of
    ``prepare_hidden_states.py``, or one of its files), in file-index order, at most ``limit`` files; ``final``:
    with each file's ``hidden_state`` (:attr:`TargetStates.final`; a file without it is refused).

    The directory is listed (and a bad ``limit`` refused) at the call; each file is loaded and checked as the
    iterator reaches it.
    """
    return _read(path, SPECFORGE, limit, functools.partial(_specforge_states, final=final))


def read_speculators(path: os.PathLike | str, *, limit: int | None = None) -> Iterator[TargetStates]:
    """The sequences of speculators' offline training data at ``path`` (the ``--output-dir`` of
    ``data_generation_offline.py``, v0.3/v0.4, or one of its files), in file-index order, at most ``limit`` files.

    The directory is listed (and a bad ``limit`` refused) at the call; each file is loaded and checked as the
    iterator reaches it.
    """
    return _read(path, SPECULATORS, limit, _speculators_states)
