"""The target states a draft is measured on, and the reader of this library's own ``hidden_state_dump`` shards.

A :class:`TargetStates` is one sequence: its tokens, the aux hidden states the target captured at each position
(what the draft's ``fc`` receives) and which tokens the target produced itself (the positions acceptance is
measured on); where the data carry it, also the target's final normed hidden state at each position (what its
``lm_head`` turns into the next token's logits: the target's distribution, which ``measure-accept --temperature``
needs).  A dump from a known-good server serving greedily is the best source: its generated tokens are the target's
own greedy choices, which is what sglang's greedy verification accepts drafts against.

Dump shards are read through the checkpoint readers' safe open (no link out of the directory, no special file)
and their safe header reader (:func:`~eagle3_patches.checkpoint.safetensors_header.read_header`); nothing is
executed.  The reader streams: :func:`open_dump` reads every shard's header and its small per-row tensors (token
id, position, sequence id, decoded), at most :data:`MAX_DUMP_ROWS` rows in all, and checks them (one width, one
set of layer ids, no position of a sequence held twice with different tokens); :meth:`Dump.sequences` then reads
one sequence's hidden states at a time, only its rows, at most :data:`MAX_SEQUENCE_BYTES` as float32.  The final
states (``final_hidden_states``, written where ``EAGLE3_PATCHES_DUMP_FINAL_STATES`` was on) are optional: a dump
without them is read as before, and :attr:`Dump.final_width` is None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.safe_io import CheckpointError, checkpoint_error, list_checkpoint_dir, open_checkpoint_file
from ..checkpoint.safetensors_header import FLOAT_DTYPES, INT_DTYPES, Header, read_header
from ..diagnostic import first_few
from ..instruments.hidden_state_dump import FORMAT as DUMP_FORMAT

if TYPE_CHECKING:
    import torch

#: rows read from one dump directory at most (about 90 GiB of Kimi-K2.5 aux states in bf16: a bound, not a goal)
MAX_DUMP_ROWS = 1 << 22
#: one sequence's states as the draft runs on them (int64 ids, bool labels, float32 aux states) at most: 4 GiB,
#: 64k positions of Kimi-K2.5's three 7168-wide aux layers
MAX_SEQUENCE_BYTES = 4 << 30
#: a dump shard's header at most (the instrument writes five tensors and three metadata entries: a few hundred bytes)
MAX_SHARD_HEADER = 1 << 20
#: the per-row tensors of a shard, and the one of the states
_ROW_TENSORS = ("input_ids", "positions", "seq_ids")
_NEED = frozenset({*_ROW_TENSORS, "hidden_states"})
#: the optional tensor of the target's final normed hidden states, ``[N, H]``
FINAL = "final_hidden_states"
_TORCH_NAMES = {"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8", "U16": "uint16"}
_TORCH_NAMES |= {"U32": "uint32", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_TORCH_NAMES |= {"F64": "float64", "BOOL": "bool"}


def _dump_error(what: str, **kw: str) -> CheckpointError:
    return checkpoint_error("data-dump", what, **kw)


@dataclass
class TargetStates:
    """One sequence of target states: what the draft is run on."""

    #: int64 ``[L]``: the token ids
    tokens: torch.Tensor
    #: float32 ``[L, k*H]``: the aux hidden states captured at each position, concatenated in the draft's layer
    #: order: what the draft's ``fc`` receives for that position
    aux: torch.Tensor
    #: bool ``[L]``: True where ``tokens[i]`` is a token the target produced (the response: the tool's loss mask),
    #: the positions acceptance is measured on
    labelled: torch.Tensor
    #: where it came from: the file's path relative to the data directory, for messages
    source: str
    #: float32 ``[L, H]``: the target's final normed hidden state at each position (``lm_head`` of row i gives the
    #: logits of token i + 1), where the data hold it and it was asked for; else None
    final: torch.Tensor | None = None


def dump_shards(path: os.PathLike | str) -> list[str]:
    """The ``hidden_state_dump`` shard names in ``path`` (none: not a dump)."""
    return sorted(n for n in list_checkpoint_dir(path, "data") if n.startswith("shard-") and n.endswith(".safetensors"))


def _unreadable(root: Path, name: str, found: str) -> CheckpointError:
    return _dump_error(
        "a dump shard cannot be read",
        where=str(root / name),
        found=found[:300],
        expected="a shard written by the hidden_state_dump instrument",
        fix="dump again, or leave the file out of the directory",
    )


def _header(root: Path, name: str) -> Header:
    """The shard's validated header, refused where it is not the instrument's (format, tensors, size)."""
    try:
        h = read_header(root / name, root=root)
    except CheckpointError as exc:
        if exc.code == "unsafe-file":
            raise
        raise _unreadable(root, name, f"{exc.what}: {exc.found}") from None
    m, keys = h.metadata, set(h.names)
    if m.get("format") != DUMP_FORMAT or not _NEED <= keys:
        raise _unreadable(
            root,
            name,
            f"ValueError: format {str(m.get('format'))[:80]!r}, tensors {sorted(keys)[:8]}: not a hidden_state_dump "
            f"shard ({DUMP_FORMAT}, tensors {sorted(_NEED)})",
        )
    if h.header_len > MAX_SHARD_HEADER:
        raise _unreadable(root, name, f"a header of {h.header_len} bytes (at most {MAX_SHARD_HEADER} for a shard)")
    return h


def _check_rows(root: Path, name: str, h: Header) -> int:
    """The shard's row count, after its tensors are checked to be one row per token (from the header alone)."""
    t = h.tensors
    dec = t.get("decoded")
    rows = [t[k] for k in _ROW_TENSORS] + ([dec] if dec is not None else [])
    hid = t["hidden_states"]
    n = t["input_ids"].shape[0] if len(t["input_ids"].shape) == 1 else -1
    ok = (
        all(len(r.shape) == 1 and r.shape[0] == n for r in rows)
        and all(r.dtype in INT_DTYPES for r in rows[:3])
        and (dec is None or dec.dtype in INT_DTYPES | {"BOOL"})
        and all(
            len(h.shape) == 2 and h.shape[0] == n and h.shape[1] >= 1 and h.dtype in FLOAT_DTYPES
            for h in (hid, t.get(FINAL, hid))
        )
    )
    if not ok:
        shown = {k: t.get(k) for k in ("input_ids", "positions", "seq_ids", "hidden_states", "decoded", FINAL)}
        raise _dump_error(
            "a dump shard's tensors are not one row per token",
            where=str(root / name),
            found=", ".join(
                f"{k} {_TORCH_NAMES.get(i.dtype, i.dtype)} {list(i.shape)}" for k, i in shown.items() if i is not None
            ),
            expected="integer input_ids, positions, seq_ids and decoded of shape [N], floating hidden_states "
            f"[N, width] (width >= 1) and {FINAL} [N, H] where present",
            fix="dump again",
        )
    return n


