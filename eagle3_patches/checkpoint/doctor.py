"""The preflight doctor: every EAGLE-3 misconfiguration that can be seen before a server loads.

Reads the target's and the draft's ``config.json``, ``model.safetensors.index.json`` and
safetensors headers, and the sglang launch flags; the only tensor data it reads are the
draft's small ``d2t`` / ``t2d``.  Never imports sglang.

    from eagle3_patches.checkpoint.doctor import doctor
    report = doctor("/models/Kimi-K2.5", "/models/Kimi-K2.5-eagle3",
                    launch="python -m sglang.launch_server --tp 8 --speculative-algorithm EAGLE3 ...")
    print(report.format()); report.exit_code        # 0 fine, 1 errors

Each finding (a :class:`~eagle3_patches.diagnostic.Diagnostic`) has a severity, a stable ``code`` (docs/doctor.md lists them all, with
the symptom each prevents), what is wrong, where, what was found and expected, and the fix.
The doctor never raises for a bad checkpoint: unreadable files become findings.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..diagnostic import ERROR, INFO, WARNING, Diagnostic
from ..errors import Eagle3ConfigError
from ..patches.eagle3_draft_strict_loading import expected_draft_tensors
from ..preflight import Setup, run_rules
from . import layer_ids as L
from .formats import (
    EAGLE,
    MODEL,
    SGLANG_EAGLE3,
    SPECULATORS,
    WeightFiles,
    checkpoint_dir,
    draft_view,
    list_weight_files,
    read_config,
    scan_shards,
    target_view,
)
from .launch_args import ALGORITHMS, LaunchArgs, parse_launch_args
from .releases import NEWEST_KNOWN, OLDEST_KNOWN, PINNED, facts, parse_version
from .safe_io import CheckpointError, open_checkpoint_file
from .safetensors_header import (
    CONFIG_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    TensorInfo,
    bytes_read,
    count_read,
    read_header,
)
from ..terminal import escape_terminal

_RANK = {ERROR: 0, WARNING: 1, INFO: 2}

#: findings of one code listed one by one; the rest are counted in one summary finding (a hostile checkpoint can have 100k tensors)
MAX_FINDINGS_PER_CODE = 20
#: d2t / t2d larger than this are not read (a corrupted shape, not a vocabulary)
MAX_MAP_BYTES = 64 << 20


# ====================================================================== report

@dataclass
class Report:
    findings: list[Diagnostic] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    _per_code: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    # -- building
    def add(self, severity: str, code: str, what: str, **kw: str) -> Diagnostic:
        """Record a finding; past :data:`MAX_FINDINGS_PER_CODE` of one code they are only counted (see :meth:`close`)."""
        return self.add_diagnostic(Diagnostic.make(severity, code, what, **kw))

    def add_diagnostic(self, f: Diagnostic) -> Diagnostic:
        key = (f.severity, f.code)
        self._per_code[key] = self._per_code.get(key, 0) + 1
        if self._per_code[key] <= MAX_FINDINGS_PER_CODE:
            self.findings.append(f)
        return f

    def close(self) -> None:
        """One summary finding per code whose findings were only counted."""
        for (severity, code), n in sorted(self._per_code.items()):
            if n > MAX_FINDINGS_PER_CODE:
                self.findings.append(Diagnostic(severity, code, f"{n - MAX_FINDINGS_PER_CODE} more [{code}] finding(s) like the above are not listed"))
        self._per_code.clear()

    # -- reading
    def by_severity(self, severity: str) -> list[Diagnostic]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def errors(self) -> list[Diagnostic]:
        return self.by_severity(ERROR)

    @property
    def warnings(self) -> list[Diagnostic]:
        return self.by_severity(WARNING)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def codes(self, severity: str | None = None) -> list[str]:
        return [f.code for f in self.findings if severity is None or f.severity == severity]

    def raise_for_errors(self) -> None:
        """Raise the first error as :class:`Eagle3ConfigError` (for guards and the converter)."""
        for f in self.errors:
            more = len(self.errors) - 1
            raise Eagle3ConfigError(diagnostic=f.replace(
                what=f.what + (f" (and {more} more error(s): run `eagle3-patches doctor` for all)" if more else "")))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "counts": {s: len(self.by_severity(s)) for s in (ERROR, WARNING, INFO)},
            "facts": self.facts,
            "findings": [f.as_dict() for f in sorted(self.findings, key=lambda f: _RANK.get(f.severity, 3))],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def format(self, *, show_info: bool = True, color: bool = False) -> str:
        """The human report; every string read from a checkpoint is printed escaped (:mod:`.terminal`)."""

        def paint(s: str, code: str) -> str:
            return f"\033[{code}m{s}\033[0m" if color else s

        lines = ["eagle3-patches doctor"]
        fx = self.facts
        setup = [f"sglang {fx.get('sglang_version')} ({fx.get('sglang_version_source')})"]
        if fx.get("algorithm"):
            setup.append(f"--speculative-algorithm {fx['algorithm']} ({fx.get('algorithm_source')})")
        if fx.get("tp"):
            setup.append(f"tp {fx['tp']}")
        setup.append("with eagle3-patches" if fx.get("with_patches") else "stock sglang (no eagle3-patches)")
        lines.append("  setup:  " + escape_terminal(", ".join(setup)))
        for role in ("target", "draft"):
            if fx.get(role):
                lines.append(f"  {role}: {'' if role == 'target' else ' '}{escape_terminal(fx[role])}")
        lines.append("")
        labels = {ERROR: paint("ERROR  ", "1;31"), WARNING: paint("WARNING", "1;33"), INFO: paint("info   ", "2")}
        for f in sorted(self.findings, key=lambda f: _RANK.get(f.severity, 3)):
            if f.severity == INFO and not show_info:
                continue
            lines.append(f.render(f"{labels.get(f.severity, f.severity)} [{f.code}] ", indent=8))
        n_e, n_w, n_i = (len(self.by_severity(s)) for s in (ERROR, WARNING, INFO))
        read = fx.get("bytes_read")
        tail = f" Read {_human(read)} in {fx.get('seconds', 0):.2f} s." if read is not None else ""
        verdict = paint("FAIL", "1;31") if n_e else paint("OK", "1;32")
        if lines[-1] != "":
            lines.append("")
        lines.append(f"{verdict}: {n_e} error(s), {n_w} warning(s), {n_i} note(s).{tail}")
        return "\n".join(lines)


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ====================================================================== context
@dataclass
class _Ctx(Setup):
    """The setup the preflight rules read, plus the report the doctor writes."""

    report: Report = field(default_factory=Report)

    def add(self, *a, **kw) -> Diagnostic:
        return self.report.add(*a, **kw)


def _guard(ctx: _Ctx, label: str, fn: Callable[[_Ctx], None]) -> None:
    try:
        fn(ctx)
    except Eagle3ConfigError as exc:
        ctx.report.add_diagnostic(exc.diagnostic)
    except Exception as exc:  # noqa: BLE001 - a doctor must never show a traceback
        ctx.add(
            ERROR,
            "internal-error",
            f"the doctor's {label} check could not finish: {type(exc).__name__}: {exc}",
            fix="this is a bug in eagle3-patches; please report it with the --json output",
        )


# ====================================================================== entry points
def doctor(
    target: os.PathLike | str | None = None,
    draft: os.PathLike | str | None = None,
    *,
    speculative_algorithm: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    sglang_version: str | None = None,
    launch: LaunchArgs | Sequence[str] | str | None = None,
    with_patches: bool | None = None,
    deep: bool = False,
    checkpoint_only: bool = False,
) -> Report:
    """Check a target + draft + launch configuration; never raises for a bad checkpoint.

    ``launch``: sglang launch flags or a whole launch command (list or string), or a
    :class:`LaunchArgs`; explicit arguments win over what it says.  ``with_patches``:
    whether the server runs under eagle3-patches (default: only when the launch command
    is wrapped in ``eagle3-patches run``).  ``deep``: accepted for compatibility and ignored:
    the target's whole index and every shard header are always read (docs/doctor.md, Cost).
    ``checkpoint_only``: only the checks of the checkpoints themselves (no algorithm, release
    support or launch-flag findings), as the converter runs them on its output.
    Raises ``ValueError`` only for unusable arguments (bad version string, unknown algorithm).
    """
    t0 = time.perf_counter()
    read0 = bytes_read()
    report = Report()
    if launch is None:
        la, launch_given = LaunchArgs(), False
    elif isinstance(launch, LaunchArgs):
        la, launch_given = launch, True
    else:
        la, launch_given = parse_launch_args(launch), True

    # sglang version
    if sglang_version is not None:
        version, vsrc = parse_version(sglang_version), "--sglang-version"
    else:
        from ..sglang_version import installed_sglang_version

        version = installed_sglang_version()
        vsrc = "installed"
        if version is None:
            version, vsrc = PINNED, "assumed: sglang is not installed here"
    rf = facts(version)

    # algorithm
    if speculative_algorithm is not None:
        algo = speculative_algorithm.strip().upper()
        if algo not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {speculative_algorithm!r} (sglang knows {', '.join(ALGORITHMS)})")
        asrc = "--speculative-algorithm"
    elif la.algorithm:
        algo, asrc = la.algorithm, "launch flags"
    elif launch_given:
        algo, asrc = None, "launch flags (none given)"
    else:
        algo, asrc = "EAGLE3", "assumed"

    ctx = _Ctx(
        report=report,
        version=version,
        rf=rf,
        algorithm=algo,
        launch=la,
        with_patches=bool(la.with_patches if with_patches is None else with_patches),
        tp=tp if tp is not None else la.tp,
        pp=pp if pp is not None else la.pp,
        checkpoint_only=checkpoint_only,
        facts=report.facts,
    )
    report.facts.update(
        sglang_version=str(version),
        sglang_version_source=vsrc,
        algorithm=algo,
        algorithm_source=asrc,
        with_patches=ctx.with_patches,
        tp=ctx.tp,
        pp=ctx.pp,
        launch=la.as_dict() if launch_given else None,
    )
    if not rf.in_table:
        report.add(
            INFO,
            "sglang-version-unknown",
            f"sglang {version} is outside the releases the doctor's table was read from "
            f"({'.'.join(map(str, OLDEST_KNOWN))}-{'.'.join(map(str, NEWEST_KNOWN))}); "
            "its rules are extrapolated from the nearest release",
            where=vsrc,
        )
    if vsrc.startswith("assumed"):
        report.add(INFO, "sglang-version-assumed", f"sglang is not installed here; checking against {version}", fix="pass --sglang-version V for the server's release")

    # paths: explicit arguments win over the launch command
    target = _pick_path(ctx, "target", target, la.model_path, "--model-path")
    draft = _pick_path(ctx, "draft", draft, la.draft_path, "--speculative-draft-model-path")

    if target is not None:
        _guard(ctx, "target config", lambda c: _load_target(c, target))
        if ctx.target is not None:
            _guard(ctx, "target weights", _check_target_weights)
    if draft is not None:
        _guard(ctx, "draft config", lambda c: _load_draft(c, draft))
        if ctx.draft is not None:
            _guard(ctx, "draft weights", _check_draft_weights)
            _guard(ctx, "draft format", _check_draft_format)
            _guard(ctx, "draft tensors", _check_draft_tensors)
            _guard(ctx, "d2t", _check_d2t)
            _guard(ctx, "dtypes", _check_dtypes)
    if ctx.draft is not None and ctx.target is not None:
        _guard(ctx, "sizes", _check_sizes)
    if ctx.draft is not None:
        _guard(ctx, "fc shape", _check_fc_shape)
        _guard(ctx, "aux layer ids", _check_layer_ids)
    if not checkpoint_only:
        _guard(ctx, "algorithm", _check_algorithm)
        if ctx.target is not None:
            _guard(ctx, "target release support", _check_target_release)
    # the preflight rule of every sglang bug this library knows (each in its patch module)
    import eagle3_patches

    run_rules(ctx, eagle3_patches.get_registry().patches(), ctx.report.add_diagnostic,
              lambda label, fn: _guard(ctx, label, lambda c: fn()))
    if target is None and draft is None:
        report.add(ERROR, "nothing-to-check", "neither a target nor a draft was given", fix="pass --target PATH and --draft PATH (or a launch command naming them)")

    report.close()
    report.facts["bytes_read"] = bytes_read() - read0
    report.facts["seconds"] = round(time.perf_counter() - t0, 4)
    return report


def check_draft(
    draft: os.PathLike | str,
    *,
    target: os.PathLike | str | None = None,
    sglang_version: str | None = None,
    with_patches: bool | None = None,
) -> Report:
    """The doctor's checks of a draft checkpoint (plus the cross-checks with ``target`` when given), for EAGLE3.

    Server-setup findings (release support, launch flags) are left out: see :func:`doctor`.
    """
    return doctor(
        target, draft, speculative_algorithm="EAGLE3", sglang_version=sglang_version, with_patches=with_patches, checkpoint_only=True
    )


def _pick_path(ctx: _Ctx, role: str, explicit, from_launch, flag: str):
    if explicit is not None and from_launch is not None and os.path.abspath(str(explicit)) != os.path.abspath(str(from_launch)):
        ctx.add(
            WARNING,
            "path-differs-from-launch",
            f"the {role} checked is not the one the launch command names",
            where=flag,
            found=str(from_launch),
            expected=str(explicit),
            fix=f"check the {role} the server will load",
        )
    path = explicit if explicit is not None else from_launch
    if path is not None:
        ctx.report.facts[f"{role}_path"] = str(path)
    return path


# ====================================================================== target
def _load_target(ctx: _Ctx, path) -> None:
    d = checkpoint_dir(path, "target")
    ctx.target_dir = d
    cfg = read_config(d, "target")
    tv = target_view(cfg)
    ctx.target = tv
    for p in tv.problems:
        ctx.add(ERROR, "target-config-field", f"target config field {p.where} is unusable", where=ctx.tcfg(p.where.removeprefix(tv.text_prefix)), found=p.found, expected=p.expected, fix="repair the target's config.json")
    ctx.report.facts["target"] = (
        f"{d} ({tv.arch or tv.model_type or 'unknown architecture'}, {tv.num_layers} layers, hidden {tv.hidden}, vocab {tv.vocab}, dtype {tv.dtype})"
    )
    if not tv.deepseek_family:
        ctx.add(
            INFO,
            "target-architecture",
            f"target architecture {tv.arch or '?'} is not in the DeepSeek-V3 family; capture rules are checked as sglang's DeepseekV2ForCausalLM applies them",
            where=ctx.tcfg("architectures", top=True),
        )


_TARGET_CHECKED = ("embed_tokens.weight", "lm_head.weight")  # the target tensors whose shapes are checked


def _check_target_weights(ctx: _Ctx) -> None:
    """Every shard header (validated by the safetensors library) and the whole index against them."""
    d = ctx.target_dir
    wf = list_weight_files(d)
    if not wf.files:
        if wf.pickles:
            ctx.add(WARNING, "target-no-safetensors", "the target has only pickle weights; the doctor reads safetensors only", where=str(d), found=", ".join(p.name for p in wf.pickles[:3]))
        else:
            ctx.add(ERROR, "not-a-checkpoint", "the target directory holds no *.safetensors weights", where=str(d), fix="pass the directory that holds the target's weights")
        return
    missing = {p for p in wf.files if not os.path.lexists(p)}
    if missing:
        ctx.add(ERROR, "safetensors-index", f"{len(missing)} shard(s) named by the target's index are missing", where=str(wf.index), found=", ".join(sorted(str(p.relative_to(d)) for p in missing)[:5]), fix="finish the download")
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
        ctx.add(ERROR, "safetensors-index", f"{len(absent)} tensor(s) in the target's index are not in the shard it names", where=str(wf.index), found=", ".join(absent[:5]), fix="re-download the index and shards together")
    tv = ctx.target
    for t in ctx.target_tensors.values():
        if len(t.shape) != 2 or (tv.hidden and tv.vocab and (t.shape[1] != tv.hidden or t.shape[0] < tv.vocab)):
            ctx.add(ERROR, "target-config-vs-weights", f"the target's {t.name} does not match its config", where=f"{d / t.file}: {t.name}", found=str(list(t.shape)), expected=f"[{tv.vocab}, {tv.hidden}] (vocab_size, hidden_size)", fix="the config.json and the weights belong to different models")


# ====================================================================== draft: config and weights
_LAYER0 = re.compile(r"^(model\.)?layers\.0\.")


def _canonical(raw: str) -> tuple[str, str]:
    """(canonical name, naming) for a draft tensor name; naming: sglang / speculators / model-prefix / map."""
    if "d2t" in raw:
        return "d2t", "map"
    if "t2d" in raw:
        return "t2d", "map"
    m = _LAYER0.match(raw)
    if m:
        return "midlayer." + raw[m.end():], "speculators"
    if raw.startswith("model.") and raw != "model.lm_head.weight":
        return raw[len("model."):], "model-prefix"
    return raw, "sglang"


def _load_draft(ctx: _Ctx, path) -> None:
    d = checkpoint_dir(path, "draft")
    ctx.draft_dir = d
    cfg = read_config(d, "draft")
    dv = draft_view(cfg)
    ctx.draft = dv
    for p in dv.problems:
        ctx.add(ERROR, "draft-config-field", f"draft config field {p.where} is unusable", where=ctx.dcfg(p.where), found=p.found, expected=p.expected, fix="repair the draft's config.json")
    ids = f"aux ids {dv.aux_ids} ({dv.convention}{'' if dv.convention_stated else ', assumed'})" if dv.aux_ids is not None else "no aux ids"
    ctx.report.facts["draft"] = (
        f"{d} ({dv.format} format, {', '.join(dv.architectures) or '?'}, hidden {dv.hidden}, "
        f"draft vocab {dv.draft_vocab}, {ids})"
    )


def _check_draft_weights(ctx: _Ctx) -> None:
    d = ctx.draft_dir
    wf: WeightFiles = list_weight_files(d)
    if not wf.files:
        if wf.pickles:
            ctx.add(ERROR, "draft-no-safetensors", "the draft has only pickle weights; eagle3-patches reads safetensors only", where=str(d), found=", ".join(p.name for p in wf.pickles[:3]), fix="save the draft with safetensors (save_pretrained(safe_serialization=True))")
        else:
            ctx.add(ERROR, "not-a-checkpoint", "the draft directory holds no *.safetensors weights", where=str(d), fix="pass the directory that holds the draft's weights")
        return
    scan = scan_shards(wf, "draft")
    for exc in scan.errors:
        ctx.report.add_diagnostic(exc.diagnostic)
    for name, first, second in scan.duplicates:
        ctx.add(ERROR, "duplicate-tensor", f"tensor {name} is stored in two shards", where=str(d), found=f"{first}, {second}", fix="re-export the draft")
    if scan.absent:
        ctx.add(ERROR, "safetensors-index", f"{len(scan.absent)} tensor(s) in the draft's index are not in the shard it names", where=str(wf.index), found=", ".join(scan.absent[:5]), fix="re-export the draft")
    raw, ok = scan.tensors, scan.ok
    canon: dict[str, TensorInfo] = {}
    names: dict[str, str] = {}
    naming: dict[str, list[str]] = {}
    for name, t in raw.items():
        c, kind = _canonical(name)
        naming.setdefault(kind, []).append(name)
        if c in canon:
            ctx.add(ERROR, "duplicate-tensor", f"tensors {names[c]} and {name} load into the same parameter", where=str(d), fix="keep one of them")
            continue
        canon[c], names[c] = t, name
    ctx.draft_tensors, ctx.draft_raw_names = canon, names
    ctx.draft_weights_read = ok
    ctx.report.facts["draft_tensors"] = len(raw)
    ctx.draft_naming = naming


def _check_draft_format(ctx: _Ctx) -> None:
    dv = ctx.draft
    if dv.format == SPECULATORS:
        # that stock sglang cannot read it: speculators_draft_config's preflight rule; what no sglang can run,
        # in the converter's words (the converter and speculators_draft_config refuse it with the same message)
        from .convert import unsupported

        refusal = unsupported(dv.config, ctx.draft_raw_names.values(), config_path=ctx.dcfg())
        if refusal is not None:
            ctx.report.add_diagnostic(refusal.diagnostic.replace(code="draft-unsupported-architecture"))
        return
    if dv.format == SGLANG_EAGLE3:
        if "LlamaForCausalLMEagle3" not in dv.architectures:
            ctx.add(WARNING, "draft-architecture", "the draft's architecture is not LlamaForCausalLMEagle3; the doctor's key and shape checks assume it", where=ctx.dcfg("architectures"), found=str(dv.architectures))
        if dv.model_type is None:
            ctx.add(ERROR, "draft-config-field", "the draft config has no model_type; transformers' AutoConfig (and so sglang) cannot read it", where=ctx.dcfg("model_type"), expected='"llama"', fix='add "model_type": "llama"')
        if dv.num_layers is not None and dv.num_layers != 1:
            ctx.add(ERROR, "draft-num-layers", "sglang's LlamaForCausalLMEagle3 supports exactly one decoder layer", where=ctx.dcfg("num_hidden_layers"), found=str(dv.num_layers), expected="1", fix="set num_hidden_layers to 1 (an EAGLE-3 draft has one layer)")
        # layers.0.* names: eagle3_draft_strict_loading's preflight rule
    elif dv.format == EAGLE:
        pass  # judged by the algorithm check
    elif dv.format == MODEL:
        ctx.add(
            WARNING,
            "draft-not-eagle3",
            "the draft config does not look like an EAGLE-3 draft (no Eagle3 architecture, no eagle_config, no speculators_model_type)",
            where=ctx.dcfg("architectures"),
            found=str(dv.architectures),
        )


# ---------------------------------------------------------------- tensors
def _check_draft_tensors(ctx: _Ctx) -> None:
    dv = ctx.draft
    if not ctx.draft_weights_read and not ctx.draft_tensors:
        return
    exp = expected_draft_tensors(ctx)  # unknown / missing keys: eagle3_draft_strict_loading's preflight rule
    d = ctx.draft_dir
    for name, (shape, _) in exp.items():
        t = ctx.draft_tensors.get(name)
        if t is None or shape is None or name in ("d2t", "t2d", "fc.weight"):  # judged by the d2t and fc checks
            continue
        if t.shape != shape:
            ctx.add(
                ERROR,
                "tensor-shape",
                f"{ctx.draft_raw_names[name]} has the wrong shape for the draft config" + (" (sglang's loader asserts on it at start)" if name != "embed_tokens.weight" else ""),
                where=f"{d / t.file}: {ctx.draft_raw_names[name]}",
                found=str(list(t.shape)),
                expected=str(list(shape)),
                fix=_shape_fix(ctx, name, t.shape, shape),
            )
    if "d2t" in ctx.draft_tensors and "t2d" not in ctx.draft_tensors:
        ctx.add(WARNING, "t2d-missing", "the draft has d2t but no t2d (sglang ignores t2d; SpecForge's exporter and other servers require it)", where=str(d), fix="re-export t2d (bool mask over the target vocabulary)")
    if "embed_tokens.weight" not in ctx.draft_tensors:
        ctx.add(INFO, "embed-from-target", "the draft has no embed_tokens.weight; sglang uses the target's embedding (as it does anyway for EAGLE-3)", where=str(d))
    if dv.draft_vocab is None and dv.is_eagle3:
        ctx.add(WARNING, "draft-vocab-missing", "the draft config has no draft_vocab_size: sglang then replaces the draft's lm_head by the target's full one", where=ctx.dcfg("draft_vocab_size"), fix="set draft_vocab_size to the number of rows of lm_head.weight")
    if dv.tie_word_embeddings and dv.is_eagle3:
        ctx.add(WARNING, "draft-tied-embeddings", "tie_word_embeddings is true: sglang makes the draft's lm_head the target's embedding and ignores lm_head.weight", where=ctx.dcfg("tie_word_embeddings"), fix="set tie_word_embeddings to false unless the draft really was trained tied")


def _shape_fix(ctx: _Ctx, name: str, found, expected) -> str:
    if name == "lm_head.weight":
        return "draft_vocab_size must equal the rows of lm_head.weight"
    if name == "t2d":
        return "t2d has one entry per target token"
    return "the config.json does not belong to these weights (hidden_size, heads, head_dim, intermediate_size)"


# ---------------------------------------------------------------- d2t / t2d
def _read_small(ctx: _Ctx, name: str):
    t = ctx.draft_tensors.get(name)
    if t is None:
        return None
    if t.nbytes > MAX_MAP_BYTES:
        ctx.add(ERROR, f"{name}-invalid", f"{name} is implausibly large ({t.nbytes} bytes); not read", where=f"{ctx.draft_dir / t.file}: {ctx.draft_raw_names[name]}", found=str(list(t.shape)), fix="re-export it")
        return None
    from safetensors import safe_open  # a dependency

    where = f"{ctx.draft_dir / t.file}: {ctx.draft_raw_names[name]}"
    try:
        with open_checkpoint_file(ctx.draft_dir, t.file, what="draft shard") as cf, safe_open(cf.library_path, framework="np") as f:
            value = f.get_tensor(ctx.draft_raw_names[name])
    except Exception as exc:  # noqa: BLE001 - the library's refusal is the finding
        ctx.add(ERROR, f"{name}-invalid", f"{name} cannot be read", where=where, found=f"{type(exc).__name__}: {exc}"[:300], fix="re-export it")
        return None
    count_read(t.nbytes)
    return value


def _check_d2t(ctx: _Ctx) -> None:
    dv = ctx.draft
    if "d2t" not in ctx.draft_tensors or not ctx.draft_weights_read:
        return
    from .d2t import check_d2t

    target_vocab = ctx.target.vocab if ctx.target and ctx.target.vocab else dv.vocab
    t = ctx.draft_tensors["d2t"]
    where = f"{ctx.draft_dir / t.file}: {ctx.draft_raw_names['d2t']}"
    if t.dtype not in INT_DTYPES or len(t.shape) != 1:
        ctx.add(ERROR, "d2t-invalid", f"d2t is {t.dtype} {list(t.shape)}, expected a 1-D integer tensor of offsets", where=where, found=f"{t.dtype} {list(t.shape)}", expected=f"I64 [{dv.effective_draft_vocab}]", fix="save d2t as 1-D int64 offsets (d2t[i] = target_id[i] - i)")
        return
    if target_vocab is None:
        return
    d2t = _read_small(ctx, "d2t")
    if d2t is None:
        return
    problem = check_d2t(d2t, target_vocab=target_vocab, draft_vocab=dv.draft_vocab)
    if problem is not None:
        code = "d2t-length" if problem.kind == "length" else "d2t-invalid"
        ctx.add(ERROR, code, problem.what, where=where, found=f"{t.dtype} {list(t.shape)}", fix=problem.fix)
        return
    # t2d: sglang skips it, but an inconsistent one says the export went wrong
    if "t2d" in ctx.draft_tensors:
        tt = ctx.draft_tensors["t2d"]
        twhere = f"{ctx.draft_dir / tt.file}: {ctx.draft_raw_names['t2d']}"
        if tt.dtype != "BOOL" or tt.shape != (target_vocab,):
            ctx.add(WARNING, "t2d-invalid", "t2d is not a bool mask over the target vocabulary", where=twhere, found=f"{tt.dtype} {list(tt.shape)}", expected=f"BOOL [{target_vocab}]", fix="re-export t2d")
            return
        t2d = _read_small(ctx, "t2d")
        if t2d is None:
            return
        hot = d2t.astype(np.int64) + np.arange(d2t.shape[0])
        if int(t2d.sum()) != d2t.shape[0] or not bool(t2d[hot].all()):
            ctx.add(WARNING, "t2d-invalid", "t2d does not mark exactly the target ids that d2t maps to (sglang ignores t2d, but d2t and t2d came from different exports)", where=twhere, found=f"{int(t2d.sum())} marked, {int(t2d[hot].sum())} of d2t's targets marked", expected=f"{d2t.shape[0]} marked, all of d2t's targets", fix="re-export d2t and t2d together")


# ---------------------------------------------------------------- dtypes
def _resolve_dtype(config_dtype: str | None, flag: str) -> tuple[str | None, str]:
    """(dtype sglang would run, reason) following ``_get_and_verify_dtype`` (0.5.9)."""
    flag = (flag or "auto").lower()
    if flag != "auto":
        canon = {"half": "float16", "float": "float32", "bf16": "bfloat16"}.get(flag, flag)
        return canon, f"--dtype {flag}"
    cd = (config_dtype or "").lower()
    if cd in ("", "float32", "float"):
        return "float16", (f"config dtype {cd} -> float16 (sglang's auto rule)" if cd else "no dtype in config -> float32 -> float16 (sglang's auto rule)")
    canon = {"half": "float16"}.get(cd, cd)
    return canon, f"config dtype {cd}"


def _check_dtypes(ctx: _Ctx) -> None:
    dv = ctx.draft
    flag = ctx.launch.dtype
    ddt, dwhy = _resolve_dtype(dv.dtype, flag)
    if ctx.target is not None:
        tdt, twhy = _resolve_dtype(ctx.target.dtype, flag)
        if ddt != tdt:
            ctx.add(
                ERROR,
                "dtype-mismatch",
                f"the draft would run in {ddt} but the target's aux hidden states are {tdt}: the draft's fc raises a dtype error at the first forward",
                where=ctx.dcfg("torch_dtype"),
                found=f"draft: {dwhy}; target: {twhy}",
                expected=f"the draft running in {tdt}",
                fix=f'set "torch_dtype": "{tdt}" in the draft config.json (or launch with --dtype {tdt})',
            )
    elif ddt == "float16" and flag == "auto" and (dv.dtype or "float32") in ("float32", "float"):
        ctx.add(WARNING, "dtype-float32-draft", f"sglang runs this draft in float16 ({dwhy}); with a bfloat16 target the fc raises a dtype error", where=ctx.dcfg("torch_dtype"), fix='state the target\'s dtype: "torch_dtype": "bfloat16"')
    quantized = isinstance(dv.config.get("quantization_config"), dict)
    for name, t in ctx.draft_tensors.items():
        raw = ctx.draft_raw_names[name]
        if name in ("d2t", "t2d"):
            continue
        if t.dtype not in FLOAT_DTYPES and not quantized:
            ctx.add(ERROR, "tensor-dtype", f"{raw} is stored as {t.dtype}, not a floating-point dtype: the loader copies raw integers into a float parameter", where=f"{ctx.draft_dir / t.file}: {raw}", found=t.dtype, expected=" / ".join(sorted(FLOAT_DTYPES)), fix="re-export the draft's weights as floats")
    stored = sorted({t.dtype for n, t in ctx.draft_tensors.items() if n not in ("d2t", "t2d") and t.dtype in FLOAT_DTYPES})
    want = CONFIG_DTYPES.get(ddt or "")
    if stored and want and stored != [want]:
        ctx.add(INFO, "tensor-dtype-cast", f"draft weights are stored as {', '.join(stored)} and cast to {ddt} at load", where=str(ctx.draft_dir))


# ---------------------------------------------------------------- sizes
def _check_sizes(ctx: _Ctx) -> None:
    dv, tv = ctx.draft, ctx.target
    if dv.hidden and tv.hidden and dv.hidden != tv.hidden:
        ctx.add(
            ERROR,
            "hidden-mismatch",
            "the draft's hidden size differs from the target's: sglang gives the draft the target's embedding, so its input is the wrong width",
            where=ctx.dcfg(dv.layer_prefix + "hidden_size"),
            found=f"draft {dv.hidden}",
            expected=f"target {tv.hidden}",
            fix="this draft was trained for another target",
        )
    if dv.target_hidden is not None and tv.hidden and dv.target_hidden != tv.hidden:
        ctx.add(ERROR, "target-hidden-size", "the draft's target_hidden_size is not the target's hidden size", where=ctx.dcfg("target_hidden_size"), found=str(dv.target_hidden), expected=str(tv.hidden), fix="this draft was trained for another target (or fix target_hidden_size)")
    if dv.vocab and tv.vocab and dv.vocab != tv.vocab:
        ctx.add(ERROR, "vocab-mismatch", "the draft's vocab_size differs from the target's: d2t/t2d and the shared embedding index the target vocabulary", where=ctx.dcfg(dv.layer_prefix + "vocab_size"), found=f"draft {dv.vocab}", expected=f"target {tv.vocab}", fix="this draft was trained for another target's tokenizer")
    if dv.draft_vocab and dv.vocab and dv.draft_vocab > dv.vocab:
        ctx.add(ERROR, "draft-vocab-size", "draft_vocab_size is larger than vocab_size", where=ctx.dcfg("draft_vocab_size"), found=str(dv.draft_vocab), expected=f"<= {dv.vocab}", fix="fix draft_vocab_size (the rows of lm_head.weight)")
    if ctx.tp > 1:
        bad = []
        if dv.heads and dv.heads % ctx.tp:
            bad.append(f"num_attention_heads {dv.heads}")
        kv = dv.kv_heads
        if kv and (kv % ctx.tp if kv >= ctx.tp else ctx.tp % kv):
            bad.append(f"num_key_value_heads {kv}")
        if dv.intermediate and dv.intermediate % ctx.tp:
            bad.append(f"intermediate_size {dv.intermediate}")
        if bad:
            ctx.add(ERROR, "tp-draft-split", f"the draft cannot be split over tp {ctx.tp}", where=ctx.dcfg(), found=", ".join(bad), expected=f"divisible by {ctx.tp}", fix="use a tp size that divides the draft's heads and intermediate size")


# ---------------------------------------------------------------- fc
def _check_fc_shape(ctx: _Ctx) -> None:
    """fc.weight is a [hidden, k x target hidden] matrix (its width against the aux ids: eagle3_fc_guard's rule)."""
    dv = ctx.draft
    fc = ctx.draft_tensors.get("fc.weight")
    th, k = ctx.fc_input()
    if fc is not None and len(fc.shape) != 2:
        ctx.add(ERROR, "tensor-shape", "fc.weight is not a matrix", where=ctx.draft_tensor_where("fc.weight"), found=str(list(fc.shape)), expected=f"[{dv.hidden}, {k} x {th}]", fix="re-export the draft")
    elif fc is not None and th and dv.hidden and fc.shape[0] != dv.hidden:
        ctx.add(ERROR, "tensor-shape", "fc.weight's output width is not the draft's hidden size", where=ctx.draft_tensor_where("fc.weight"), found=str(list(fc.shape)), expected=f"[{dv.hidden}, {fc.shape[1]}]", fix="the config.json does not belong to these weights")


# ---------------------------------------------------------------- layer ids
def _check_layer_ids(ctx: _Ctx) -> None:
    """The ids as the draft states them; what sglang does with them is judged by the rules of
    aux_capture_validation (ids sglang cannot capture) and layer_id_convention (what they mean)."""
    dv = ctx.draft
    if not dv.is_eagle3:
        return
    n = ctx.target.num_layers if ctx.target else None
    where = ctx.dcfg(dv.aux_ids_where)
    if dv.aux_ids is None:
        if dv.ignored_top_level_ids is not None:
            ctx.add(ERROR, "aux-ids-ignored", "the layer ids are at the top level of config.json, where sglang never reads them; it uses its defaults instead", where=ctx.dcfg("eagle_aux_hidden_state_layer_ids"), found=str(dv.ignored_top_level_ids), expected="eagle_config.eagle_aux_hidden_state_layer_ids", fix="move them into eagle_config (and state eagle_config.%s)" % L.CONVENTION_KEY)
        defaults = L.default_capture_points(n) if n else None
        outputs = [p - 1 for p in defaults] if defaults else None
        ctx.add(
            ERROR,
            "aux-ids-missing",
            "the draft config names no aux layer ids: sglang captures its defaults "
            + (f"(before layers {defaults} = the outputs of layers {outputs})" if defaults else "[2, n//2, n-3] (before those layers)"),
            where=where,
            found="no eagle_config.eagle_aux_hidden_state_layer_ids",
            fix="state the ids the draft was trained on in eagle_config.eagle_aux_hidden_state_layer_ids "
            f'(and eagle_config.{L.CONVENTION_KEY} = "{L.OUTPUT_OF_LAYER}" for sglang <= 0.5.12 ids)',
        )
        return
    ids = dv.aux_ids
    if not ids:
        ctx.add(ERROR, "aux-ids-invalid", "the aux layer id list is empty", where=where, found="[]", fix="list the 3 target layers the draft was trained on")
        return
    intended = dv.output_ids
    if not dv.convention_stated and dv.format == SGLANG_EAGLE3:
        ctx.add(INFO, "aux-ids-convention-assumed", f"the draft config does not state what its ids mean; assuming {L.OUTPUT_OF_LAYER} (sglang <= 0.5.12 / SpecForge: id i = output of layer i)", where=where, fix=f'state it: eagle_config.{L.CONVENTION_KEY} = "{L.OUTPUT_OF_LAYER}" (eagle3-patches convert writes it)')
    if dv.format == SPECULATORS:
        # what the converted config will say, range-checked against the target
        if n is not None:
            bad = [i for i, o in zip(ids, intended) if not 0 <= o <= n - 2]
            if bad:
                ctx.add(ERROR, "aux-ids-out-of-range", f"speculators ids {bad} (HF hidden_states index) have no capture point in sglang on a {n}-layer target (valid 1..{n - 1})", where=where, found=str(ids), expected=f"ids in 1..{n - 1}", fix="id 0 (embeddings) and id num_layers (final state) cannot be captured by sglang: retrain on inner layers")
            else:
                ctx.add(INFO, "aux-ids-capture", f"ids {ids} (speculators' meaning) are the outputs of layers {intended} of {n} (what `eagle3-patches convert` writes, and what speculators_draft_config hands sglang)", where=where)
        return
    cap = ctx.capture()
    ctx.report.facts["capture"] = {
        "ids": ids,
        "convention": dv.convention,
        "convention_stated": dv.convention_stated,
        "capture_before_layers": list(cap.points),
        "captured_outputs": list(cap.outputs),
        "intended_outputs": intended,
        "num_layers": n,
    }
    if n is not None:
        ctx.add(INFO, "aux-ids-capture", cap.describe(), where=where)


# ---------------------------------------------------------------- algorithm
def _check_algorithm(ctx: _Ctx) -> None:
    algo = ctx.algorithm
    if ctx.draft is None:
        return
    is3, why = ctx.draft_is_eagle3()
    if algo is None:
        ctx.add(WARNING, "no-speculation", "the launch command names a draft but no --speculative-algorithm: sglang does not speculate at all", where="--speculative-algorithm", fix="add --speculative-algorithm EAGLE3")
        return
    # EAGLE / NEXTN with an EAGLE-3 draft: eagle3_algorithm_guard's preflight rule
    if algo == "EAGLE3" and not is3 and ctx.draft.format != MODEL:
        ctx.add(ERROR, "algorithm-eagle3-with-non-eagle3-draft", f"--speculative-algorithm EAGLE3 with a draft that is not EAGLE-3 ({why})", where="--speculative-algorithm", found="EAGLE3", expected="EAGLE for an EAGLE-1/2 draft", fix="use --speculative-algorithm EAGLE for this draft, or an EAGLE-3 draft")
    elif algo in ("STANDALONE", "NGRAM"):
        ctx.add(INFO, "algorithm-not-eagle", f"--speculative-algorithm {algo}: the EAGLE-3 checks do not apply", where="--speculative-algorithm")


def _check_target_release(ctx: _Ctx) -> None:
    tv = ctx.target
    if tv.is_kimi_k25 and ctx.algorithm in ("EAGLE", "EAGLE3", "NEXTN") and not ctx.rf.has_kimi_k25:
        ctx.add(ERROR, "kimi-k25-unsupported", f"sglang {ctx.version} has no KimiK25ForConditionalGeneration (models/kimi_k25.py arrived in 0.5.9)", where=ctx.tcfg("architectures", top=True), found=str(tv.architectures), fix="use sglang 0.5.9 with eagle3-patches, or >= 0.5.10")


