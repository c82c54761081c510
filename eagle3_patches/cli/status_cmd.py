"""``eagle3-patches status``: the installed sglang and, per patch, what applying it does here."""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from ..sglang_version import installed_sglang_version
from ..version import __version__

EPILOG = """\
examples:
  eagle3-patches status                  # on the serving machine: one line per patch
  eagle3-patches status --cpu-profile    # on a machine without a GPU
  eagle3-patches status --json           # for a deployment script

Exit status 0, or 1 when a patch failed or sglang could not be imported.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "status",
        help="show, for the installed sglang, what each patch does (applied/upstream/...)",
        description="Apply every patch in this process and import the sglang modules they patch, then say, per "
        "patch, what it does on the installed sglang: applied, upstream (fixed there), not-applicable, disabled, "
        "not-selected or failed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--cpu-profile", action="store_true", help="activate the CPU profile first (machines without a GPU)")
    p.set_defaults(func=run)


def resolve_status(cpu_profile: bool = False) -> dict:
    """Apply every patch in this process and import its sglang module, then report the states."""
    import eagle3_patches

    version = installed_sglang_version()
    report: dict[str, Any] = {"eagle3_patches": __version__, "sglang": str(version) if version else None, "patches": []}
    if version is None:
        report["patches"] = [
            {**s.as_dict(), "state": "not-applicable", "reason": "sglang is not installed"}
            for s in eagle3_patches.status().values()
        ]
        return report
    if cpu_profile:
        from .. import cpu

        cpu.activate()
    statuses = eagle3_patches.apply()
    failures: dict[str, list[str]] = {}  # one message -> the sglang modules it stopped
    for name, st in statuses.items():
        if st.state.value == "pending":
            module = eagle3_patches.get_patch(name).module
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:  # a dependency of sglang's module: reported once per cause
                    failures.setdefault(_import_failure(exc, cpu_profile), []).append(module)
                    continue
                for registry in eagle3_patches.registries():  # a module of later releases than this one
                    registry.module_absent(module)
            except Exception as exc:  # noqa: BLE001 - reported once per cause
                failures.setdefault(_import_failure(exc, cpu_profile), []).append(module)
    if failures:
        report["import_errors"] = {msg: sorted(set(mods)) for msg, mods in failures.items()}
    report["patches"] = [s.as_dict() for s in eagle3_patches.status().values()]
    return report


def _import_failure(exc: Exception, cpu_profile: bool) -> str:
    """What stopped sglang's import, said once: a missing dependency by name, the CPU profile only where it helps."""
    from ..cpu.stubs import STAND_INS

    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing:
        top = missing.split(".")[0]
        if top in STAND_INS and not cpu_profile:
            return (
                f"sglang needs {top}, a CUDA-only package that cannot be imported here; on a machine without a GPU "
                "add --cpu-profile"
            )
        return f"sglang needs the module {missing!r}, which is not installed in this Python: pip install {top}"
    return f"{type(exc).__name__}: {exc}"


def run(args) -> int:
    report = resolve_status(cpu_profile=args.cpu_profile)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"eagle3-patches {report['eagle3_patches']}")
        print(f"sglang {report['sglang'] or '(not installed)'}")
        width = max(len(p["name"]) for p in report["patches"])
        for p in report["patches"]:
            reason = f"  ({p['reason']})" if p["reason"] else ""
            print(f"  {p['name']:<{width}}  {p['state']:<14}{reason}")
        for err, modules in report.get("import_errors", {}).items():
            print(f"  could not import {', '.join(modules)}: {err}")
    return 1 if any(p["state"] == "failed" for p in report["patches"]) or report.get("import_errors") else 0
