"""The layers of docs/architecture.md are enforced: each import-linter contract in pyproject.toml holds on this
tree and fires on a copy with one import that breaks it; a serving process loads none of the offline tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (requirements-test.txt)"
)


def _lint(root: Path, contract: str | None = None) -> subprocess.CompletedProcess:
    args = [str(LINT_IMPORTS), "--no-cache", "--no-logo", *(["--contract", contract] if contract else [])]
    return subprocess.run(
        args,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the package and of pyproject.toml (the contracts), imported from the copy."""
    shutil.copytree(REPO / "eagle3_patches", tmp_path / "eagle3_patches", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _plant(tree: Path, module: str, code: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + "\n\n" + textwrap.dedent(code))


def test_every_contract_holds_on_this_tree(tree):
    out = _lint(tree)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "3 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(
    ("contract", "module", "code", "named"),
    [
        # a patch reaching up for the doctor (inside a function: import-linter reads those too)
        (
            "layers",
            "eagle3_patches.patches.eagle3_fc_guard",
            "def _up():\n    from ..doctor import doctor\n    return doctor\n",
            "eagle3_patches.patches is not allowed to import eagle3_patches.doctor",
        ),
        # the checkpoint readers reaching up for the registry's users
        (
            "layers",
            "eagle3_patches.checkpoint.formats",
            "from ..preflight import Setup\n",
            "eagle3_patches.checkpoint is not allowed to import eagle3_patches.preflight",
        ),
        # two modules of one package importing each other
        (
            "no-cycles",
            "eagle3_patches.checkpoint.releases",
            "def _back():\n    from . import layer_ids\n    return layer_ids\n",
            "No cycles are allowed in eagle3_patches.checkpoint",
        ),
        # an instrument asking the package root for the registries (the cycle the root used to close)
        (
            "api-on-top",
            "eagle3_patches.instruments.eagle3_probe",
            "def _root():\n    import eagle3_patches\n    return eagle3_patches.status()\n",
            "eagle3_patches.instruments.eagle3_probe -> eagle3_patches",
        ),
    ],
)
def test_each_contract_fires_on_an_import_that_breaks_it(tree, contract, module, code, named):
    _plant(tree, module, code)
    out = _lint(tree, contract)
    assert out.returncode == 1, out.stdout[-3000:]
    assert named in out.stdout, out.stdout[-3000:]


SERVING = """
import sys
import eagle3_patches
eagle3_patches.apply()
import eagle3_patches.plugin, eagle3_patches._bootstrap
for reg in eagle3_patches.registries():
    for patch in reg.patches():
        pass  # every patch and instrument module is imported by now (the registries discover them)
print(" ".join(sorted(m for m in sys.modules if m.startswith("eagle3_patches"))))
"""


def test_a_serving_process_loads_none_of_the_offline_tools():
    """What `eagle3-patches run`'s sitecustomize and the sglang plugin load: the patch set, the instruments and what
    they read; not the doctor, the converter's write path, the fork applier, the CLI, the selftest or the test kit."""
    out = subprocess.run([sys.executable, "-c", SERVING], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(out.stdout.split())
    assert {"eagle3_patches.patches.eagle3_fc_guard", "eagle3_patches.instruments.accept_watchdog"} <= loaded
    offline = {
        "eagle3_patches.doctor",
        "eagle3_patches.convert",
        "eagle3_patches.fork",
        "eagle3_patches.cli",
        "eagle3_patches.selftest",
        "eagle3_patches.testing",
        "eagle3_patches.probe_report",
        "eagle3_patches.bench",
        "eagle3_patches.patch_docs",
        "eagle3_patches.tune",
        "eagle3_patches.preflight",
    }
    assert not {m for m in loaded if m in offline or m.rsplit(".", 1)[0] in offline}, sorted(loaded)


def test_a_library_module_over_the_size_limit_says_why_at_its_top(tool, tmp_path):
    """docs/architecture.md: a module over ``MAX_LINES`` lines says at its top why it stays whole, or is split; a
    long module without the line is named, with it, not."""
    stats = tool("architecture_stats")
    s = stats.stats(REPO, REPO / "pyproject.toml")
    assert s["unexplained"] == [], f"split them, or put `# long module: <why>` first: {s['unexplained']}"

    package = tmp_path / "eagle3_patches"
    package.mkdir()
    body = "x = 1\n" * stats.MAX_LINES
    (package / "grown.py").write_text("# a comment that is not the reason\n" + body)
    (package / "kept.py").write_text("# long module: one state machine, read top to bottom\n" + body)
    (package / "short.py").write_text(body)
    assert stats.stats(tmp_path, REPO / "pyproject.toml")["unexplained"] == ["grown.py"]