def _layer_ids(root: Path, name: str, m: dict) -> list[int] | None:
    """The shard's ``layer_ids``: None where the metadata records none, else a JSON list of ints or refused."""
    raw = m.get("layer_ids")
    if raw is None:
        return None
    try:
        ids = json.loads(raw) if len(raw) <= 64 << 10 else None
    except (ValueError, RecursionError):
        ids = None
    if not (isinstance(ids, list) and 1 <= len(ids) <= 1024 and all(type(i) is int and 0 <= i < 1 << 20 for i in ids)):
        raise _dump_error(
            "the dump's layer_ids are not a list of layer numbers",
            where=str(root / name),
            found=f"layer_ids {raw[:80]!r}" + (" ..." if len(raw) > 80 else ""),
            expected="a JSON list of 1 to 1024 integer layer ids, as the hidden_state_dump instrument writes them",
            fix="dump again with EAGLE3_PATCHES_DUMP_LAYER_IDS set to the draft's ids",
        )
    return ids


def shown_ids(ids: object) -> str:
    """A list of layer ids for a message: its first 8, then ``...`` and the count."""
    if not isinstance(ids, list):
        return str(ids)[:80]
    return "[" + first_few((str(i) for i in ids), 8) + "]" + (f" ({len(ids)} ids)" if len(ids) > 8 else "")


