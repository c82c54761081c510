#!/usr/bin/env python3
"""docs/targets.md: for each sglang release the matrix knows, every generative model class sglang
registers (its ``EntryClass``es), and whether it can serve an EAGLE-3 draft there:

* **native**: the release's class has ``set_eagle3_layers_to_capture`` and ``get_embed_and_head`` (its
  own or inherited) and its ``forward`` hands the captured states on (it names ``aux_hidden_states``,
  or returns a language model's output that does);
* **patched**: an eagle3-patches patch that applies to the release lists the class in its
  ``targets`` (proven by that patch's tests with a tiny model of the class);
* **refused**: anything else, with the reason; eagle3-patches' ``eagle3_target_capability`` refuses
  such a launch at start, once, instead of an AttributeError in every rank.

Derived from each release's own source (``sglang/srt/models/*.py`` read from the wheel with ``ast``,
nothing imported) and from the registry; never typed by hand.

    python tools/targets_table.py                 # the matrix's releases -> docs/targets.md
    python tools/targets_table.py --releases 0.5.9,0.5.23 --out /tmp/targets.md
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import matrix  # noqa: E402  (the release list and the wheel cache are the matrix's)

OUT = ROOT / "docs" / "targets.md"
HOOKS = ("set_eagle3_layers_to_capture", "get_embed_and_head")
GENERATIVE = ("ForCausalLM", "ForConditionalGeneration")


@dataclass
class ClassInfo:
    name: str
    module: str
    bases: list[str]
    methods: dict[str, str] = field(default_factory=dict)  # name -> source
    language_model: str | None = None  # the class assigned to self.language_model / self.model, if any


def _classes(source: str, module: str) -> tuple[list[ClassInfo], list[str]]:
    """The classes of one models/*.py and its EntryClass names."""
    tree = ast.parse(source)
    classes, entry = [], []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            info = ClassInfo(node.name, module, [ast.unparse(b).split(".")[-1] for b in node.bases])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    info.methods[item.name] = ast.get_source_segment(source, item) or ""
            init = info.methods.get("__init__", "")
            for attr in ("language_model", "model"):
                for line in init.splitlines():
                    text = line.strip()
                    if text.startswith(f"self.{attr} =") and "(" in text:
                        callee = text.split("=", 1)[1].strip().split("(")[0].strip()
                        if callee and callee[0].isupper():
                            info.language_model = info.language_model or callee.split(".")[-1]
            classes.append(info)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
        ):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            entry += [ast.unparse(i).split(".")[-1] for i in items]
    return classes, entry


def read_release(wheel: Path) -> tuple[dict[str, ClassInfo], list[ClassInfo]]:
    """Every class of sglang/srt/models (by name) and the registered ones, from the wheel."""
    by_name: dict[str, ClassInfo] = {}
    registered: list[ClassInfo] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            if not (name.startswith("sglang/srt/models/") and name.endswith(".py")) or name.count("/") != 3:
                continue
            module = Path(name).stem
            try:
                classes, entry = _classes(zf.read(name).decode(), module)
            except SyntaxError:
                continue
            for c in classes:
                by_name.setdefault(c.name, c)
            local = {c.name: c for c in classes}
            registered += [local.get(e) or by_name.get(e) for e in entry if (local.get(e) or by_name.get(e))]
    return by_name, registered


def _method(cls: ClassInfo, name: str, by_name: dict[str, ClassInfo], seen: frozenset = frozenset()) -> str | None:
    """The source of ``name`` as ``cls`` has it: its own, or the nearest base's (bases resolved by name)."""
    if name in cls.methods:
        return cls.methods[name]
    for base in cls.bases:
        b = by_name.get(base)
        if b is not None and b.name not in seen:
            found = _method(b, name, by_name, seen | {cls.name})
            if found is not None:
                return found
    return None


def classify(cls: ClassInfo, by_name: dict[str, ClassInfo], version: str, patches: list) -> tuple[str, str]:
    """(native / patched / refused, the evidence or the reason)."""
    from packaging.version import Version

    hooks = {h: _method(cls, h, by_name) is not None for h in HOOKS}
    forward = _method(cls, "forward", by_name) or ""
    lm = by_name.get(cls.language_model or "")
    lm_forward_ok = lm is not None and "aux_hidden_states" in (_method(lm, "forward", by_name) or "")
    # a wrapper that returns its language model's own output (LogitsProcessorOutput, aux states included) carries
    # them as the language model does (Kimi-K2.5: general_mm_embed_routine(language_model=self.language_model))
    passes_through = (
        lm_forward_ok
        and "logits_processor(" not in forward
        and ("general_mm_embed_routine(" in forward or "self.language_model(" in forward)
    )
    carries = "aux_hidden_states" in forward or passes_through
    helper = next((p for p in patches if cls.name in p.targets and p.covers(Version(version))), None)
    if all(hooks.values()) and carries:
        return "native", "hooks and a forward that hands the aux states on"
    if helper is not None:
        return "patched", f"eagle3-patches' `{helper.name}`"
    missing = [h for h, ok in hooks.items() if not ok]
    if missing:
        if passes_through and lm is not None and all(_method(lm, h, by_name) for h in HOOKS):
            return "refused", (
                f"no `{'` / `'.join(missing)}` of its own; delegating them to its language model "
                f"(`{lm.name}`, which has them and whose output it returns) would suffice, as "
                "`kimi_k25_eagle3_delegation` does for Kimi-K2.5: not done, no tiny model of it proven here"
            )
        via = f" (wraps `{cls.language_model}`)" if cls.language_model else ""
        return "refused", f"no `{'` / `'.join(missing)}`{via}"
    return "refused", "has the hooks but its forward does not hand the aux states to the logits processor"


def build(releases: list[str]) -> str:
    import eagle3_patches

    patches = eagle3_patches.get_registry().patches()
    per_release: dict[str, dict[str, tuple[str, str]]] = {}
    modules: dict[str, str] = {}
    for version in releases:
        wheel = matrix.wheel_for(version, sys.executable)
        by_name, registered = read_release(wheel)
        rows = {}
        for cls in registered:
            if cls.name.endswith(GENERATIVE):
                rows[cls.name] = classify(cls, by_name, version, patches)
                modules.setdefault(cls.name, cls.module)
        per_release[version] = rows
    names = sorted(modules)
    lines = [
        "# Targets: which model classes can serve an EAGLE-3 draft, per sglang release",
        "",
        f"Generated by `python tools/targets_table.py` on {_dt.date.today().isoformat()} from each release's own "
        "source "
        "(the classes sglang registers through `EntryClass` in `sglang/srt/models/*.py`, read from the wheel, nothing "
        "imported) and from the patch registry (`Patch.targets`). Do not edit by hand.",
        "",
        "**native**: the class has `set_eagle3_layers_to_capture` and `get_embed_and_head` and its forward hands the "
        "aux states on. **patched**: an eagle3-patches patch makes it work on that release (proven by that patch's "
        "tests with a tiny model of the class). **refused**: `eagle3_target_capability` refuses the launch at start "
        "with the reason. A static reading of the source: a class listed native has the code path; whether its "
        "captured states are the right ones is what the patch tests and the release matrix check for the targets "
        "they cover (DeepSeek-V3 / Kimi-K2.5, Qwen3-VL).",
        "",
        "| class | module | " + " | ".join(releases) + " |",
        "|---|---|" + "---|" * len(releases),
    ]
    reasons: dict[str, int] = {}
    for name in names:
        cells = []
        for version in releases:
            status, why = per_release[version].get(name, ("-", ""))
            if status == "refused":
                ref = reasons.setdefault(why, len(reasons) + 1)
                cells.append(f"refused [{ref}]")
            elif status == "patched":
                cells.append(f"patched ({why.split('`')[1]})")
            else:
                cells.append(status)
        lines.append(f"| `{name}` | `{modules[name]}` | " + " | ".join(cells) + " |")
    lines += ["", "Reasons:", ""]
    lines += [f"{n}. {why}" for why, n in reasons.items()]
    counts = {
        v: {s: sum(1 for st, _ in per_release[v].values() if st == s) for s in ("native", "patched", "refused")}
        for v in releases
    }
    lines += [
        "",
        "Totals: "
        + "; ".join(
            f"{v}: {c['native']} native, {c['patched']} patched, {c['refused']} refused" for v, c in counts.items()
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", help="comma list (default: the matrix's full list; 'pinned', 'newest-known' allowed)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    data = json.loads(matrix.DATA_FILE.read_text())
    spec = args.releases.split(",") if args.releases else data["full"]
    releases = matrix.resolve_releases(spec, data, newest="live" if args.releases else "known")
    args.out.write_text(build(releases))
    print(f"wrote {args.out} ({', '.join(releases)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
