"""A process started under `eagle3-patches run` whose Python cannot load the library never runs sglang unpatched
by accident: a banner on stderr, and sglang refuses to import (unless EAGLE3_PATCHES_ON_ERROR=warn)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from eagle3_patches._bootstrap import BOOTSTRAP_DIR

#: the interpreter this venv was made from: another Python, without eagle3-patches (or sglang) installed
OTHER_PYTHON = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def _run(extra_env: dict) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(BOOTSTRAP_DIR),
        "EAGLE3_PATCHES_APPLY": "all",
        **extra_env,
    }
    return subprocess.run(
        [OTHER_PYTHON, "-c", "import sglang"], capture_output=True, text=True, timeout=60, env=env, cwd="/"
    )


def test_another_python_refuses_sglang_with_the_reason():
    out = _run({})
    assert out.returncode != 0
    assert "bootstrap FAILED" in out.stderr and "EAGLE-3 patches NOT applied" in out.stderr
    assert "refusing to import sglang" in out.stderr and "No module named 'eagle3_patches'" in out.stderr


def test_explicit_warn_runs_on_unpatched_after_the_banner():
    out = _run({"EAGLE3_PATCHES_ON_ERROR": "warn"})
    assert "sglang runs UNPATCHED" in out.stderr
    assert "refusing to import sglang" not in out.stderr
    assert "No module named 'sglang'" in out.stderr  # the import went on (this Python has no sglang at all)
