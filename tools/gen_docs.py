#!/usr/bin/env python3
"""Regenerate the generated parts of docs/ from the code: the patch table and the per-patch sections of docs/patches.md.

python tools/gen_docs.py           # rewrite docs/patches.md's table (registries) and sections (module docstrings)
python tools/gen_docs.py --check   # exit 1 when the committed page differs (what the tests check)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle3_patches.patch_docs import generated  # noqa: E402

PAGE = Path(__file__).resolve().parent.parent / "docs" / "patches.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when the page is stale")
    args = ap.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    try:
        new = generated(page)
    except ValueError as exc:  # a patch module that does not document itself, or a page without the markers
        print(f"gen_docs: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if new != page:
            print(f"{PAGE} is stale: run python tools/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
