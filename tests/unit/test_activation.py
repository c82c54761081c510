"""Activation in every process: `eagle3-patches run`, the bootstrap sitecustomize, spawn children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support.releases import requires_patch, stock_bug

CLI = [sys.executable, "-m", "eagle3_patches"]


def _run(args, env=None, timeout=300, **kw):
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, **kw
    )


def test_import_is_cheap_and_never_imports_sglang_or_torch():
    code = (
        "import sys, eagle3_patches, eagle3_patches.registry, eagle3_patches.cli;"
        "eagle3_patches.apply(); print(sorted(m for m in ('sglang', 'torch') if m in sys.modules))"
    )
    out = _run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


SPAWN_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing as mp, os

    def child(q):
        from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
        import eagle3_patches
        q.put({"pid": os.getpid(),
               "has_hook": "set_eagle3_layers_to_capture" in vars(KimiK25ForConditionalGeneration),
               "state": eagle3_patches.status()["kimi_k25_eagle3_delegation"].state.value})

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")   # as sglang starts its scheduler and TP workers
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start(); result = q.get(timeout=240); p.join()
        result["parent_pid"] = os.getpid()
        print(json.dumps(result))
    """
)


@pytest.mark.sglang
@requires_patch("kimi_k25_eagle3_delegation")  # the child checks that patch's hook
def test_run_reaches_a_spawned_child(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(SPAWN_SCRIPT)
    out = _run([*CLI, "run", "--cpu-profile", "--", sys.executable, str(script)])
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pid"] != result["parent_pid"]
    assert result == {**result, "has_hook": True, "state": "applied"}


@pytest.mark.sglang
@stock_bug("kimi_k25_eagle3_delegation")
def test_without_run_a_spawned_child_is_stock(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(SPAWN_SCRIPT)
    out = _run(
        [*CLI, "run", "--cpu-profile", "--disable", "kimi_k25_eagle3_delegation", "--", sys.executable, str(script)]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["has_hook"] is False and result["state"] == "disabled"


def test_bootstrap_chains_to_an_existing_sitecustomize(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    code = "import os, sys; print(os.environ.get('OTHER_SITECUSTOMIZE_RAN'), 'eagle3_patches' in sys.modules)"
    out = _run([*CLI, "run", "--", sys.executable, "-c", code], env={"PYTHONPATH": str(other)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"]


@pytest.mark.parametrize(
    "args, needle, code",
    [
        (["run"], "no command given", 2),
        (["run", "--only", "nope", "--", "true"], "unknown patch 'nope'", 2),
        (["run", "--disable", "nope", "--", "true"], "unknown patch 'nope'", 2),
        (["run", "--probe", "touch", "ran"], "--probe took 'touch' as the directory", 2),
        (["run", "--", "/nonexistent/binary"], "cannot start", 1),
    ],
)
def test_run_user_errors_are_messages_not_tracebacks(args, needle, code, tmp_path):
    """A command line that cannot be run as given is a usage error (exit 2, run's own usage line); a command
    that cannot be started is the user's mistake (exit 1); neither prints a traceback or starts anything."""
    out = _run([*CLI, *args], cwd=tmp_path)
    assert out.returncode == code, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("usage: eagle3-patches run") == (code == 2)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("probe", [["--probe"], ["--probe=probe-dir"], ["--probe", "probe-dir"]])
def test_run_probe_takes_a_directory_only_before_the_separator(probe, tmp_path):
    out = _run([*CLI, "run", *probe, "--", sys.executable, "-c", "open('ran', 'w')"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "ran").exists()


@pytest.mark.sglang
def test_status_reports_every_patch_applied_on_0_5_9():
    out = _run([*CLI, "status", "--cpu-profile", "--json"])
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    from support.releases import expected_states, outside_states, sglang_version

    assert report["sglang"] == str(sglang_version())  # 0.5.9 (pinned); other releases: tools/matrix.py
    states = {p["name"]: p["state"] for p in report["patches"]}
    assert states == {**states, **expected_states()}, states  # every patch for this release: applied
    assert outside_states(states) == {}, states  # the others: upstream or not-applicable
    assert len(states) == len(expected_states()) + len(
        [s for s in states.values() if s in ("upstream", "not-applicable")]
    )


@pytest.mark.sglang
def test_status_honours_the_disable_variable():
    out = _run([*CLI, "status", "--cpu-profile"], env={"EAGLE3_PATCHES_DISABLE": "eagle3_fc_guard"})
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if "eagle3_fc_guard" in line)
    assert "disabled" in line and "EAGLE3_PATCHES_DISABLE" in line
