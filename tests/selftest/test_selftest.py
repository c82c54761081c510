"""``eagle3-patches selftest``: the command end to end on CPU, and how a finding becomes a verdict.

The checks themselves are proven by the behavioural tests (``tests/patches``, ``tests/distributed``), which assert
on the same check functions through the ``run_check`` fixture; here: the real command's JSON and exit status,
every check accounted for, and the rules no check may bend (a check that cannot run says why; a bug on stock
sglang that no active patch covers fails).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from support.releases import patch_applies, sglang_version

from eagle3_patches.cli import main
from eagle3_patches.selftest import CHECKS, FAILED, PASSED, SKIPPED, Check, Context, Device, Finding, Skip, execute
from eagle3_patches.selftest.base import CheckError, judge
from eagle3_patches.selftest.checks import NO_CHECK, uncovered
from eagle3_patches.selftest.report import as_json, render


# --------------------------------------------------------------------------- the list of checks
def test_every_patch_is_observed_by_a_check_or_says_why():
    import eagle3_patches

    assert set(uncovered()) == set(NO_CHECK)  # a new patch needs a check (or a reason here)
    known = set(eagle3_patches.known_names())
    assert {c.patch for c in CHECKS if c.patch} <= known
    assert len({c.name for c in CHECKS}) == len(CHECKS)


def test_a_patchs_checks_are_the_module_named_after_it_found_by_listing_the_package():
    """``checks/<patch>.py`` holds that patch's checks and only those; the package lists every module's, in registry
    order, each module's in its own order (so a new patch's check is one new module)."""
    import importlib
    import pkgutil

    import eagle3_patches
    from eagle3_patches.selftest import checks

    names = sorted(m.name for m in pkgutil.iter_modules(checks.__path__) if not m.name.startswith("_"))
    own = {name: importlib.import_module(f"{checks.__name__}.{name}").CHECKS for name in names}
    assert all(own.values())  # no module without a check
    # a module whose checks name no patch checks sglang itself (sampling_lossless); it is named after no patch
    of_sglang = {name for name, found in own.items() if {c.patch for c in found} == {None}}
    patch_modules = [name for name in names if name not in of_sglang]
    assert {name: {c.patch for c in own[name]} for name in patch_modules} == {name: {name} for name in patch_modules}
    known = eagle3_patches.known_names()
    assert set(patch_modules) <= set(known) and not of_sglang & set(known)
    rank = {name: i for i, name in enumerate(known)}
    assert [c.patch for c in CHECKS] == sorted((c.patch for c in CHECKS), key=lambda p: rank.get(p, len(rank)))
    assert sorted(c.name for c in CHECKS) == sorted(c.name for found in own.values() for c in found)
    for name in patch_modules:
        assert [c for c in CHECKS if c.patch == name] == list(own[name])
    assert all(checks.BY_NAME[c.name] is c for c in CHECKS) and len(checks.BY_NAME) == len(CHECKS)


# --------------------------------------------------------------------------- verdicts
def _check(**kw) -> Check:
    return Check(kw.pop("name", "c"), "a check", kw.pop("run", lambda ctx: None), **kw)


@pytest.mark.parametrize(
    "finding, status, needed, words",
    [
        (Finding(True, "ok", True, "bug", "applied"), PASSED, True, "needed"),
        (Finding(True, "ok", False, "fine", "applied"), PASSED, False, "does not need it"),
        (Finding(True, "ok", False, "fine", "upstream", "sglang has it"), PASSED, False, "gone on sglang"),
        (Finding(True, "ok", False, "fine", "in-source"), PASSED, False, "fork-path diff"),
        (Finding(True, "ok", None, "", "applied"), PASSED, None, "cannot be observed"),
        (Finding(True, "ok", True, "bug", "upstream", "probe says fixed"), FAILED, None, "present on stock"),
        (Finding(True, "ok", True, "bug", "not-applicable", "outside"), FAILED, None, "present on stock"),
        (Finding(False, "fc got 64", True, "bug", "applied"), FAILED, None, "with the patch set on: fc got 64"),
        (Finding(True, "ok", True, "bug", "failed", "boom"), FAILED, None, "is failed"),
        (Finding(True, "ok", True, "bug", "disabled"), FAILED, None, "is disabled"),
    ],
)
def test_judge(finding, status, needed, words):
    got_status, reason, got_needed = judge(_check(patch="p"), finding, "0.5.9")
    assert (got_status, got_needed) == (status, needed)
    assert words in reason


def test_a_check_without_a_patch_passes_on_the_behaviour_alone():
    assert judge(_check(), Finding(True, "ok"), "0.5.9")[0] == PASSED
    assert judge(_check(), Finding(False, "wrong width"), "0.5.9")[0] == FAILED


# --------------------------------------------------------------------------- a check that cannot run says why
CPU = Device("cpu")
ONE_GPU = Device("cuda", 1, "NVIDIA H200", (9, 0))


@pytest.mark.parametrize(
    "needs, device, words",
    [
        (("cuda",), CPU, "needs a CUDA device"),
        (("cuda", "2gpu"), ONE_GPU, "needs two visible GPUs (1 visible)"),
        (("tp2",), ONE_GPU, "TP 2 needs two visible GPUs"),
        (("cpu",), ONE_GPU, "observes the real one"),
    ],
)
def test_a_check_that_cannot_run_on_this_device_is_skipped_with_the_reason(tmp_path, needs, device, words):
    ran = []
    check = _check(needs=needs, instead="the_gpu_check", run=lambda ctx: ran.append(1))
    result = execute(check, Context(tmp_path, device, sglang_version()))
    assert result.status == SKIPPED and words in result.reason and ran == []


def test_a_check_outside_its_releases_is_skipped_naming_the_release(tmp_path):
    from packaging.version import Version

    check = _check(runs_on="<0.5.11", outside="fixed upstream in 0.5.11")
    result = execute(check, Context(tmp_path, CPU, Version("0.5.12")))
    assert result.status == SKIPPED
    assert result.reason == "sglang 0.5.12 is outside <0.5.11: fixed upstream in 0.5.11"


def _raise(exc):
    def run(ctx):
        raise exc

    return run


@pytest.mark.parametrize(
    "run, status, words",
    [
        (_raise(Skip("the no-aux draft cannot be built here")), SKIPPED, "the no-aux draft cannot be built here"),
        (_raise(CheckError("out of time")), FAILED, "out of time"),
        (_raise(ValueError("bad shape")), FAILED, "the check itself raised ValueError: bad shape"),
    ],
)
def test_a_check_that_stops_says_why(tmp_path, run, status, words):
    result = execute(_check(run=run), Context(tmp_path, CPU, sglang_version()))
    assert result.status == status and words in result.reason


# --------------------------------------------------------------------------- the report
def _report(results) -> dict:
    from eagle3_patches.selftest.runner import _finish

    report = {
        "schema": 1,
        "eagle3_patches": "0.1.0",
        "sglang": "0.5.9",
        "torch": "2.13.0",
        "python": "3.11",
        "device": CPU.as_dict(),
        "device_text": CPU.describe(),
        "cpu_profile": True,
        "error": None,
        "settings": {"timeout_s": 600.0, "jobs": 1, "attention_backend": None, "dtype": None},
        "ignored_environment": [],
        "checks": results,
    }
    return _finish(report, time.monotonic())


def test_report_exit_code_follows_the_checks_and_strings_are_escaped():
    from eagle3_patches.selftest import Result

    ok = Result("a", "t", PASSED, patch="a", bug="present", needed=True, state="applied", stock="s", patched="p")
    gpu = Result("g", "t", SKIPPED, needs=("cuda",), reason="needs a CUDA device")
    bad = Result("b", "t", FAILED, stock="\x1b[2Jfake OK", patched="wrong", reason="with the patch set on: wrong")
    passed = _report([ok, gpu])
    assert passed["exit_code"] == 0 and passed["summary"] == {PASSED: 1, FAILED: 0, SKIPPED: 1}
    assert passed["gpu_checks"] == {"run": [], "not_run": ["g"]}
    assert "GPU checks NOT run (skipped, not passed): g" in render(passed)
    failed = _report([ok, gpu, bad])
    assert failed["exit_code"] == 1
    text = render(failed)
    assert "\x1b" not in text and "\\x1b[2Jfake OK" in text and "FAILED" in text
    assert json.loads(as_json(failed))["checks"][2]["stock"] == "\x1b[2Jfake OK"  # JSON exact


# --------------------------------------------------------------------------- the command line
def test_usage_errors_exit_2(capsys):
    assert main(["selftest", "--only", "no_such_check"]) == 2
    assert "unknown check or patch no_such_check" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["selftest", "--timeout", "0"])
    assert info.value.code == 2


def test_list_names_every_check_and_every_patch_without_one(capsys):
    assert main(["selftest", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(c.name in out for c in CHECKS)
    assert all(f"{name}" in out and "no check" in out for name in NO_CHECK)


def _selftest(*args: str, cache, timeout: float) -> tuple[subprocess.CompletedProcess, dict, float]:
    """The real command, ``python -P -m eagle3_patches selftest --json ARGS``, from an empty directory."""
    env = dict(os.environ, EAGLE3_TINY_CACHE=str(cache))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "eagle3_patches", "selftest", "--json", *args],
        capture_output=True,
        text=True,
        cwd=str(cache.parent),
        env=env,
        timeout=timeout,
    )
    wall = time.monotonic() - t0  # (no CPU time: the CPU checks' processes are a forkserver's, not the command's)
    return proc, json.loads(proc.stdout), wall


#: what the command runs here: the end-to-end check (3 x hidden at fc), the layer-id check, a patch without a check
#: (its placeholder), and the GPU checks (skipped on CPU, saying so).  Every CPU check's function is asserted on by
#: the behavioural tests (``run_check``); the whole command, every check, runs in each release's venv of
#: ``tools/matrix.py`` (its exit status is part of the matrix's verdict), not on every change here.
E2E_SELECTION = [
    "kimi_k25_eagle3_delegation",
    "layer_id_convention",
    "eagle3_probe",
    *(c.name for c in CHECKS if "cuda" in c.needs),
]


@pytest.mark.sglang
@pytest.mark.timeout(1800)
def test_selftest_json_end_to_end_on_cpu(tiny_root, tiny, figure):
    proc, report, wall = _selftest("--only", ",".join(E2E_SELECTION), cache=tiny_root, timeout=1700)
    assert proc.returncode == report["exit_code"] == 0, proc.stdout
    assert report["schema"] == 1 and report["sglang"] == str(sglang_version()) and report["error"] is None
    assert report["device"]["kind"] == "cpu" and report["cpu_profile"] is True
    results = {r["name"]: r for r in report["checks"]}
    selected = [c for c in CHECKS if c.name in E2E_SELECTION]
    assert list(results) == [c.name for c in selected] + ["eagle3_probe"]
    assert (
        results["eagle3_probe"]["status"] == SKIPPED
        and results["eagle3_probe"]["reason"] == uncovered()["eagle3_probe"]
    )
    for check in selected:
        r = results[check.name]
        assert r["status"] in (PASSED, SKIPPED), (check.name, r["reason"])
        if r["status"] == SKIPPED:
            assert r["reason"], check.name  # never silently
        if "cuda" in check.needs:
            assert (
                r["status"] == SKIPPED
                and "needs a CUDA device" in r["reason"]
                and "GPU checks were not run" in r["reason"]
            )
        if r["status"] == PASSED and check.patch:
            assert r["bug"] in ("present", "absent", "not observable") and r["stock"] and r["patched"]
            assert r["needed"] == (r["bug"] == "present")
            if patch_applies(check.patch):
                assert r["state"] in ("applied", "in-source"), (check.name, r["state"])
    assert report["gpu_checks"]["not_run"] == [c.name for c in selected if "cuda" in c.needs]
    assert report["gpu_checks"]["run"] == []
    assert results["kimi_k25_eagle3_delegation"]["status"] == PASSED  # 3 x hidden at fc, on every release
    assert results["layer_id_convention"]["status"] == PASSED  # the configured layers, on every release
    ran = sum(1 for r in report["checks"] if r["status"] == PASSED)
    figure(
        f"eagle3-patches selftest --only ({len(E2E_SELECTION)} names) on CPU (sglang {report['sglang']}): {ran} checks "
        f"passed, {report['summary'][SKIPPED]} skipped; {wall:.0f} s wall, "
        f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at the end)"
    )


@pytest.mark.sglang
def test_a_check_that_runs_out_of_time_fails_and_the_exit_status_says_so(tiny_root, tiny):
    proc, report, _ = _selftest("--only", "eagle3_algorithm_guard", "--timeout", "1", cache=tiny_root, timeout=600)
    assert proc.returncode == report["exit_code"] == 1
    (result,) = report["checks"]
    assert result["status"] == FAILED and "--timeout" in result["reason"]
    assert os.path.isdir(report["logs"])  # kept for whoever reads the failure
    shutil.rmtree(report["logs"])
