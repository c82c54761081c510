#!/usr/bin/env python3
"""The drift report: which sglang functions and methods that eagle3-patches touches changed between two releases.

    python tools/drift_report.py                          # the newest release vs the one before it
    python tools/drift_report.py --old 0.5.22 --new 0.5.23
    python tools/drift_report.py --output docs/drift.md   # also the generated page (default: .matrix/ only)

What is touched is not a list kept here: in each release's venv of ``tools/matrix.py`` (``.matrix/venv-X``,
set up when missing) every patch (``eagle3_patches/patches``), instrument (``eagle3_patches/instruments``) and
CPU-profile workaround (``eagle3_patches/cpu``) runs its upstream probe, its checks and its change once, inside
``eagle3_patches.registry.recording_touches()``, which records each object changed through the patch's
``Saver`` (``changes``), required with ``expect_attr`` (``requires``) and whose source is read with
``source_of`` / ``expect_source`` (``reads``); every change is undone at once, and the process exits.  The
touches of both releases are joined (a function the old release had and the new one lost is the first
place to look).

Each touched object is then looked up, by module and qualified name, in the two wheels' sources
(``.matrix/wheels``, downloaded with ``pip download --no-deps``), parsed with :mod:`ast` and compared as
syntax trees without docstrings, so formatting, comments and docstrings are no drift; a whole class or
module that is read counts as changed when anything in it changed.  Output: ``.matrix/drift-OLD-NEW.md``
(with each change's diff of the normalised source) and ``.json``; with ``--output`` also a page without the
diffs (docs/drift.md, generated: never edit it by hand).
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import difflib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import matrix  # noqa: E402  (the release list, the venvs and the wheel cache are the matrix's)

#: one recorder run per release venv; the sglang modules it imports need the CPU profile's environment
RECORD_TIMEOUT = 900


# -- recording (runs inside a release venv) ---------------------------------------------------------
def record_touches() -> dict:
    """Every patch's probe, checks and change, recorded; sglang restored after each.  Runs in a release venv."""
    import importlib

    from eagle3_patches import cpu
    from eagle3_patches.cpu.stubs import install_stubs

    for key, value in cpu.CPU_ENV.items():
        os.environ.setdefault(key, value)
    install_stubs()
    import eagle3_patches
    from eagle3_patches.registry import NotApplicable, Saver, recording_touches
    from eagle3_patches.sglang_version import installed_sglang_version

    out: dict = {"sglang": str(installed_sglang_version()), "patches": []}
    registries = [
        ("patch", eagle3_patches.get_registry()),
        ("instrument", eagle3_patches.get_instruments()),
        ("cpu", cpu.get_registry()),
    ]
    for kind, reg in registries:
        for patch in reg.patches():
            entry = {"name": patch.name, "kind": kind, "module": patch.module, "notes": [], "touches": []}
            with recording_touches() as touches:
                try:
                    module = importlib.import_module(patch.module)
                except Exception as exc:  # noqa: BLE001 - reported
                    entry["notes"].append(f"import {patch.module}: {type(exc).__name__}: {exc}")
                    module = None
                for step in ("upstream", "check", "patch") if module is not None else ():
                    saver = Saver()
                    try:
                        if step == "patch":
                            patch.patch(module, saver)
                        else:
                            why = getattr(patch, step)(module)
                            if step == "upstream" and why:
                                entry["notes"].append(f"upstream: {why}")
                    except NotApplicable as exc:
                        entry["notes"].append(f"{step}: not applicable: {exc}")
                    except Exception as exc:  # noqa: BLE001 - reported
                        entry["notes"].append(f"{step}: {type(exc).__name__}: {exc}")
                    finally:
                        saver.restore()
            seen = set()
            for t in touches:
                key = (t.kind, t.module, t.qualname)
                if key not in seen:
                    seen.add(key)
                    entry["touches"].append({"kind": t.kind, "module": t.module, "qualname": t.qualname})
            out["patches"].append(entry)
    return out


def touches_in(version: str, data: dict, installer: str) -> dict:
    """:func:`record_touches` in the release's venv (set up when missing)."""
    setup = matrix.setup_release(version, data, installer)
    if not setup["ok"]:
        return {"sglang": version, "error": f"set-up failed: {setup.get('error')}", "patches": []}
    env = matrix._env(version)
    env["EAGLE3_PATCHES_PLUGIN"] = "0"  # nothing may apply the patch set behind the recorder's back
    r = subprocess.run(
        [str(matrix.venv_python(version)), str(Path(__file__).resolve()), "--record"],
        capture_output=True,
        text=True,
        cwd=str(matrix.MATRIX),
        env=env,
        timeout=RECORD_TIMEOUT,
    )
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr or r.stdout).strip().splitlines()
        return {"sglang": version, "error": tail[-1] if tail else f"exit {r.returncode}", "patches": []}


