"""The target states a draft is measured on, and the reader of this library's own ``hidden_state_dump`` shards.

A :class:`TargetStates` is one sequence: its tokens, the aux hidden states the target captured at each position
(what the draft's ``fc`` receives) and which tokens the target produced itself (the positions acceptance is
measured on).  A dump from a known-good server serving greedily is the best source: its generated tokens are the
target's own greedy choices, which is what sglang's greedy verification accepts drafts against.

Dump shards are read through the checkpoint readers' safe open (no link out of the directory, no special file)
and safetensors' own header validation; nothing is executed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.safe_io import CheckpointError, checkpoint_error, list_checkpoint_dir, open_checkpoint_file
from ..instruments.hidden_state_dump import FORMAT as DUMP_FORMAT

if TYPE_CHECKING:
    import torch

#: rows read from one dump directory at most (about 90 GiB of Kimi-K2.5 aux states in bf16: a bound, not a goal)
MAX_DUMP_ROWS = 1 << 22


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


def dump_shards(path: os.PathLike | str) -> list[str]:
    """The ``hidden_state_dump`` shard names in ``path`` (none: not a dump)."""
    return sorted(n for n in list_checkpoint_dir(path, "data") if n.startswith("shard-") and n.endswith(".safetensors"))


def read_dump(path: os.PathLike | str, *, limit: int | None = None) -> tuple[list[TargetStates], dict]:
    """The whole sequences of a ``hidden_state_dump`` directory and the dump's metadata (its ``layer_ids``).

    A sequence whose first rows are missing (a prefix served from sglang's radix cache), with a hole or a negative
    position is skipped: its states cannot be lined up.  Dumps written before the ``decoded`` tensor existed measure
    every position but the first.  ``layer_ids`` is None where the metadata holds no JSON list of ints.
    """
    import torch
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
    rows: dict[int, dict[int, tuple[int, Any, bool]]] = {}
    meta: dict = {}
    total = 0
    for name in names:
        try:
            with open_checkpoint_file(root, name, what="dump shard") as cf, safe_open(cf.library_path, "pt") as f:
                m = f.metadata() or {}
                keys = set(f.keys())
                need = {"input_ids", "positions", "seq_ids", "hidden_states"}
                if m.get("format") != DUMP_FORMAT or not need <= keys:
                    raise ValueError(
                        f"format {str(m.get('format'))[:80]!r}, tensors {sorted(keys)[:8]}: not a hidden_state_dump "
                        f"shard ({DUMP_FORMAT}, tensors {sorted(need)})"
                    )
                ids, pos, seq, hid = (f.get_tensor(k) for k in ("input_ids", "positions", "seq_ids", "hidden_states"))
                dec = f.get_tensor("decoded") if "decoded" in keys else None
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's refusal is the message
            raise _dump_error(
                "a dump shard cannot be read",
                where=str(root / name),
                found=f"{type(exc).__name__}: {exc}"[:300],
                expected="a shard written by the hidden_state_dump instrument",
                fix="dump again, or leave the file out of the directory",
            ) from None
        rows_of = (ids, pos, seq) if dec is None else (ids, pos, seq, dec)
        if not (
            ids.dim() == pos.dim() == seq.dim() == 1
            and hid.dim() == 2
            and len(ids) == len(pos) == len(seq) == len(hid)
            and not any(t.is_floating_point() or t.is_complex() for t in rows_of)
            and hid.is_floating_point()
        ) or (dec is not None and (dec.dim() != 1 or len(dec) != len(ids))):
            shown = {"input_ids": ids, "positions": pos, "seq_ids": seq, "hidden_states": hid, "decoded": dec}
            raise _dump_error(
                "a dump shard's tensors are not one row per token",
                where=str(root / name),
                found=", ".join(
                    f"{k} {str(t.dtype).replace('torch.', '')} {list(t.shape)}"
                    for k, t in shown.items()
                    if t is not None
                ),
                expected="integer input_ids, positions, seq_ids and decoded of shape [N], floating hidden_states "
                "[N, width]",
                fix="dump again",
            )
        n = len(ids)
        if meta and m.get("layer_ids") != meta.get("layer_ids"):
            raise _dump_error(
                "dump shards captured different layers",
                where=str(root / name),
                found=f"layer_ids {str(m.get('layer_ids'))[:80]}",
                expected=f"layer_ids {meta.get('layer_ids')} as the other shards",
                fix="keep one server's dump in one directory",
            )
        meta = meta or dict(m)
        total += n
        if total > MAX_DUMP_ROWS:
            raise _dump_error(
                "the dump is too large to measure at once",
                where=str(root),
                found=f"more than {MAX_DUMP_ROWS} rows",
                expected=f"at most {MAX_DUMP_ROWS} rows",
                fix="measure on a directory with fewer shards",
            )
        for i in range(n):
            d = bool(dec[i]) if dec is not None else int(pos[i]) > 0
            rows.setdefault(int(seq[i]), {}).setdefault(int(pos[i]), (int(ids[i]), hid[i], d))
    out: list[TargetStates] = []
    for sid in sorted(rows):
        r = rows[sid]
        length = max(r) + 1
        # fewer rows than positions (a hole) first: a hostile position of 2**62 builds no range list
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: past the first test the positions are at least as
        # many as 0..max and distinct, so they differ from `range(length)` only by holding a negative one, which sorts
        # first and makes the list compare lower
        if len(r) < length or sorted(r) != list(range(length)) or length < 2:
            continue  # a cached prefix, a hole or a negative position: cannot be lined up
        out.append(
            TargetStates(
                tokens=torch.tensor([r[p][0] for p in range(length)], dtype=torch.int64),
                aux=torch.stack([r[p][1] for p in range(length)]).float(),
                labelled=torch.tensor([r[p][2] for p in range(length)], dtype=torch.bool),
                source=f"{root.name}: sequence {sid}",
            )
        )
        if limit is not None and len(out) >= limit:
            break
    try:
        meta["layer_ids"] = json.loads(meta.get("layer_ids", "null"))
    except (ValueError, RecursionError):
        meta["layer_ids"] = None
    layer_ids = meta["layer_ids"]
    if not (isinstance(layer_ids, list) and all(type(i) is int for i in layer_ids)):
        meta["layer_ids"] = None  # not the writer's list of ints: the layers are unknown (not checked)
    return out, meta
