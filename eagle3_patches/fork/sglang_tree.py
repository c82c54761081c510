"""The sglang tree a series is applied to: where it is (found without importing sglang), and which release
it is."""

from __future__ import annotations

import re
from pathlib import Path

from .common import ForkError


def default_sglang_root() -> Path:
    """The installed sglang package directory, found without importing sglang."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or spec.origin in ("namespace", "built-in"):
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if len(locations) == 1:
            # pragma: no mutate core/NumberReplacer `-1`: under `len(locations) == 1`: the first entry is the last
            return Path(locations[0])
        raise ForkError(
            "eagle3-patches: sglang is not installed in this Python environment; pass --sglang-root PATH "
            "(the sglang package directory: site-packages/sglang, or python/sglang in a git checkout)"
        )
    return Path(spec.origin).resolve().parent


def check_sglang_root(root: Path) -> Path:
    root = Path(root)
    if (root / "srt").is_dir() and (root / "version.py").is_file():
        return root
    for hint in (root / "python" / "sglang", root / "sglang"):
        if (hint / "srt").is_dir():
            raise ForkError(
                f"eagle3-patches: {root} is not the sglang package directory; did you mean --sglang-root {hint}?"
            )
    raise ForkError(
        f"eagle3-patches: {root} is not an sglang package directory (expected srt/ and version.py in it: "
        "site-packages/sglang, or python/sglang in a git checkout)"
    )


_VERSION_RE = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.M)


def sglang_tree_version(root: Path) -> tuple[str | None, str]:
    """(version, where it was read) for the tree at ``root``; (None, why) when it records none."""
    generated = root / "_version.py"
    if generated.is_file():
        m = _VERSION_RE.search(generated.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1), str(generated)
    for info in sorted(root.parent.glob("sglang-*.dist-info")):
        meta = info / "METADATA"
        if meta.is_file():
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip(), str(meta)
    return None, f"no {generated.name} and no sglang-*.dist-info next to {root}"