# -- comparing sources --------------------------------------------------------------------------------
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _level(body: list[ast.stmt]):
    """The statements of one scope, conditional and try blocks flattened (``if _is_cuda: def f(): ...``)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _level(node.body)
            yield from _level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _level(block)


def _binds(node: ast.stmt, name: str) -> bool:
    if isinstance(node, _DEFS):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def find(tree: ast.Module, qualname: str) -> list[ast.AST]:
    """The statements that define ``qualname`` (``Class.method``, ``function``, a module-level name; ``""``:
    the whole module) in ``tree``; [] when it is not there.  Every binding counts (a function defined per
    branch of an ``if``)."""
    if not qualname:
        return [tree]
    scope: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        found = [n for n in _level(scope) if _binds(n, part)]
        if last:
            return found
        classes = [n for n in found if isinstance(n, ast.ClassDef)]
        if not classes:
            return []
        scope = classes[-1].body
    return []


class _NoDocstrings(ast.NodeTransformer):
    def _strip(self, node):
        self.generic_visit(node)
        body = getattr(node, "body", None)
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Module = _strip


def normalised(nodes: list[ast.AST]) -> str:
    """The nodes' source as ``ast.unparse`` writes it, docstrings left out (formatting and comments are gone)."""
    import copy

    return "\n".join(ast.unparse(_NoDocstrings().visit(copy.deepcopy(n))) for n in nodes)


def compare(old_src: str | None, new_src: str | None, qualname: str) -> dict:
    """``{"status", "diff"}`` for ``qualname`` between two module sources (None: the module is absent):
    ``unchanged``, ``changed``, ``added`` (only in the new), ``removed`` (only in the old), ``absent``."""
    old = find(ast.parse(old_src), qualname) if old_src is not None else []
    new = find(ast.parse(new_src), qualname) if new_src is not None else []
    if not old and not new:
        return {"status": "absent", "diff": ""}
    if not old:
        return {"status": "added", "diff": ""}
    if not new:
        return {"status": "removed", "diff": ""}
    a, b = normalised(old), normalised(new)
    if a == b:
        return {"status": "unchanged", "diff": ""}
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "old", "new", n=1, lineterm="")
    return {"status": "changed", "diff": "\n".join(list(diff)[2:])}


def module_source(wheel: Path, module: str) -> str | None:
    """The source of ``module`` in the wheel (``a/b.py`` or ``a/b/__init__.py``), None when it has none."""
    base = module.replace(".", "/")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for path in (base + ".py", base + "/__init__.py"):
            if path in names:
                return zf.read(path).decode("utf-8", errors="replace")
    return None


# -- the report -------------------------------------------------------------------------------------
def drift(old: str, new: str, data: dict, installer: str) -> dict:
    recorded = {v: touches_in(v, data, installer) for v in (old, new)}
    objects: dict[tuple[str, str], dict] = {}
    for v, rec in recorded.items():
        for p in rec.get("patches", []):
            for t in p["touches"]:
                o = objects.setdefault(
                    (t["module"], t["qualname"]),
                    {"module": t["module"], "qualname": t["qualname"], "by": {}, "seen_in": []},
                )
                o["by"].setdefault(p["name"], set()).add(t["kind"])
                if v not in o["seen_in"]:
                    o["seen_in"].append(v)
    wheels = {v: matrix.wheel_for(v, matrix.host_python()) for v in (old, new)}
    sources: dict[tuple[str, str], str | None] = {}
    for o in objects.values():
        for v in (old, new):
            if (v, o["module"]) not in sources:
                sources[(v, o["module"])] = module_source(wheels[v], o["module"])
        o.update(compare(sources[(old, o["module"])], sources[(new, o["module"])], o["qualname"]))
        o["by"] = {name: sorted(kinds) for name, kinds in sorted(o["by"].items())}
    order = {"changed": 0, "removed": 1, "added": 2, "absent": 3, "unchanged": 4}
    rows = sorted(objects.values(), key=lambda o: (order[o["status"]], o["module"], o["qualname"]))
    return {
        "old": old,
        "new": new,
        "when": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "objects": rows,
        "recorded": {
            v: {
                "error": rec.get("error"),
                "notes": {p["name"]: p["notes"] for p in rec.get("patches", []) if p["notes"]},
            }
            for v, rec in recorded.items()
        },
    }


