"""The sglang plugin entry point (sglang >= 0.5.11 calls it in each of its processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.releases import only_release

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, sys
from eagle3_patches import plugin
plugin.activate()   # what sglang.srt.plugins.load_plugins() does in each process
import eagle3_patches
from eagle3_patches import cpu
print(json.dumps({"states": {n: s.state.value for n, s in eagle3_patches.status().items()},
                  "sglang_imported": any(m == "sglang" or m.startswith("sglang.") for m in sys.modules),
                  "cpu_profile": cpu.is_active() or bool(os.environ.get("SGLANG_USE_CPU_ENGINE"))}))
"""


def _activate(env: dict) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_PATCHES_", "SGLANG_"))}
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "PYTHONPATH": str(ROOT), **env},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_plugin_selects_the_patch_set_lazily_and_never_the_cpu_profile():
    got = _activate({})
    import eagle3_patches

    assert {n: s for n, s in got["states"].items() if n in eagle3_patches.get_registry().names()} == {
        n: "pending" for n in eagle3_patches.get_registry().names()
    }
    assert got["states"]["eagle3_probe"] == "not-selected"
    assert not got["sglang_imported"] and not got["cpu_profile"]


def test_the_plugin_follows_the_instruments_settings():
    assert _activate({"EAGLE3_PATCHES_PROBE": "1"})["states"]["eagle3_probe"] == "pending"


@pytest.mark.parametrize(
    "env, state", [({"EAGLE3_PATCHES_PLUGIN": "0"}, "not-selected"), ({"EAGLE3_PATCHES_DISABLE": "all"}, "disabled")]
)
def test_the_documented_off_switches(env, state):
    got = _activate(env)
    assert set(got["states"].values()) == {state} | ({"not-selected"} if state == "disabled" else set())


def test_pyproject_registers_the_entry_point_sglang_discovers():
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    from eagle3_patches import plugin

    assert eps[plugin.GROUP] == {plugin.ENTRY_POINT: "eagle3_patches.plugin:activate"}


@pytest.mark.sglang
@only_release(">=0.5.11", "sglang.srt.plugins arrived in 0.5.11")
def test_sglangs_own_load_plugins_runs_it():
    """sglang >= 0.5.11: its ``load_plugins()`` (what the launcher, Engine and every scheduler call) finds the
    entry point of the installed distribution and applies the patch set; 0.5.9 / 0.5.10 have no plugins."""
    # sglang's package import pulls in torchvision / sgl_kernel at module level (0.5.11: sglang.srt.utils.common):
    # on a machine without them the CPU profile's import-only stand-ins go in first (none where the real one imports)
    code = (
        "import json, eagle3_patches\nfrom eagle3_patches.cpu.stubs import install_stubs\ninstall_stubs()\n"
        "from sglang.srt.plugins import load_plugins\nload_plugins()\n"
        "print(json.dumps({n: s.state.value for n, s in eagle3_patches.status().items()}))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_PATCHES_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=base)
    assert out.returncode == 0, out.stderr[-3000:]
    states = json.loads(out.stdout.strip().splitlines()[-1])
    assert states["eagle3_fc_guard"] in ("pending", "applied") and states["eagle3_probe"] == "not-selected"


@pytest.mark.parametrize(
    "configure, expected",
    [
        ("", "[INFO] eagle3-patches: active in pid"),  # sglang 0.5.11's launcher and schedulers: logging not set up yet
        (
            "import logging; logging.basicConfig(level=logging.INFO)\n",
            "INFO:eagle3_patches:eagle3-patches: active in pid",
        ),
        # 0.5.23's launcher: an import leaves the root logger at WARNING, and --log-level is applied after the plugins
        ("import logging; logging.basicConfig(level=logging.WARNING)\n", "[INFO] eagle3-patches: active in pid"),
    ],
)
def test_every_process_says_what_it_runs_whether_or_not_logging_is_set_up(configure, expected):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_PATCHES_", "SGLANG_"))}
    out = subprocess.run(
        [sys.executable, "-c", configure + CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in out.stderr.splitlines() if "active in pid" in line]
    assert len(said) == 1 and said[0].startswith(expected) and "eagle3_fc_guard=pending" in said[0], out.stderr


@pytest.mark.parametrize("spelling", ["0", "false", "False", "no", "off", "OFF", " off "])
def test_every_spelling_of_off_switches_the_plugin_off(spelling):
    """EAGLE3_PATCHES_PLUGIN as a user writes "off" (settings.OFF, any case): the plugin selects nothing."""
    got = _activate({"EAGLE3_PATCHES_PLUGIN": spelling})
    assert set(got["states"].values()) == {"not-selected"}


@pytest.mark.parametrize("spelling", ["", "1", "true", "yes", "on", "ON"])
def test_every_spelling_of_on_leaves_the_plugin_on(spelling):
    got = _activate({"EAGLE3_PATCHES_PLUGIN": spelling})
    assert got["states"]["eagle3_fc_guard"] == "pending"


#: a patch whose sglang module is already imported lands at once, inside plugin.activate(); this one fails there
FAILING = """
import sys, types
from eagle3_patches import plugin
from eagle3_patches.patches import kimi_k25_eagle3_delegation as target
module = types.ModuleType(target.PATCH.module)  # the one patch on that module
sys.modules[module.__name__] = module            # imported before the plugin runs: the patch lands at once
from packaging.specifiers import SpecifierSet
target.PATCH.applies_to = SpecifierSet()         # every release, the newest included (0.5.23 carries this fix)
target.PATCH.upstream = lambda module: None
target.PATCH.check = lambda module: None
def broken(module, saver):
    raise RuntimeError("made to fail")
target.PATCH.patch = broken
plugin.activate()   # what sglang.srt.plugins.load_plugins() does; it catches Exception, not SystemExit
import eagle3_patches
print("still running:", eagle3_patches.status()["kimi_k25_eagle3_delegation"].state.value)
"""


def _activate_failing(env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_PATCHES_", "SGLANG_"))}
    return subprocess.run(
        [sys.executable, "-c", FAILING],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "PYTHONPATH": str(ROOT), **env},
    )


@pytest.mark.parametrize("spelling", ["raise", "RAISE", " Raise "])
def test_on_error_raise_stops_the_process_through_the_plugin(spelling):
    """sglang's load_plugins() swallows a plugin's exceptions; with EAGLE3_PATCHES_ON_ERROR=raise (any case) the
    plugin exits the process instead, naming the patch that failed."""
    out = _activate_failing({"EAGLE3_PATCHES_ON_ERROR": spelling})
    assert out.returncode != 0
    assert "still running" not in out.stdout
    assert "patch 'kimi_k25_eagle3_delegation' failed: RuntimeError: made to fail" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("env", [{}, {"EAGLE3_PATCHES_ON_ERROR": "warn"}])
def test_by_default_a_failed_patch_is_logged_and_the_process_runs_unpatched(env):
    out = _activate_failing(env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "still running: failed" in out.stdout
    assert "sglang runs WITHOUT eagle3-patches" in out.stderr
