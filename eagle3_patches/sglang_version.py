"""The installed sglang version, read from package metadata (never imports sglang)."""

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
