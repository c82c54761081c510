"""The selftest report: one human table (every string escaped for the terminal) and one JSON form."""

from __future__ import annotations

import json

from ..terminal import escape_terminal as esc
from .base import FAILED, SKIPPED, Result


def as_json(report: dict) -> str:
    out = dict(report)
    out["checks"] = [r.as_dict() if isinstance(r, Result) else r for r in report["checks"]]
    return json.dumps(out, indent=2)


def render(report: dict) -> str:
    lines = []
    if report.get("error"):
        return f"eagle3-patches selftest: {esc(report['error'])}\nexit {report['exit_code']}"
    lines.append(
        f"eagle3-patches selftest: sglang {esc(report['sglang'])}, torch {esc(report.get('torch'))}, "
        f"eagle3-patches {report['eagle3_patches']}"
    )
    settings = report["settings"]
    if report.get("cpu_profile"):
        lines.append(f"device: {esc(report['device_text'])} (float32, triton attention: what runs on CPU)")
    else:
        backend = settings["attention_backend"] or "sglang's default"
        lines.append(
            f"device: {esc(report['device_text'])}; dtype {esc(settings['dtype'] or 'bfloat16')}, attention "
            f"backend {esc(backend)}, CUDA graphs on"
        )
    if report["gpu_checks"]["not_run"]:
        lines.append(f"GPU checks NOT run (skipped, not passed): {', '.join(report['gpu_checks']['not_run'])}")
    if report.get("ignored_environment"):
        lines.append(
            f"note: the checks test the default patch set; {', '.join(report['ignored_environment'])} "
            "from this environment are not applied to them"
        )
    lines.append("")
    checks: list[Result] = report["checks"]
    width = max([len(r.name) for r in checks] + [5])
    lines.append(f"  {'check':<{width}}  {'patch state':<14}  {'bug on stock':<14}  {'result':<8}  time")
    for r in checks:
        lines.append(
            f"  {r.name:<{width}}  {esc(r.state or '-'):<14}  {esc(r.bug or '-'):<14}  "
            f"{r.status.upper() if r.status == FAILED else r.status:<8}  {r.seconds:5.1f}s"
        )
        pad = " " * 6
        lines.append(f"{pad}{esc(r.title)}")
        if r.status != SKIPPED:
            if r.stock:
                lines.append(f"{pad}stock:   {esc(r.stock)}")
            lines.append(f"{pad}patched: {esc(r.patched)}")
        if r.reason:
            lines.append(
                f"{pad}{'why' if r.status == SKIPPED else 'verdict'}:{' ' if r.status == SKIPPED else ''} "
                f"{esc(r.reason)}"
            )
    s = report["summary"]
    lines.append("")
    lines.append(
        f"{len(checks)} check{'' if len(checks) == 1 else 's'}: {s['passed']} passed, {s['failed']} failed, "
        f"{s['skipped']} skipped in "
        f"{report['seconds']:.1f} s (tiny checkpoints {report.get('checkpoints_s', 0)} s; at most "
        f"{settings['timeout_s']:g} s a check); exit {report['exit_code']}"
    )
    if report.get("logs"):
        lines.append(f"what sglang printed in each check's processes: {esc(report['logs'])}/<check>.log")
    return "\n".join(lines)
