"""Adding a patch is adding one module: the registry, `status`, the doctor and the docs pick it up.

A copy of the package gets one new file, ``patches/throwaway_fix.py``, with a preflight rule; no other
file of the copy is edited.  In a fresh interpreter on that copy: the registry lists it in its order,
``eagle3-patches status`` shows it, ``eagle3-patches doctor`` runs its rule (a note where the launch runs
under eagle3-patches), and the generated table of docs/patches.md has its row.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import eagle3_patches

THROWAWAY = '''"""throwaway_fix

Bug: a made-up one, to show what adding a patch takes.
Releases: any.  Upstream probe: none.
"""

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, Diagnostics
from ..registry import Patch


class ThrowawayFix(Patch):
    name = "throwaway_fix"
    summary = "a made-up fix that only shows up"
    module = "sglang.srt.throwaway_module_that_is_never_imported"
    applies_to = SpecifierSet(">=0.5.8")
    order = 55

    def preflight(self, setup):
        out = Diagnostics()
        if setup.algorithm == "EAGLE3":
            out.add(ERROR, "throwaway-bug", "the made-up bug would bite this launch", where="--speculative-algorithm",
                    fix="launch under eagle3-patches run")
        return out

    def patch(self, module, saver):
        saver.set(module, "fixed", True)


PATCH = ThrowawayFix()
'''

CHILD = '''
import json, sys
import eagle3_patches
from eagle3_patches.doctor import doctor
from eagle3_patches.cli import status_cmd
from eagle3_patches.patch_docs import patch_table
names = eagle3_patches.get_registry().names()
status = status_cmd.resolve_status()
plain = doctor(sys.argv[1], launch=["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3"])
under = doctor(sys.argv[1], launch=["eagle3-patches", "run", "--", "python", "-m", "sglang.launch_server",
                                    "--speculative-algorithm", "EAGLE3"])
pick = lambda r: [(f.severity, f.what) for f in r.findings if f.code == "throwaway-bug"]
print(json.dumps({"names": names, "status": {p["name"]: p["state"] for p in status["patches"]},
                  "plain": pick(plain), "under": pick(under), "table": patch_table(),
                  "file": eagle3_patches.__file__}))
'''


def test_one_new_module_is_all_a_patch_needs(tmp_path, tiny):
    package = Path(eagle3_patches.__file__).parent
    copy = tmp_path / "eagle3_patches"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "patches" / "throwaway_fix.py").write_text(THROWAWAY)
    edited = [p for p in copy.rglob("*") if p.is_file() and not (package / p.relative_to(copy)).exists()]
    assert [p.name for p in edited] == ["throwaway_fix.py"]  # one new file, nothing else touched

    out = subprocess.run([sys.executable, "-c", CHILD, str(tiny["deepseek_v3"])], capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(copy))
    names = got["names"]
    assert names.index("eagle3_draft_strict_loading") < names.index("throwaway_fix") < names.index("eagle3_fc_guard")
    assert got["status"]["throwaway_fix"] in ("pending", "not-applicable")  # its module is never imported
    assert got["plain"] == [["error", "the made-up bug would bite this launch"]]
    assert got["under"] and got["under"][0][0] == "info" and "throwaway_fix" in got["under"][0][1]
    assert "| `throwaway_fix` | a made-up fix that only shows up |" in got["table"]


def test_the_committed_patch_table_is_what_the_registries_say():
    from eagle3_patches.patch_docs import with_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "patches.md").read_text(encoding="utf-8")
    assert with_table(page) == page, "docs/patches.md is stale: run python tools/gen_docs.py"
