#!/usr/bin/env python3
"""Apply the eagle3-patches fork-path series to an sglang tree: the same as `eagle3-patches apply`.

    python tools/apply_patches.py [--sglang-root PATH] [--check] [--revert] [--series NAME]

Usable from a source checkout without installing eagle3-patches (see docs/fork.md).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle3_patches.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["apply", *sys.argv[1:]]))
