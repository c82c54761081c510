"""A checkpoint's content digest: what tells two copies of one draft from two drafts.

Two servers that must run the same draft (the prefill and the decode side of a disaggregated pair) may name it by
two paths on two nodes.  The digest is the SHA-256 of ``config.json`` and of every safetensors file the checkpoint
serves (by name, size and contents, in name order), read through :mod:`.safe_io` (no link followed out of the
checkpoint, no device file opened) in fixed-size chunks: memory stays at one chunk whatever the size.  Reading the
weights whole is the cost: a draft is one decoder layer (about 2 GB for Kimi-K2.5's), seconds from a local disk.

``blocks=N`` reads, of each safetensors file, its first :data:`HEAD` bytes (the header and the first tensors) and
``N`` blocks of :data:`BLOCK` bytes evenly spaced through the rest: a few hundred KB whatever the size, what a
serving process can afford at its first request.  Two trainings of one architecture differ in every block; a copy
differs in none.  A digest is comparable only with one read the same way.
"""

from __future__ import annotations

import hashlib
import os

from .formats import checkpoint_dir, list_weight_files
from .safe_io import open_checkpoint_file
from .safetensors_header import count_read

#: bytes read at a time
CHUNK = 16 << 20
#: with ``blocks``: the bytes read from the start of each weight file, and the size of each sampled block
HEAD = 64 << 10
BLOCK = 4 << 10


def checkpoint_digest(path: os.PathLike | str, role: str = "checkpoint", *, blocks: int | None = None) -> str:
    """The hex SHA-256 of the checkpoint at ``path`` (see the module docstring); raises
    :class:`~.safe_io.CheckpointError` for an unreadable or unsafe file."""
    d = checkpoint_dir(path, role)
    names = ["config.json", *sorted(str(f.relative_to(d)) for f in list_weight_files(d).files)]
    h = hashlib.sha256(b"" if blocks is None else f"sampled {blocks}\0".encode())
    for name in names:
        with open_checkpoint_file(d, name, what=f"{role} file") as f:
            h.update(f"{name}\0{f.size}\0".encode())
            sampled = blocks is not None and name != "config.json"
            for offset, n in _spans(f.size, blocks) if sampled else _spans(f.size, None):
                block = f.read_at(offset, n)
                h.update(block)
                count_read(len(block))
                if len(block) < n:
                    break  # shrank after the stat: the digest differs from a whole copy's, as it should
    return h.hexdigest()


def _spans(size: int, blocks: int | None) -> list[tuple[int, int]]:
    """The (offset, length) reads of a file of ``size`` bytes: the whole of it in :data:`CHUNK` pieces, or its head
    and ``blocks`` evenly spaced blocks."""
    if blocks is None or size <= HEAD + blocks * BLOCK:
        return [(o, min(CHUNK, size - o)) for o in range(0, size, CHUNK)]
    step = (size - HEAD - BLOCK) // max(1, blocks - 1) if blocks > 1 else 0
    return [(0, HEAD), *((HEAD + i * step, BLOCK) for i in range(blocks))]