@dataclass
class Dump:
    """A checked ``hidden_state_dump`` directory (:func:`open_dump`): its index, its layer ids and its width."""

    root: Path
    shards: list[Header]
    layer_ids: list[int] | None
    width: int
    #: the width of the final states where every shard holds them (one width), else None
    final_width: int | None
    #: per kept row, sorted by (sequence, position): shard number, row in the shard, token id, decoded
    _shard: Any
    _row: Any
    _token: Any
    _decoded: Any
    #: (sequence id, first kept row, rows) of each sequence whose positions are 0..n-1, n >= 2, in id order
    whole: list[tuple[int, int, int]]

    def sequences(
        self, *, max_sequences: int | None = None, max_tokens: int | None = None, final: bool = False
    ) -> Iterator[TargetStates]:
        """The whole sequences, one at a time in the order of their ids, their states read from disk as reached;
        at most ``max_sequences``, and none after the one at which ``max_tokens`` tokens were read.  ``final``: their
        final states too (:attr:`final_width` must not be None)."""
        if final and self.final_width is None:
            raise ValueError("this dump holds no final hidden states")
        tokens = 0
        for count, (sid, start, n) in enumerate(self.whole):
            if (max_sequences is not None and count >= max_sequences) or (
                max_tokens is not None and tokens >= max_tokens
            ):
                return
            tokens += n
            yield self._read(sid, start, n, final)

    def _read(self, sid: int, start: int, n: int, final: bool = False) -> TargetStates:
        import torch
        from safetensors import safe_open

        width = self.width + ((self.final_width or 0) if final else 0)
        need = n * (9 + 4 * width)
        where = f"{self.root.name}: sequence {sid}"
        if need > MAX_SEQUENCE_BYTES:
            raise _dump_error(
                "a dumped sequence is too large to measure",
                where=where,
                found=f"{n} positions of width {width}: {need} bytes as int64 ids and float32 states",
                expected=f"<= {MAX_SEQUENCE_BYTES} bytes per sequence (MAX_SEQUENCE_BYTES)",
                fix="measure a dump of shorter requests",
            )
        shard, row = self._shard[start : start + n], self._row[start : start + n]
        aux = torch.empty(n, self.width, dtype=torch.float32)
        last = torch.empty(n, self.final_width or 0, dtype=torch.float32) if final else None
        # runs of consecutive rows of one shard: one read each
        cut = [0] + [i for i in range(1, n) if shard[i] != shard[i - 1] or row[i] != row[i - 1] + 1] + [n]
        for a, b in zip(cut, cut[1:]):
            h = self.shards[int(shard[a])]
            try:
                with open_checkpoint_file(self.root, h.file, what="dump shard") as cf:
                    if cf.size != h.file_size:
                        raise ValueError(f"the file changed size since it was indexed ({h.file_size} -> {cf.size})")
                    with safe_open(cf.library_path, "pt") as f:
                        aux[a:b] = f.get_slice("hidden_states")[int(row[a]) : int(row[b - 1]) + 1].float()
                        if last is not None:
                            last[a:b] = f.get_slice(FINAL)[int(row[a]) : int(row[b - 1]) + 1].float()
            except CheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - the library's refusal is the message
                raise _unreadable(self.root, h.file, f"{type(exc).__name__}: {exc}") from None
        return TargetStates(
            tokens=torch.from_numpy(self._token[start : start + n].copy()),
            aux=aux,
            labelled=torch.from_numpy(self._decoded[start : start + n].copy()),
            source=where,
            final=last,
        )


