"""The README's quick start, run as written: its preflight block (read from README.md by mktestdocs, which finds a
Markdown file's code blocks the way its own ``check_md_file`` runs them) on the tiny Kimi-K2.5 pair put where the
README says the models are.  A README command that stops working fails here.

Why mktestdocs: it reads fenced blocks of any language (the quick start is bash; pytest-examples runs Python
blocks only) and is small and maintained.  Only the paths change: the README's ``/models/...`` become a
temporary ``models/`` directory holding the tiny checkpoints.  The install and launch blocks are not run here:
installing is what this environment's set-up did, and the launch is what tests/e2e does with these checkpoints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mktestdocs import grab_code_blocks

from eagle3_patches.testing import tiny_models as tm

README = Path(__file__).resolve().parents[2] / "README.md"


def bash_blocks() -> list[str]:
    return grab_code_blocks(README.read_text(encoding="utf-8"), lang="bash")


def test_the_quick_start_has_its_preflight_block():
    assert [b for b in bash_blocks() if b.lstrip().startswith("eagle3-patches doctor")]


def test_the_readme_preflight_passes_on_a_correct_kimi_k25_pair(tmp_path):
    (block,) = [b for b in bash_blocks() if b.lstrip().startswith("eagle3-patches doctor")]
    models = tmp_path / "models"
    tm.build_kimi_k25(models / "Kimi-K2.5")
    # the README's launch runs --tp 8: the tiny draft with 8 heads splits over 8 ranks as the real one does
    tm.build_eagle3_draft(models / "Kimi-K2.5-eagle3", tm.TinyDraftSpec(num_heads=8, num_kv_heads=8))
    assert "/models/Kimi-K2.5" in block
    script = block.replace("/models/", f"{models}/")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "with eagle3-patches (the launch is wrapped in `eagle3-patches run`)" in proc.stdout
    assert "\nOK: 0 error(s)" in proc.stdout
