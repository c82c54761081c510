"""The doctor's checks of the draft checkpoint: its config and format, every shard header, the tensors sglang's
draft loads, ``d2t`` / ``t2d`` and the dtypes it will run in."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..checkpoint.conversion_plan import unsupported
from ..checkpoint.d2t import check_d2t as check_d2t_values
from ..checkpoint.draft_layouts import BY_KEY, EAGLE3_KINDS, KIND_EAGLE1, SERVED, classify, verdict
from ..checkpoint.draft_names import draft_tensor_name
from ..checkpoint.formats import (
    EAGLE,
    LLAMA_DRAFT_ARCH,
    MODEL,
    SGLANG_EAGLE3,
    SPECULATORS,
    WeightFiles,
    checkpoint_dir,
    draft_view,
    list_weight_files,
    read_config,
    scan_shards,
)
from ..checkpoint.safe_io import open_checkpoint_file
from ..checkpoint.safetensors_header import (
    CONFIG_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    TensorInfo,
    count_read,
)
from ..diagnostic import ERROR, INFO, WARNING
from ..patches.eagle3_draft_config_fields import reads_under_patches
from ..patches.eagle3_draft_strict_loading import expected_draft_tensors
from .context import Context

#: d2t / t2d larger than this are not read (a corrupted shape, not a vocabulary)
MAX_MAP_BYTES = 64 << 20


def load_draft(ctx: Context, path) -> None:
    d = checkpoint_dir(path, "draft")
    ctx.draft_dir = d
    cfg = read_config(d, "draft")
    dv = draft_view(cfg)
    ctx.draft = dv
    for p in dv.problems:
        ctx.add(
            ERROR,
            "draft-config-field",
            f"draft config field {p.where} is unusable",
            where=ctx.dcfg(p.where),
            found=p.found,
            expected=p.expected,
            fix="repair the draft's config.json",
        )
    ids = (
        f"aux ids {dv.aux_ids} ({dv.convention}{'' if dv.convention_stated else ', assumed'})"
        if dv.aux_ids is not None
        else "no aux ids"
    )
    ctx.report.facts["draft"] = (
        f"{d} ({dv.format} format, {', '.join(dv.architectures) or '?'}, hidden {dv.hidden}, "
        f"draft vocab {dv.draft_vocab}, {ids})"
    )


def check_draft_weights(ctx: Context) -> None:
    d = ctx.draft_path
    wf: WeightFiles = list_weight_files(d)
    if not wf.files:
        if wf.pickles:
            ctx.add(
                ERROR,
                "draft-no-safetensors",
                "the draft has only pickle weights; eagle3-patches reads safetensors only",
                where=str(d),
                found=", ".join(p.name for p in wf.pickles[:3]),
                fix="save the draft with safetensors (save_pretrained(safe_serialization=True))",
            )
        else:
            ctx.add(
                ERROR,
                "not-a-checkpoint",
                "the draft directory holds no *.safetensors weights",
                where=str(d),
                fix="pass the directory that holds the draft's weights",
            )
        return
    scan = scan_shards(wf, "draft")
    for exc in scan.errors:
        ctx.report.add_diagnostic(exc.diagnostic)
    for name, first, second in scan.duplicates:
        ctx.add(
            ERROR,
            "duplicate-tensor",
            f"tensor {name} is stored in two shards",
            where=str(d),
            found=f"{first}, {second}",
            fix="re-export the draft",
        )
    if scan.absent:
        ctx.add(
            ERROR,
            "safetensors-index",
            f"{len(scan.absent)} tensor(s) in the draft's index are not in the shard it names",
            where=str(wf.index),
            found=", ".join(scan.absent[:5]),
            fix="re-export the draft",
        )
    raw, ok = scan.tensors, scan.ok
    canon: dict[str, TensorInfo] = {}
    names: dict[str, str] = {}
    naming: dict[str, list[str]] = {}
    for name, t in raw.items():
        c, kind = draft_tensor_name(name)
        naming.setdefault(kind, []).append(name)
        if c in canon:
            ctx.add(
                ERROR,
                "duplicate-tensor",
                f"tensors {names[c]} and {name} load into the same parameter",
                where=str(d),
                fix="keep one of them",
            )
            continue
        canon[c], names[c] = t, name
    ctx.draft_tensors, ctx.draft_raw_names = canon, names
    ctx.draft_weights_read = ok
    ctx.report.facts["draft_tensors"] = len(raw)
    ctx.draft_naming = naming


def check_draft_format(ctx: Context) -> None:
    dv = ctx.draft_view
    if dv.format == SPECULATORS:
        # that stock sglang cannot read it: speculators_draft_config's preflight rule; what no sglang can run,
        # in the converter's words (the converter and speculators_draft_config refuse it with the same message)
        refusal = unsupported(
            dv.config,
            ctx.draft_raw_names.values(),
            config_path=ctx.dcfg(),
            release=str(ctx.version),
            read=reads_under_patches(ctx),
        )
        if refusal is not None:
            ctx.report.add_diagnostic(refusal.diagnostic.replace(code="draft-unsupported-architecture"))
        return
    if dv.format == SGLANG_EAGLE3:
        if dv.mla is None and LLAMA_DRAFT_ARCH not in dv.architectures:
            ctx.add(
                WARNING,
                "draft-architecture",
                "the draft's architecture is not LlamaForCausalLMEagle3; the doctor's key and shape checks assume it",
                where=ctx.dcfg("architectures"),
                found=str(dv.architectures),
            )
        if dv.model_type is None:
            ctx.add(
                ERROR,
                "draft-config-field",
                "the draft config has no model_type; transformers' AutoConfig (and so sglang) cannot read it",
                where=ctx.dcfg("model_type"),
                expected='"llama"',
                fix='add "model_type": "llama"',
            )
        multi = BY_KEY["sglang-eagle3-multilayer"]  # the release that builds more layers: the layouts' table
        if dv.num_layers == 0 or (
            dv.num_layers is not None and dv.num_layers > 1 and verdict(multi, ctx.version).status != SERVED
        ):
            ctx.add(
                ERROR,
                "draft-num-layers",
                f"sglang {ctx.version}'s LlamaForCausalLMEagle3 builds exactly one decoder layer",
                where=ctx.dcfg("num_hidden_layers"),
                found=str(dv.num_layers),
                expected="1",
                fix="set num_hidden_layers to 1 (an EAGLE-3 draft has one layer)"
                if dv.num_layers == 0
                else f"a draft trained with {dv.num_layers} layers needs {multi.fix}",
            )
        # layers.0.* names: eagle3_draft_strict_loading's preflight rule
    elif dv.format == EAGLE:
        pass  # judged by the algorithm check
    elif dv.format == MODEL:
        ctx.add(
            WARNING,
            "draft-not-eagle3",
            "the draft config does not look like an EAGLE-3 draft (no Eagle3 architecture, no eagle_config, no "
            "speculators_model_type)",
            where=ctx.dcfg("architectures"),
            found=str(dv.architectures),
        )


# ---------------------------------------------------------------- kind and layout
def check_draft_kind(ctx: Context) -> None:
    """Which kind of draft, in which layout (``checkpoint/draft_layouts``), and whether this release serves it:
    one note, an error where it cannot (unless another finding owns that error), and an error for an algorithm
    that does not serve the kind (EAGLE-3 and EAGLE-1/2 drafts: the algorithm checks)."""
    found = classify(ctx.draft_view.config, ctx.draft_shapes())
    if found is None:
        return  # no draft the table knows: draft-not-eagle3 says so
    lay = found.layout
    v = verdict(lay, ctx.version, with_patches=ctx.with_patches)
    ctx.report.facts["draft_kind"] = {"kind": found.kind, "layout": lay.name, "key": lay.key, "verdict": v.status}
    ctx.add(INFO, "draft-kind", f"the draft: {found.describe()}; {v.text}", where=ctx.dcfg(), found=found.evidence)
    if v.status != SERVED and lay.owned_by(ctx.version) is None:
        ctx.add(
            ERROR,
            "draft-kind-not-served",
            f"sglang {ctx.version} cannot serve this draft ({found.describe()}) as it is: {v.text}",
            where=ctx.dcfg(),
            found=found.evidence,
            fix=v.fix,
        )
    algo = ctx.algorithm
    if (
        not ctx.checkpoint_only
        and algo is not None
        and lay.algorithms
        and algo not in lay.algorithms
        and found.kind not in EAGLE3_KINDS | {KIND_EAGLE1}  # judged by the algorithm checks
    ):
        ctx.add(
            ERROR,
            "draft-kind-algorithm",
            f"--speculative-algorithm {algo} does not serve a {found.kind} draft",
            where="--speculative-algorithm",
            found=algo,
            expected=" or ".join(lay.algorithms),
            fix=lay.fix,
        )


# ---------------------------------------------------------------- tensors
def check_draft_tensors(ctx: Context) -> None:
    dv = ctx.draft_view
    if not ctx.draft_weights_read and not ctx.draft_tensors:
        return
    exp = expected_draft_tensors(ctx)  # unknown / missing keys: eagle3_draft_strict_loading's preflight rule
    d = ctx.draft_path
    for name, (shape, _) in exp.items():
        t = ctx.draft_tensors.get(name)
        if t is None or shape is None or name in ("d2t", "t2d", "fc.weight"):  # judged by the d2t and fc checks
            continue
        if t.shape != shape:
            ctx.add(
                ERROR,
                "tensor-shape",
                f"{ctx.draft_raw_names[name]} has the wrong shape for the draft config"
                # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: every other name that reaches it
                # (`lm_head.weight`, `midlayer.*`, `norm.weight`) sorts after `embed_tokens.weight`
                + (" (sglang's loader asserts on it at start)" if name != "embed_tokens.weight" else ""),
                where=f"{d / t.file}: {ctx.draft_raw_names[name]}",
                found=str(list(t.shape)),
                expected=str(list(shape)),
                fix=_shape_fix(ctx, name, t.shape, shape),
            )
    if "d2t" in ctx.draft_tensors and "t2d" not in ctx.draft_tensors:
        ctx.add(
            WARNING,
            "t2d-missing",
            "the draft has d2t but no t2d (sglang ignores t2d; SpecForge's exporter and other servers require it)",
            where=str(d),
            fix="re-export t2d (bool mask over the target vocabulary)",
        )
    if "embed_tokens.weight" not in ctx.draft_tensors:
        ctx.add(
            INFO,
            "embed-from-target",
            "the draft has no embed_tokens.weight; sglang uses the target's embedding (as it does anyway for EAGLE-3)",
            where=str(d),
        )
    if dv.draft_vocab is None and dv.is_eagle3:
        ctx.add(
            WARNING,
            "draft-vocab-missing",
            "the draft config has no draft_vocab_size: sglang then replaces the draft's lm_head by the target's full "
            "one",
            where=ctx.dcfg("draft_vocab_size"),
            fix="set draft_vocab_size to the number of rows of lm_head.weight",
        )
    if dv.tie_word_embeddings and dv.is_eagle3:
        ctx.add(
            WARNING,
            "draft-tied-embeddings",
            "tie_word_embeddings is true: sglang makes the draft's lm_head the target's embedding and ignores "
            "lm_head.weight",
            where=ctx.dcfg("tie_word_embeddings"),
            fix="set tie_word_embeddings to false unless the draft really was trained tied",
        )


def _shape_fix(ctx: Context, name: str, found, expected) -> str:
    if name == "lm_head.weight":
        return "draft_vocab_size must equal the rows of lm_head.weight"
    if name == "t2d":
        return "t2d has one entry per target token"
    return "the config.json does not belong to these weights (hidden_size, heads, head_dim, intermediate_size)"


# ---------------------------------------------------------------- d2t / t2d
def _read_small(ctx: Context, name: str):
    t = ctx.draft_tensors.get(name)
    if t is None:
        return None
    if t.nbytes > MAX_MAP_BYTES:
        ctx.add(
            ERROR,
            f"{name}-invalid",
            f"{name} is implausibly large ({t.nbytes} bytes); not read",
            where=f"{ctx.draft_path / t.file}: {ctx.draft_raw_names[name]}",
            found=str(list(t.shape)),
            fix="re-export it",
        )
        return None
    from safetensors import safe_open  # a dependency

    where = f"{ctx.draft_path / t.file}: {ctx.draft_raw_names[name]}"
    try:
        with (
            open_checkpoint_file(ctx.draft_path, t.file, what="draft shard") as cf,
            safe_open(cf.library_path, framework="np") as f,
        ):
            value = f.get_tensor(ctx.draft_raw_names[name])
    except Exception as exc:  # noqa: BLE001 - the library's refusal is the finding
        ctx.add(
            ERROR,
            f"{name}-invalid",
            f"{name} cannot be read",
            where=where,
            # pragma: no mutate core/NumberReplacer: the library's refusals that reach `_read_small` are short (its
            # header was read by our own parser first; a dtype numpy lacks: 35-47 characters, `BF16`, `F8_*`), so the
            # 300-character cut never cuts
            found=f"{type(exc).__name__}: {exc}"[:300],
            fix="re-export it",
        )
        return None
    count_read(t.nbytes)
    return value


def check_d2t(ctx: Context) -> None:
    dv = ctx.draft_view
    if "d2t" not in ctx.draft_tensors or not ctx.draft_weights_read:
        return
    target_vocab = ctx.target.vocab if ctx.target and ctx.target.vocab else dv.vocab
    t = ctx.draft_tensors["d2t"]
    where = f"{ctx.draft_path / t.file}: {ctx.draft_raw_names['d2t']}"
    if t.dtype not in INT_DTYPES or len(t.shape) != 1:
        ctx.add(
            ERROR,
            "d2t-invalid",
            f"d2t is {t.dtype} {list(t.shape)}, expected a 1-D integer tensor of offsets",
            where=where,
            found=f"{t.dtype} {list(t.shape)}",
            expected=f"I64 [{dv.effective_draft_vocab}]",
            fix="save d2t as 1-D int64 offsets (d2t[i] = target_id[i] - i)",
        )
        return
    if target_vocab is None:
        return
    d2t = _read_small(ctx, "d2t")
    if d2t is None:
        return
    problem = check_d2t_values(d2t, target_vocab=target_vocab, draft_vocab=dv.draft_vocab)
    if problem is not None:
        code = "d2t-length" if problem.kind == "length" else "d2t-invalid"
        ctx.add(ERROR, code, problem.what, where=where, found=f"{t.dtype} {list(t.shape)}", fix=problem.fix)
        return
    # t2d: sglang skips it, but an inconsistent one says the export went wrong
    if "t2d" in ctx.draft_tensors:
        tt = ctx.draft_tensors["t2d"]
        twhere = f"{ctx.draft_path / tt.file}: {ctx.draft_raw_names['t2d']}"
        if tt.dtype != "BOOL" or tt.shape != (target_vocab,):
            ctx.add(
                WARNING,
                "t2d-invalid",
                "t2d is not a bool mask over the target vocabulary",
                where=twhere,
                found=f"{tt.dtype} {list(tt.shape)}",
                expected=f"BOOL [{target_vocab}]",
                fix="re-export t2d",
            )
            return
        t2d = _read_small(ctx, "t2d")
        if t2d is None:
            return
        # pragma: no mutate core/NumberReplacer `-1`: d2t is 1-D here (checked above): its first and last dimension are
        # one
        hot = d2t.astype(np.int64) + np.arange(d2t.shape[0])
        # pragma: no mutate core/NumberReplacer `-1`: d2t is 1-D here (checked above): its first and last dimension are
        # one
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: d2t passed `check_d2t` here, so its targets are
        # distinct: a t2d marking fewer than len(d2t) ids cannot mark them all, and the second test fires
        if int(t2d.sum()) != d2t.shape[0] or not bool(t2d[hot].all()):
            ctx.add(
                WARNING,
                "t2d-invalid",
                "t2d does not mark exactly the target ids that d2t maps to (sglang ignores t2d, but d2t and t2d came "
                "from different exports)",
                where=twhere,
                found=f"{int(t2d.sum())} marked, {int(t2d[hot].sum())} of d2t's targets marked",
                # pragma: no mutate core/NumberReplacer `-1`: d2t is 1-D here (checked above): its first and last
                # dimension are one
                expected=f"{d2t.shape[0]} marked, all of d2t's targets",
                fix="re-export d2t and t2d together",
            )


# ---------------------------------------------------------------- dtypes
def _stated_dtype(config: dict) -> tuple[str, object] | None:
    """(key, value) of the dtype field transformers converts when it loads ``config``: ``dtype`` wins over
    ``torch_dtype`` when both are set."""
    for key in ("dtype", "torch_dtype"):
        if config.get(key) is not None:
            return key, config[key]
    return None


def _check_config_dtype(ctx: Context, side: str, config: dict, where: Callable[[str], str]) -> bool:
    """A stated dtype transformers cannot turn into a torch floating-point dtype is an error; True if it was."""
    stated = _stated_dtype(config)
    if stated is None or (isinstance(stated[1], str) and stated[1] in CONFIG_DTYPES):
        return False
    key, value = stated
    close = str(value).removeprefix("torch.").lower()  # BFloat16, torch.bfloat16 -> bfloat16
    fails = (
        "transformers looks the string up as an attribute of torch (case-sensitively) and stops loading the config "
        "with AttributeError"
        if isinstance(value, str)
        else "sglang takes the value for a torch dtype and fails building the model"
    )
    ctx.add(
        ERROR,
        "config-dtype",
        f"the {side}'s {key} is not a floating-point dtype name transformers accepts: {fails}"
        + (" (the draft loads after the target)" if side == "draft" else ""),
        where=where(key),
        found=repr(value)[:80],
        expected=" / ".join(CONFIG_DTYPES),
        fix=f'write "{key}": "{close if close in CONFIG_DTYPES else "bfloat16"}"',
    )
    return True


def served_dtype(config_dtype: str | None, flag: str) -> tuple[str | None, str]:
    """(dtype sglang would run, reason) following ``_get_and_verify_dtype`` (0.5.9) for a dtype name transformers
    accepted (:func:`_check_config_dtype`)."""
    flag = flag or "auto"  # sglang's --dtype choices are lower case: any other spelling is refused at start
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: the flag is lower-cased, and every other `--dtype`
    # sglang accepts (`half`, `float16`, `bfloat16`, `float`, `float32`) sorts after `auto`
    if flag != "auto":
        canon = {"half": "float16", "float": "float32"}.get(flag, flag)
        return canon, f"--dtype {flag}"
    cd = config_dtype or ""
    if cd in ("", "float32", "float"):
        return "float16", (
            f"config dtype {cd} -> float16 (sglang's auto rule)"
            if cd
            else "no dtype in config -> float32 -> float16 (sglang's auto rule)"
        )
    canon = {"half": "float16", "double": "float64"}.get(cd, cd)
    return canon, f"config dtype {cd}"


def check_dtypes(ctx: Context) -> None:
    dv = ctx.draft_view
    flag = ctx.launch.dtype
    unloadable = _check_config_dtype(ctx, "draft", dv.config, ctx.dcfg)
    if ctx.target is not None:
        text = ctx.target.config.get("text_config")
        unloadable |= _check_config_dtype(ctx, "target", ctx.target.config, lambda k: ctx.tcfg(k, top=True))
        if isinstance(text, dict):
            unloadable |= _check_config_dtype(ctx, "target", text, lambda k: ctx.tcfg(f"text_config.{k}", top=True))
    ddt, dwhy = served_dtype(dv.dtype, flag)
    ctx.report.facts["draft_dtype"] = {"dtype": ddt, "from": dwhy}  # what the draft runs with (runtime_checks)
    _check_tensor_dtypes(ctx, ddt)
    if unloadable:
        return
    if ctx.target is not None:
        tdt, twhy = served_dtype(ctx.target.dtype, flag)
        if ddt != tdt:
            ctx.add(
                ERROR,
                "dtype-mismatch",
                f"the draft would run in {ddt} but the target's aux hidden states are {tdt}: the draft's fc raises a "
                "dtype error at the first forward",
                where=ctx.dcfg("torch_dtype"),
                found=f"draft: {dwhy}; target: {twhy}",
                expected=f"the draft running in {tdt}",
                fix=f'set "torch_dtype": "{tdt}" in the draft config.json (or launch with --dtype {tdt})',
            )
    elif ddt == "float16" and flag == "auto" and (dv.dtype or "float32") in ("float32", "float"):
        ctx.add(
            WARNING,
            "dtype-float32-draft",
            f"sglang runs this draft in float16 ({dwhy}); with a bfloat16 target the fc raises a dtype error",
            where=ctx.dcfg("torch_dtype"),
            fix='state the target\'s dtype: "torch_dtype": "bfloat16"',
        )


def _check_tensor_dtypes(ctx: Context, ddt: str | None) -> None:
    """Weights stored as integers in an unquantized draft; weights cast at load to ``ddt``."""
    quantized = isinstance(ctx.draft_view.config.get("quantization_config"), dict)
    for name, t in ctx.draft_tensors.items():
        raw = ctx.draft_raw_names[name]
        if name in ("d2t", "t2d"):
            continue
        if t.dtype not in FLOAT_DTYPES and not quantized:
            ctx.add(
                ERROR,
                "tensor-dtype",
                f"{raw} is stored as {t.dtype}, not a floating-point dtype: the loader copies raw integers into a "
                "float parameter",
                where=f"{ctx.draft_path / t.file}: {raw}",
                found=t.dtype,
                expected=" / ".join(sorted(FLOAT_DTYPES)),
                fix="re-export the draft's weights as floats",
            )
    stored = sorted(
        {t.dtype for n, t in ctx.draft_tensors.items() if n not in ("d2t", "t2d") and t.dtype in FLOAT_DTYPES}
    )
    want = CONFIG_DTYPES.get(ddt or "")
    if stored and want and stored != [want]:
        ctx.add(
            INFO,
            "tensor-dtype-cast",
            f"draft weights are stored as {', '.join(stored)} and cast to {ddt} at load",
            where=str(ctx.draft_dir),
        )
