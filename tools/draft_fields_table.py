#!/usr/bin/env python3
"""Observe which sglang release first reads each draft config field that changes the draft's math
(eagle3_patches.checkpoint.draft_fields.MATH_FIELDS), from the released wheels' own draft modules: llama_eagle3.py
(FIRST_READ) and the MLA draft's kimi_k25_eagle3.py (MLA_FIRST_READ; a release without the file reads nothing there).

    python tools/draft_fields_table.py                     # the releases of the full matrix; prints both tables
    python tools/draft_fields_table.py --check             # exit 1 when draft_fields' tables differ
    python tools/draft_fields_table.py --releases 0.5.16,0.5.17

Each wheel is downloaded once (``pip download --no-deps`` into .matrix/wheels, as tools/matrix.py keeps them);
only the draft modules are read from it, parsed, never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle3_patches.checkpoint import draft_fields as F  # noqa: E402
from eagle3_patches.checkpoint.releases import parse_version, rel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".matrix" / "wheels"


def wheel(version: str) -> Path:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(WHEELS)]
        subprocess.run(cmd, check=True)
        found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    return found[0]


def names_read(version: str, module: str = F.DRAFT_MODULE) -> frozenset[str]:
    with zipfile.ZipFile(wheel(version)) as z:
        if "sglang/" + module not in z.namelist():
            return frozenset()  # a release without the module (the MLA draft's before 0.5.12)
        source = z.read("sglang/" + module).decode("utf-8")
    return F.fields_read(source) & set(F.candidate_names())


def release_tuple(version: str) -> tuple[int, int, int]:
    return rel(parse_version(version))


def observe(versions: list[str], module: str = F.DRAFT_MODULE) -> dict[str, tuple[int, int, int]]:
    first: dict[str, tuple[int, int, int]] = {}
    for v in sorted(versions, key=release_tuple):
        for name in sorted(names_read(v, module)):
            first.setdefault(name, release_tuple(v))
    return dict(sorted(first.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", help="comma list (default: the full matrix's releases, tools/matrix_releases.json)")
    ap.add_argument("--check", action="store_true", help="exit 1 when draft_fields' tables differ")
    args = ap.parse_args(argv)
    if args.releases:
        versions = args.releases.split(",")
    else:
        sys.path.insert(0, str(ROOT / "tools"))
        import matrix

        data = matrix.load_data()
        versions = matrix.resolve_releases(data["full"], data, newest="known")
    differs = []
    for module, table in F.FIRST_READ_BY_MODULE.items():
        seen = observe(versions, module)
        print(module, json.dumps({k: ".".join(map(str, v)) for k, v in seen.items()}, indent=2))
        if seen != table:
            differs.append(module)
    if args.check and differs:
        print(
            f"eagle3_patches/checkpoint/draft_fields.py: the table of {', '.join(differs)} differs from the wheels "
            "(above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