def open_dump(path: os.PathLike | str) -> Dump:
    """The checked index of a ``hidden_state_dump`` directory (module docstring); no hidden state is read.

    A sequence whose first rows are missing (a prefix served from sglang's radix cache), with a hole or a negative
    position is left out: its states cannot be lined up.  Dumps written before the ``decoded`` tensor existed measure
    every position but the first.
    """
    import numpy as np
    from safetensors import safe_open

    root = Path(path)
    names = dump_shards(root)
    if not names:
        raise _dump_error(
            "no hidden_state_dump shards",
            where=str(root),
            found="no shard-*.safetensors file",
            expected="the directory EAGLE3_PATCHES_DUMP_DIR pointed at",
            fix="dump a known-good server's states (docs/e2e.md) or pass training data",
        )
    headers: list[Header] = []
    total, layer_ids, width = 0, None, None
    finals: set[int | None] = set()  # the final states' width of each shard (None: it has none)
    for name in names:
        h = _header(root, name)
        n = _check_rows(root, name, h)
        ids = _layer_ids(root, name, h.metadata)
        if headers and ids != layer_ids:
            raise _dump_error(
                "dump shards captured different layers",
                where=str(root / name),
                found=f"layer_ids {shown_ids(ids)}",
                expected=f"layer_ids {shown_ids(layer_ids)} as {headers[0].file}",
                fix="keep one server's dump in one directory",
            )
        w = h.tensors["hidden_states"].shape[1]
        if width is not None and w != width:
            raise _dump_error(
                "dump shards hold hidden states of different widths",
                where=str(root / name),
                found=f"width {w}",
                expected=f"width {width} as {headers[0].file}",
                fix="keep one server's dump in one directory",
            )
        fw = h.tensors[FINAL].shape[1] if FINAL in h.tensors else None
        if fw is not None and any(f not in (None, fw) for f in finals):
            raise _dump_error(
                "dump shards hold final hidden states of different widths",
                where=str(root / name),
                found=f"{FINAL} width {fw}",
                expected=f"width {next(f for f in finals if f is not None)}, as the shards before it",
                fix="keep one server's dump in one directory",
            )
        finals.add(fw)
        total += n
        if total > MAX_DUMP_ROWS:
            raise _dump_error(
                "the dump is too large to measure at once",
                where=str(root),
                found=f"more than {MAX_DUMP_ROWS} rows",
                expected=f"at most {MAX_DUMP_ROWS} rows (MAX_DUMP_ROWS)",
                fix="measure on a directory with fewer shards",
            )
        headers.append(h)
        layer_ids, width = ids, w
    cols: dict[str, list] = {"tok": [], "pos": [], "seq": [], "dec": [], "shard": [], "row": []}
    for i, h in enumerate(headers):
        try:
            with open_checkpoint_file(root, h.file, what="dump shard") as cf, safe_open(cf.library_path, "np") as f:
                got = {k: f.get_tensor(k).astype(np.int64) for k in _ROW_TENSORS}
                dec = f.get_tensor("decoded") != 0 if "decoded" in h.names else got["positions"] > 0
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's refusal is the message
            raise _unreadable(root, h.file, f"{type(exc).__name__}: {exc}") from None
        n = len(got["input_ids"])
        for key, value in (("tok", got["input_ids"]), ("pos", got["positions"]), ("seq", got["seq_ids"])):
            cols[key].append(value)
        cols["dec"].append(dec)
        cols["shard"].append(np.full(n, i, dtype=np.int32))
        cols["row"].append(np.arange(n, dtype=np.int64))
    tok, pos, seq, dec, shard, row = (np.concatenate(cols[k]) for k in ("tok", "pos", "seq", "dec", "shard", "row"))
    order = np.lexsort((np.arange(len(tok)), pos, seq))  # by sequence, then position, then where it was read
    tok, pos, seq, dec, shard, row = (a[order] for a in (tok, pos, seq, dec, shard, row))
    same = (seq[1:] == seq[:-1]) & (pos[1:] == pos[:-1])  # a row held twice: kept once where both agree
    clash = np.flatnonzero(same & (tok[1:] != tok[:-1]))
    if len(clash):
        i = int(clash[0])
        raise _dump_error(
            "two dump rows of one sequence and position hold different tokens",
            where=str(root / headers[int(shard[i + 1])].file),
            found=f"sequence {int(seq[i])} position {int(pos[i])}: token {int(tok[i])} in "
            f"{headers[int(shard[i])].file}, {int(tok[i + 1])} in {headers[int(shard[i + 1])].file}",
            expected="one token per position of a sequence (one server's dump, each sequence id used once)",
            fix="keep one server's dump in one directory",
        )
    keep = np.concatenate([[True], ~same]) if len(tok) else np.zeros(0, dtype=bool)
    tok, pos, seq, dec, shard, row = (a[keep] for a in (tok, pos, seq, dec, shard, row))
    starts = np.flatnonzero(np.concatenate([[True], seq[1:] != seq[:-1]])) if len(seq) else np.zeros(0, dtype=int)
    ends = np.append(starts[1:], len(seq))
    whole = [
        (int(seq[a]), int(a), int(b - a))
        for a, b in zip(starts, ends)
        if b - a >= 2 and pos[a] == 0 and pos[b - 1] == b - a - 1  # unique sorted positions: 0..n-1 exactly
    ]
    final_width = finals.pop() if len(finals) == 1 else None  # every shard, one width; else none to read
    return Dump(root, headers, layer_ids, int(width or 0), final_width, shard, row, tok, dec, whole)


def read_dump(path: os.PathLike | str, *, limit: int | None = None) -> tuple[list[TargetStates], dict]:
    """The whole sequences of a dump (at most ``limit``) and its metadata ``{"layer_ids": ...}``, read at once."""
    dump = open_dump(path)
    return list(dump.sequences(max_sequences=limit)), {"layer_ids": dump.layer_ids}
