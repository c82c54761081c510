"""What every part of the fork path shares: its error, and the digest its checksums are made of."""

from __future__ import annotations

import hashlib

from ..errors import Eagle3Error


class ForkError(Eagle3Error):
    """The series cannot be applied to (or reverted from) this sglang tree; nothing was changed."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
