"""A checkpoint's content digest: what tells two copies of one draft from two drafts.

Two servers that must run the same draft (the prefill and the decode side of a disaggregated pair) may name it by
two paths on two nodes.  The digest is the SHA-256 of ``config.json`` and of every safetensors file the checkpoint
serves (by name, size and contents, in name order), read through :mod:`.safe_io` (no link followed out of the
checkpoint, no device file opened) in fixed-size chunks: memory stays at one chunk whatever the size.  Reading the
weights whole is the cost: a draft is one decoder layer (about 2 GB for Kimi-K2.5's), seconds from a local disk.
"""

from __future__ import annotations

import hashlib
import os

from .formats import checkpoint_dir, list_weight_files
from .safe_io import open_checkpoint_file
from .safetensors_header import count_read

#: bytes read at a time
CHUNK = 16 << 20


def checkpoint_digest(path: os.PathLike | str, role: str = "checkpoint") -> str:
    """The hex SHA-256 of the checkpoint at ``path`` (see the module docstring); raises
    :class:`~.safe_io.CheckpointError` for an unreadable or unsafe file."""
    d = checkpoint_dir(path, role)
    names = ["config.json", *sorted(str(f.relative_to(d)) for f in list_weight_files(d).files)]
    h = hashlib.sha256()
    for name in names:
        with open_checkpoint_file(d, name, what=f"{role} file") as f:
            h.update(f"{name}\0{f.size}\0".encode())
            offset = 0
            while offset < f.size:
                block = f.read_at(offset, min(CHUNK, f.size - offset))
                if not block:
                    break  # shrank after the stat: the digest differs from a whole copy's, as it should
                h.update(block)
                offset += len(block)
            count_read(offset)
    return h.hexdigest()
