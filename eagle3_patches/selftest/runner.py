"""Run the checks against the installed sglang on this machine's device and collect the report.

The parent process imports torch (to see the device and build the tiny checkpoints) but never sglang:
every check starts its own spawned processes (:meth:`.base.Context.observe`).  Without a CUDA device the
children activate the CPU profile and the GPU checks are skipped, each with its reason.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .base import (
    CHILD_ENV,
    FAILED,
    PASSED,
    SKIPPED,
    Context,
    Result,
    detect_device,
    execute,
)
from .checks import CHECKS, uncovered

SCHEMA = 1


def select(only: Iterable[str] | None) -> tuple[list, list[str]]:
    """``(checks, uncovered patches)`` named in ``only`` (check names, or patch names meaning every check of that
    patch), in the list's order; everything for None.  KeyError names an unknown one."""
    missing = uncovered()
    if not only:
        return list(CHECKS), list(missing)
    wanted, bare = set(), []
    for name in only:
        hits = [c.name for c in CHECKS if name in (c.name, c.patch)]
        if not hits and name not in missing:
            raise KeyError(name)
        wanted.update(hits)
        if name in missing:
            bare.append(name)
    return [c for c in CHECKS if c.name in wanted], bare


def run_selftest(
    only: Iterable[str] | None = None,
    *,
    timeout: float = 600.0,
    jobs: int = 1,
    attention_backend: str | None = None,
    dtype: str | None = None,
    root: os.PathLike | None = None,
    progress: Callable[[Result, int, int], None] | None = None,
) -> dict:
    """Run the selected checks; returns the report (:func:`.report.as_json` is its JSON form)."""
    import eagle3_patches

    from ..sglang_version import installed_sglang_version

    t0 = time.monotonic()
    checks, bare = select(only)
    placeholders = [Result(name, "(no check)", SKIPPED, patch=name, reason=uncovered()[name]) for name in bare]
    version = installed_sglang_version()
    report: dict = {
        "schema": SCHEMA,
        "eagle3_patches": eagle3_patches.__version__,
        "sglang": str(version) if version else None,
        "python": sys.version.split()[0],
        "settings": {"timeout_s": timeout, "jobs": jobs, "attention_backend": attention_backend, "dtype": dtype},
        "ignored_environment": sorted(k for k in CHILD_ENV if os.environ.get(k, "").strip()),
        "checks": [],
        "error": None,
    }
    if version is None:
        report["error"] = "sglang is not installed in this Python: there is nothing to check"
        return _finish(report, t0)
    try:
        import torch
    except ImportError as exc:
        report["error"] = f"torch cannot be imported ({exc}); sglang needs it"
        return _finish(report, t0)
    device = detect_device()
    report["torch"] = torch.__version__
    report["device"] = device.as_dict()
    report["device_text"] = device.describe()
    report["cpu_profile"] = device.kind != "cuda"
    if device.kind != "cuda":
        report["settings"]["attention_backend"] = report["settings"]["dtype"] = (
            None  # the CPU profile's own (triton, float32)
        )

    given = root or os.environ.get("EAGLE3_TINY_CACHE")  # the tests' cache of tiny checkpoints (tests/conftest.py)
    own_root = not given
    work = Path(given) if given else Path(tempfile.mkdtemp(prefix="eagle3-selftest-"))
    logs = Path(tempfile.mkdtemp(prefix="eagle3-selftest-logs-"))
    try:
        t_build = time.monotonic()
        _build_checkpoints(work)
        report["checkpoints_s"] = round(time.monotonic() - t_build, 1)

        def one(check) -> Result:
            ctx = Context(
                work,
                device,
                version,
                timeout=timeout,
                attention_backend=attention_backend,
                dtype=dtype,
                log=logs / f"{check.name}.log",
            )
            return execute(check, ctx)

        results: dict[str, Result] = {}
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(one, c): c for c in checks}
            for future in as_completed(futures):
                res = future.result()
                results[res.name] = res
                if progress:
                    progress(res, len(results), len(checks))
        report["checks"] = [results[c.name] for c in checks] + placeholders
    finally:
        if own_root:
            shutil.rmtree(work, ignore_errors=True)
    report = _finish(report, t0)
    if report["exit_code"] == 0:
        shutil.rmtree(logs, ignore_errors=True)
    else:  # what sglang printed in the checks' processes, for whoever reads the failure
        report["logs"] = str(logs)
    return report


def _build_checkpoints(root: Path) -> None:
    """Every tiny checkpoint the checks use, once, before any check starts (checks may run in threads)."""
    from .checkpoints import BUILDERS, build

    for name in BUILDERS:
        build(root, name)


def _finish(report: dict, t0: float) -> dict:
    checks: list[Result] = report["checks"]
    report["summary"] = {s: sum(1 for r in checks if r.status == s) for s in (PASSED, FAILED, SKIPPED)}
    gpu = [r.name for r in checks if "cuda" in r.needs]
    not_run = [r.name for r in checks if "cuda" in r.needs and r.status == SKIPPED]
    report["gpu_checks"] = {"run": [n for n in gpu if n not in not_run], "not_run": not_run}
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["exit_code"] = 1 if report["error"] or report["summary"][FAILED] else 0
    return report