def render(report: dict, diffs: bool) -> str:
    old, new = report["old"], report["new"]
    rows = report["objects"]
    count = {
        s: sum(1 for o in rows if o["status"] == s) for s in ("changed", "removed", "added", "absent", "unchanged")
    }
    lines = [
        f"# Drift: sglang {old} -> {new}",
        "",
        "Generated by `tools/drift_report.py`; do not edit by hand. Regenerate with:",
        "",
        "```bash",
        f"python tools/drift_report.py --old {old} --new {new}" + ("" if diffs else " --output docs/drift.md"),
        "```",
        "",
        f"Run {report['when']}. Every sglang function, method, class or module-level name that a patch, an "
        "instrument or a CPU-profile workaround of eagle3-patches touches - changes through its `Saver` "
        "(**changes**), requires (`expect_attr`: **requires**) or reads the source of (`source_of` / "
        "`expect_source`: **reads**) - recorded by running each one's upstream probe, checks and change in both "
        "releases' venvs, then compared between the two wheels' sources as syntax trees (docstrings, comments "
        "and formatting are no drift). **changed** first: where a maintainer looks first. A whole module or class "
        "that is read counts as changed when anything in it changed.",
        "",
        f"{count['changed']} changed, {count['removed']} removed, {count['added']} added, "
        f"{count['absent']} absent from both, {count['unchanged']} unchanged.",
        "",
        "| sglang object | module | touched by | " + f"{old} -> {new} |",
        "|---|---|---|---|",
    ]
    for o in rows:
        by = "; ".join(f"`{n}` ({', '.join(k)})" for n, k in o["by"].items())
        name = f"`{o['qualname']}`" if o["qualname"] else "(the module)"
        lines.append(f"| {name} | `{o['module']}` | {by} | {o['status']} |")
    lines.append("")
    for v, rec in report["recorded"].items():
        if rec.get("error"):
            lines += [f"Recording in sglang {v}'s venv failed: `{rec['error']}`", ""]
    if diffs:
        for o in rows:
            if o["status"] == "changed":
                lines += [f"## `{o['module']}` `{o['qualname'] or '(module)'}`", "", "```diff", o["diff"], "```", ""]
        lines += ["## What each patch said while recording", ""]
        for v, rec in report["recorded"].items():
            for name, notes in rec["notes"].items():
                for note in notes:
                    lines.append(f"- {v} `{name}`: {note}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def pair(data: dict, old: str | None, new: str | None) -> tuple[str, str]:
    """(old, new): ``new`` defaults to the newest release on PyPI, ``old`` to the release before ``new``."""
    releases = matrix.resolve_releases(data["full"], data)
    new = new or releases[-1]
    if old:
        return old, new
    earlier = [v for v in releases if matrix.Version(v) < matrix.Version(new)]
    if not earlier:
        raise SystemExit(f"no release before {new} in the full list {releases}")
    return earlier[-1], new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="the earlier release (default: the one before --new in the full list)")
    ap.add_argument("--new", help="the later release (default: the newest on PyPI)")
    ap.add_argument("--output", type=Path, help="also write the page without diffs here (e.g. docs/drift.md)")
    ap.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto")
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)  # inside a release venv
    args = ap.parse_args(argv)
    if args.record:
        print(json.dumps(record_touches()))
        return 0
    data = matrix.load_data()
    old, new = pair(data, args.old, args.new)
    matrix.MATRIX.mkdir(exist_ok=True)
    report = drift(old, new, data, matrix.choose_installer(args.installer))
    md, js = (matrix.MATRIX / f"drift-{old}-{new}.{ext}" for ext in ("md", "json"))
    js.write_text(json.dumps(report, indent=2))
    md.write_text(render(report, diffs=True))
    if args.output:
        args.output.write_text(render(report, diffs=False))
    changed = [o for o in report["objects"] if o["status"] in ("changed", "removed")]
    print(
        f"sglang {old} -> {new}: {len(changed)} of {len(report['objects'])} touched objects changed or removed; "
        f"{md.relative_to(ROOT)}" + (f", {args.output}" if args.output else "")
    )
    for v, rec in report["recorded"].items():
        if rec.get("error"):
            print(f"recording in {v} failed: {rec['error']}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
