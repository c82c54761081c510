"""The installed sglang version, read from package metadata (never imports sglang), and the one normalisation
of a version to the release it behaves as (:func:`base_release`)."""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version


def installed_sglang_version() -> Version | None:
    try:
        return Version(metadata.version("sglang"))
    except metadata.PackageNotFoundError:
        return None
    except InvalidVersion:  # pragma: no cover - a broken install
        return None


def base_release(version: Version) -> Version:
    """The release ``version`` behaves as: its first three release numbers, padded with zeros (``0.5.10.post1`` is
    ``0.5.10``, ``0.5.13rc1`` is ``0.5.13``, ``0.6`` is ``0.6.0``).  Every comparison of an sglang version with a
    release, a range or a table goes through it."""
    return Version(".".join(map(str, (*version.release, 0, 0)[:3])))
