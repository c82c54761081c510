"""Read the diagnostic probe's JSON lines and name the first hop where the EAGLE-3 path goes wrong.

The probe (instrument ``eagle3_probe``, ``EAGLE3_PATCHES_PROBE``, ``eagle3-patches run --probe``) writes one
record per process, hop and forward mode into ``probe-<pid>.jsonl`` files; this module reads them and hands
them to the diagnosis (:mod:`eagle3_patches.instruments.probe_diagnosis`, which says what the hops are).

    from eagle3_patches.probe_report import report
    r = report(["/tmp/probe"])          # files or directories of probe-<pid>.jsonl
    print(r.format()); r.exit_code      # 0 nothing wrong, 1 a hop is wrong

Never imports sglang or torch.  Unreadable input raises :class:`ProbeReportError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .instruments.probe_diagnosis import SCHEMA, ProbeReport, analyse

__all__ = ["ProbeReport", "ProbeReportError", "analyse", "load_records", "probe_files", "report"]


class ProbeReportError(Exception):
    """The probe files cannot be read (usage error: exit code 2)."""


# ---------------------------------------------------------------------- reading the files
def probe_files(paths: Iterable[str | Path]) -> list[Path]:
    """The probe files named by ``paths`` (files, or directories of ``*.jsonl``)."""
    found: list[Path] = []
    seen: set[Path] = set()
    paths = list(paths)
    if not paths:
        raise ProbeReportError("no probe file or directory given")
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files = sorted(p.glob("*.jsonl"))
            if not files:
                raise ProbeReportError(f"{p}: no probe files (*.jsonl) in this directory")
        elif p.exists():
            files = [p]
        else:
            raise ProbeReportError(f"{p}: no such file or directory")
        for f in files:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                found.append(f)
    return found


def load_records(paths: Iterable[str | Path]) -> tuple[list[dict], list[str], list[str]]:
    """(records, file names, notes); raises :class:`ProbeReportError` for unreadable input."""
    records: list[dict] = []
    notes: list[str] = []
    files = probe_files(paths)
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProbeReportError(f"{f}: cannot read it: {exc}") from None
        good = bad = 0
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(rec, dict) or rec.get("probe") != SCHEMA or "hop" not in rec or "mode" not in rec:
                bad += 1
                continue
            records.append(rec)
            good += 1
        if good == 0:
            raise ProbeReportError(
                f"{f}: no eagle3-patches probe records in it"
                + (f" ({bad} line(s) that are not probe records)" if bad else " (empty)")
            )
        if bad:
            notes.append(f"{f}: {bad} line(s) skipped (not probe records, or cut off)")
    return records, [str(f) for f in files], notes


def report(paths: Iterable[str | Path]) -> ProbeReport:
    records, files, notes = load_records(paths)
    return analyse(records, files, notes)
