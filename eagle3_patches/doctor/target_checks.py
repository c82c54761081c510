"""The doctor's checks of the target checkpoint: its config, every shard header and the whole index, and whether
this release can serve it."""

from __future__ import annotations

import os

from ..checkpoint.formats import (
    checkpoint_dir,
    list_weight_files,
    read_config,
    target_view,
)
from ..checkpoint.safe_io import CheckpointError
from ..checkpoint.safetensors_header import read_header
from ..diagnostic import ERROR, INFO, WARNING
from .context import Context


def load_target(ctx: Context, path) -> None:
    d = checkpoint_dir(path, "target")
    ctx.target_dir = d
    cfg = read_config(d, "target")
    tv = target_view(cfg)
    ctx.target = tv
    for p in tv.problems:
        ctx.add(
            ERROR,
            "target-config-field",
            f"target config field {p.where} is unusable",
            where=ctx.tcfg(p.where.removeprefix(tv.text_prefix)),
            found=p.found,
            expected=p.expected,
            fix="repair the target's config.json",
        )
    ctx.report.facts["target"] = (
        f"{d} ({tv.arch or tv.model_type or 'unknown architecture'}, {tv.num_layers} layers, hidden {tv.hidden}, "
        f"vocab {tv.vocab}, dtype {tv.dtype})"
    )
    if not tv.deepseek_family:
        ctx.add(
            INFO,
            "target-architecture",
            f"target architecture {tv.arch or '?'} is not in the DeepSeek-V3 family; capture rules are checked as "
            "sglang's DeepseekV2ForCausalLM applies them",
            where=ctx.tcfg("architectures", top=True),
        )


_TARGET_CHECKED = ("embed_tokens.weight", "lm_head.weight")  # the target tensors whose shapes are checked


def check_target_weights(ctx: Context) -> None:
    """Every shard header (validated by the safetensors library) and the whole index against them."""
    d = ctx.target_path
    wf = list_weight_files(d)
    if not wf.files:
        if wf.pickles:
            ctx.add(
                WARNING,
                "target-no-safetensors",
                "the target has only pickle weights; the doctor reads safetensors only",
                where=str(d),
                found=", ".join(p.name for p in wf.pickles[:3]),
            )
        else:
            ctx.add(
                ERROR,
                "not-a-checkpoint",
                "the target directory holds no *.safetensors weights",
                where=str(d),
                fix="pass the directory that holds the target's weights",
            )
        return
    missing = {p for p in wf.files if not os.path.lexists(p)}
    if missing:
        ctx.add(
            ERROR,
            "safetensors-index",
            f"{len(missing)} shard(s) named by the target's index are missing",
            where=str(wf.index),
            found=", ".join(sorted(str(p.relative_to(d)) for p in missing)[:5]),
            fix="finish the download",
        )
    by_file: dict[str, list[str]] = {f: [] for f in set((wf.weight_map or {}).values())}
    for name, f in (wf.weight_map or {}).items():
        by_file[f].append(name)
    absent: list[str] = []
    found: set[str] = set()
    read = n_tensors = 0
    for p in wf.files:
        if p in missing:
            continue
        try:
            h = read_header(p, root=d)
            read += 1
            n_tensors += len(h.names)
            expect = by_file.get(h.file)
            if expect:
                present = set(h.names)
                if not present.issuperset(expect):
                    absent.extend(n for n in expect if n not in present)
            # pragma: no mutate core/ReplaceComparisonOperator_Lt_LtE: with both names found the loop's `suffix not in
            # found` test admits nothing more: only the scan's length changes
            if len(found) < len(_TARGET_CHECKED):
                for hit in [n for n in h.names if n.endswith(_TARGET_CHECKED)]:
                    suffix = next(s for s in _TARGET_CHECKED if hit.endswith(s))
                    if suffix not in found and (hit == suffix or hit.endswith("." + suffix)):
                        found.add(suffix)
                        ctx.target_tensors[hit] = h.tensors[hit]
        except CheckpointError as exc:
            ctx.report.add_diagnostic(exc.diagnostic)
    ctx.report.facts["target_headers_read"] = f"{read} of {len(wf.files)} shard header(s), {n_tensors} tensors"
    if absent:
        ctx.add(
            ERROR,
            "safetensors-index",
            f"{len(absent)} tensor(s) in the target's index are not in the shard it names",
            where=str(wf.index),
            found=", ".join(absent[:5]),
            fix="re-download the index and shards together",
        )
    tv = ctx.target_view
    for t in ctx.target_tensors.values():
        if len(t.shape) != 2 or (tv.hidden and tv.vocab and (t.shape[1] != tv.hidden or t.shape[0] < tv.vocab)):
            ctx.add(
                ERROR,
                "target-config-vs-weights",
                f"the target's {t.name} does not match its config",
                where=f"{d / t.file}: {t.name}",
                found=str(list(t.shape)),
                expected=f"[{tv.vocab}, {tv.hidden}] (vocab_size, hidden_size)",
                fix="the config.json and the weights belong to different models",
            )


def check_target_release(ctx: Context) -> None:
    tv = ctx.target_view
    if tv.is_kimi_k25 and ctx.algorithm in ("EAGLE", "EAGLE3", "NEXTN") and not ctx.rf.has_kimi_k25:
        ctx.add(
            ERROR,
            "kimi-k25-unsupported",
            f"sglang {ctx.version} has no KimiK25ForConditionalGeneration (models/kimi_k25.py arrived in 0.5.9)",
            where=ctx.tcfg("architectures", top=True),
            found=str(tv.architectures),
            fix="use sglang 0.5.9 with eagle3-patches, or >= 0.5.10",
        )
