#!/usr/bin/env python3
"""Where the test command's time went: the tables of docs/development.md, from what the last run recorded.

``tools/run_tests.sh`` records each mode under ``.matrix/costs/<mode>/`` (``EAGLE3_TEST_COSTS``: the events of
``eagle3_patches/testing/costs.py``) and the wall time of each stream and mode in ``.matrix/costs/modes.jsonl``,
then prints these tables.  ``--docs`` writes them into docs/development.md, between its two markers.

    python tools/test_costs.py            # the tables of the last run, on stdout
    python tools/test_costs.py --docs     # and into docs/development.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COSTS = ROOT / ".matrix" / "costs"
DOCS = ROOT / "docs" / "development.md"
BEGIN = "<!-- test-costs: begin (python tools/test_costs.py --docs) -->"
END = "<!-- test-costs: end -->"
#: the modes in the order the tables list them, with what each ran
MODES = {
    "a": "(a) stock 0.5.9 + runtime patches, without tests/e2e and tests/distributed",
    "a-e2e": "(a) tests/e2e, the real servers",
    "a-distributed": "(a) tests/distributed, tensor parallel 2",
    "b": "(b) the fork-path diffs applied",
    "c": "(c) the newest known release",
}
SLOWEST = 15
FIXTURES = 12


def read_events(costs: Path) -> dict[str, list[dict]]:
    """The events of each mode (a line that is not JSON, from a process killed mid-write, is left out)."""
    events: dict[str, list[dict]] = {}
    for mode in MODES:
        rows = []
        for path in sorted((costs / mode).glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        if rows:
            events[mode] = rows
    return events


def read_walls(costs: Path) -> list[dict]:
    path = costs / "modes.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def directory(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else (parts[0] or "(outside a test)")


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def tables(events: dict[str, list[dict]], walls: list[dict]) -> str:
    out: list[str] = []
    if walls:
        out += ["| part of the test command | wall time (min) |", "|---|---:|"]
        out += [f"| {w['part']} | {minutes(w['seconds'])} |" for w in walls]
        out.append("")

    out += [
        "| mode | directory | tests | test time (min) | sglang processes (min) | servers started (min to ready)"
        " | tiny models built |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    slowest: list[tuple[float, str, str]] = []
    fixtures: dict[tuple[str, str], list[float]] = defaultdict(list)
    for mode, rows in events.items():
        per: dict[str, dict] = defaultdict(
            lambda: {"tests": set(), "seconds": 0.0, "proc": 0, "proc_s": 0.0, "srv": 0, "srv_s": 0.0, "tiny": 0}
        )
        per_test: dict[str, float] = defaultdict(float)
        for e in rows:
            d = per[directory(e.get("test", ""))]
            kind, seconds = e.get("kind"), float(e.get("seconds", 0.0))
            if kind == "test":
                d["tests"].add(e["test"])
                d["seconds"] += seconds
                per_test[e["test"]] += seconds
            elif kind == "process":
                d["proc"] += int(e.get("ranks", 1))
                d["proc_s"] += seconds
            elif kind == "server":
                d["srv"] += 1
                d["srv_s"] += seconds
            elif kind == "tiny_model":
                d["tiny"] += 1
            elif kind == "fixture" and seconds >= 0.05:
                fixtures[(e["fixture"], e.get("scope", "function"))].append(seconds)
        for name, d in sorted(per.items(), key=lambda kv: -kv[1]["seconds"]):
            out.append(
                f"| {mode} | `{name}` | {len(d['tests'])} | {minutes(d['seconds'])}"
                f" | {d['proc']} ({minutes(d['proc_s'])}) | {d['srv']} ({minutes(d['srv_s'])}) | {d['tiny']} |"
            )
        slowest += [(s, mode, t) for t, s in per_test.items()]
    out += [
        "",
        "A directory's test time is the sum of its tests' set-up, call and teardown; the minutes of its sglang "
        "processes and servers are summed over them (a process is timed from the test process, so one that runs "
        "beside another counts in full).",
        "",
        "The costliest fixtures (each set-up counted; its time is part of the first test that needed it):",
        "",
    ]
    out += ["| fixture | scope | set-ups | time (min) |", "|---|---|---:|---:|"]
    for (name, scope), times in sorted(fixtures.items(), key=lambda kv: -sum(kv[1]))[:FIXTURES]:
        out.append(f"| `{name}` | {scope} | {len(times)} | {minutes(sum(times))} |")
    out += ["", f"The {SLOWEST} slowest tests (set-up, call and teardown):", ""]
    out += ["| mode | test | seconds |", "|---|---|---:|"]
    for seconds, mode, test in sorted(slowest, reverse=True)[:SLOWEST]:
        out.append(f"| {mode} | `{test}` | {seconds:.0f} |")
    return "\n".join(out) + "\n"


def write_docs(text: str, docs: Path = DOCS) -> None:
    doc = docs.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{docs}: the markers {BEGIN!r} and {END!r} are missing; add them where the tables go")
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    docs.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--costs", default=str(COSTS), help="where the run recorded its costs (default: .matrix/costs)")
    ap.add_argument("--docs", action="store_true", help="also write the tables into docs/development.md")
    args = ap.parse_args(argv)
    costs = Path(args.costs)
    events = read_events(costs)
    if not events:
        print(f"{costs}: no recorded costs; run `bash tools/run_tests.sh` first", file=sys.stderr)
        return 1
    text = tables(events, read_walls(costs))
    print(text, end="")
    if args.docs:
        write_docs(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
