# long module: one patch: the doctor's expected tensors beside the loader's ledger of the same tensors
"""eagle3_draft_strict_loading

Bug: ``LlamaForCausalLMEagle3.load_weights`` drops every name it does not recognise without a word.

What users see: a draft saved by ``speculators`` (``layers.0.*``) "loads" with its whole midlayer at random init; a
stray or missing tensor goes unnoticed; a corrupted ``d2t`` is used as is and maps draft tokens to the wrong target
tokens.  All of it shows only as a low accept length.

What the patch changes: the loader renames ``layers.0.*`` to ``midlayer.*``, then raises ``Eagle3ConfigError``
listing every tensor sglang would have dropped, every parameter left unloaded, every fused parameter (``qkv_proj`` /
``gate_up_proj``) missing one of its shards (``qkv_proj.weight (shard 'v')``), and a bad ``d2t``: wrong length for
``draft_vocab_size``, target ids ``i + d2t[i]`` out of range or repeated, with a specific message when ``d2t`` holds
absolute ids or offsets with an arange subtracted twice (``eagle3_patches/checkpoint/d2t.py``, shared with the
doctor).  ``input_norm.weight`` (speculators' ``norm_before_fc=True``, which sglang's draft does not implement) is
named as such.  Full-vocabulary drafts without ``d2t`` still load.

How it knows what sglang did: it does not predict sglang's name mapping, it *observes* it.  While sglang's own
``load_weights`` runs, every parameter's weight loader is wrapped by a recorder (and put back afterwards), so
"dropped" means no parameter received the tensor and "unloaded" means no tensor reached the parameter (it keeps its
initial value), whatever the quantization method made of the layer.  Quantized drafts therefore load exactly as
stock loads them, with whatever parameters the method adds loaded, or not, by sglang itself: ``--quantization fp8``
(or ``--speculative-draft-model-quantization``) inherited by the draft (its attention gains ``k_scale`` /
``v_scale``), an fp8 checkpoint (``weight_scale``, ``input_scale``), compressed-tensors W8A8-FP8 and W4A16
(``weight_packed``, ``weight_scale``, ``weight_shape``: Kimi-K2.5's own format).

Optional, because sglang gives them a value itself (decided from sglang's own objects): the embedding (shared from
the target), an lm_head taken from the target (``load_lm_head_from_target``), and the kv-cache scales of an
attention layer whose quant method is sglang's ``BaseKVCacheMethod`` (created at -1 and set to 1.0 after loading
when absent).  Kv-cache scales under their checkpoint spellings (``k_proj.k_scale``, ``kv_scale``, ...) are mapped
with sglang's own ``maybe_remap_kv_scale_name`` and loaded, as sglang's Llama loader does for targets (stock's draft
loader dropped them, leaving 1.0); scales the draft has no parameter for, and the ``lm_head.weight`` of a draft
whose head is tied to its embedding, are ignored as sglang's Llama loader ignores them, with an INFO line.

Releases: 0.5.8 and later: 0.5.8 - 0.5.11 drop ``layers.0.*``; 0.5.12 loads it natively but still drops unknown
keys.

Upstream probe: none for unknown keys (the loader has no else branch in any release checked).

Tests: ``tests/patches/test_eagle3_draft_strict_loading.py``: real draft ``ModelRunner`` objects load seven tiny
drafts.  Stock: the ``layers.0.*`` draft's midlayer differs from the file and the broken ones load silently
(asserted).  Patched: the ``layers.0.*`` draft loads bit-exactly into ``midlayer`` (q/k/v and gate/up compared after
sglang's fusion), a correct draft loads silently with the right ``hot_token_id``, the full-vocab draft loads, and
unknown key / missing tensor / absolute ``d2t`` / arange-twice ``d2t`` are each refused with the key and the
checkpoint path in the message.  Quantized drafts (``eagle3_patches/testing/quantized_drafts.py``), loaded in bf16
by stock and by the patch set: online fp8, fp8 checkpoint, compressed-tensors W8A8-FP8 and W4A16, a tied draft
carrying ``lm_head.weight``, kv scales without kv quantization: the parameters ``load_weights`` leaves are the same
bit for bit, and no case is refused (compressed-tensors asks for the GPU generation: an sm90 is reported; fp8 /
W4A16 then stop in ``process_weights_after_loading``, which needs CUDA kernels, for stock and patched alike).  Kv
scales in ``k_proj.k_scale`` / ``kv_scale`` spelling: stock leaves them at -1 (not loaded), the patch loads them.
An unknown key is still refused under fp8; a draft missing ``v_proj.weight`` loads silently on stock and is
refused naming the shard.
"""

from __future__ import annotations

import logging
import re
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..checkpoint import draft_fields as F
from ..checkpoint.d2t import check_d2t
from ..checkpoint.formats import MLA_DRAFT_ARCH, MLA_FIELDS, SGLANG_EAGLE3, unknown_tensor_hints
from ..diagnostic import ERROR, INFO, Diagnostic, Diagnostics, first_few
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr, expect_source
from ..sglang_runtime import server_arg
from ..sglang_version import installed_sglang_version
from .eagle3_draft_config_fields import installed_reads, reads_under_patches, served_fields, setup_module
from .eagle3_draft_norms import LEGACY_FC_NORM_NAMES

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

#: speculators names its single decoder layer ``layers.0``; sglang (<= 0.5.11) calls it ``midlayer``
_SPECULATORS_LAYER = re.compile(r"^(model\.)?layers\.0\.")
_MISSING = object()


#: projections a checkpoint may store fused, as sglang's own state dict names them (``QKVParallelLinear``,
#: ``MergedColumnParallelLinear``): sglang's loader loads the fused tensor whole
FUSED_PROJECTIONS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "self_attn.fused_qkv_a_proj_with_mqa": ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),  # MLA
}
#: projections the MLA draft's loader takes in pairs and writes as one fused parameter once both arrived
#: (``Eagle3DeepseekV2ForCausalLM.load_weights``): the first of a pair reaches no parameter by itself
PAIRED_PROJECTIONS = (("q_a_proj", "kv_a_proj_with_mqa"),)
#: what a quantized checkpoint stores next to (or, ``weight_packed``, instead of) a projection's ``weight``: fp8
#: (``weight_scale``, ``weight_scale_inv``, ``input_scale``) and compressed-tensors (``weight_packed``,
#: ``weight_shape``, ``weight_zero_point``, ``weight_g_idx``).  At run time the loader needs no such list: it sees
#: what the quantization method made of each layer (tests: the layouts of ``testing/quantized_drafts.py``).
QUANT_SUFFIXES = (
    "weight_scale",
    "weight_scale_inv",
    "input_scale",
    "weight_packed",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
)
#: kv-cache scales under the checkpoint spellings sglang's ``maybe_remap_kv_scale_name`` maps: loaded where the
#: draft has kv-cache scales (fp8), ignored otherwise, as sglang's Llama loader does
KV_SCALE_NAMES = (
    "self_attn.k_scale",
    "self_attn.v_scale",
    "self_attn.kv_scale",
    "self_attn.k_proj.k_scale",
    "self_attn.v_proj.v_scale",
    "self_attn.q_proj.output_scale",
    "self_attn.k_proj.output_scale",
    "self_attn.v_proj.output_scale",
    "self_attn.prob_output_scale",
)


def expected_draft_tensors(setup: PatchSetup) -> dict[str, tuple[tuple[int, ...] | None, str]]:
    """The tensors sglang's draft class (``LlamaForCausalLMEagle3``, or ``Eagle3DeepseekV2ForCausalLM`` for an MLA
    draft) loads, for the draft ``setup`` describes: canonical name (``midlayer.*``, no ``model.`` prefix) ->
    (shape, or None when unknown; ``required`` / ``optional``)."""
    dv = setup.draft_view
    H = dv.hidden
    th, k = setup.fc_input()
    tv = setup.target.vocab if setup.target and setup.target.vocab else dv.vocab

    m = "midlayer."
    proj_shapes = _mla_projections(dv, H) if dv.mla is not None else _llama_projections(dv, H)
    for whole, parts in FUSED_PROJECTIONS.items():
        if f"{m}{whole}.weight" in setup.draft_tensors and all(p in proj_shapes for p in parts):
            shapes = [proj_shapes.pop(part) for part in parts]
            known = [s for s in shapes if s is not None]
            proj_shapes[whole] = (sum(s[0] for s in known), known[0][1]) if len(known) == len(shapes) else None
    exp: dict[str, tuple[tuple[int, ...] | None, str]] = {
        "fc.weight": (_shape(H, (k * th) if th else None), "required")
    }
    quantized = isinstance(dv.config.get("quantization_config"), dict)
    for proj, shape in proj_shapes.items():
        packed = quantized and f"{m}{proj}.weight_packed" in setup.draft_tensors
        exp[f"{m}{proj}.weight"] = (shape, "optional" if packed else "required")
        if quantized:
            exp.update({f"{m}{proj}.{suffix}": (None, "optional") for suffix in QUANT_SUFFIXES})
    exp.update({m + name: (None, "optional") for name in KV_SCALE_NAMES})
    if dv.mla is not None:  # MLA's norms of the compressed q and kv
        exp[m + "self_attn.q_a_layernorm.weight"] = (_shape(dv.mla["q_lora_rank"]), "required")
        exp[m + "self_attn.kv_a_layernorm.weight"] = (_shape(dv.mla["kv_lora_rank"]), "required")
    exp.update(
        {
            m + "input_layernorm.weight": (_shape(H), "required"),
            m + "post_attention_layernorm.weight": (_shape(H), "required"),
            m + "hidden_norm.weight": (_shape(H), "required"),
            "norm.weight": (_shape(H), "required"),
            "embed_tokens.weight": (_shape(dv.vocab, H), "optional"),
            "t2d": (_shape(tv), "optional"),
        }
    )
    exp.update(_norm_tensors(setup))
    if dv.fc_bias:
        exp["fc.bias"] = (_shape(H), "required")
    dvocab = dv.draft_vocab
    if dv.tie_word_embeddings or dvocab is None:
        exp["lm_head.weight"] = (_shape(dv.vocab, H), "optional")
    else:
        exp["lm_head.weight"] = (_shape(dvocab, H), "required")
    partial = dvocab is not None and dv.vocab is not None and dvocab < dv.vocab
    exp["d2t"] = (_shape(dvocab), "required" if partial else "optional")
    return exp


def _dims(*dims: int | None, times: int | None = 1) -> int | None:
    """``times x sum(dims)``, or None when a size is unknown."""
    return None if times is None or any(d is None for d in dims) else times * sum(d for d in dims if d is not None)


def _shape(*dims: int | None) -> tuple[int, ...] | None:
    return None if any(d is None for d in dims) else tuple(d for d in dims if d is not None)


def _llama_projections(dv, H: int | None) -> dict[str, tuple[int, ...] | None]:
    """``LlamaForCausalLMEagle3``'s decoder layer: q/k/v over ``[embeds, hidden]`` (2 x H wide), o, the MLP."""
    qo, kvo, two_h, inter = (
        _dims(dv.head_dim, times=dv.heads),
        _dims(dv.head_dim, times=dv.kv_heads),
        _dims(H, times=2),
        dv.intermediate,
    )
    return {
        "self_attn.q_proj": _shape(qo, two_h),
        "self_attn.k_proj": _shape(kvo, two_h),
        "self_attn.v_proj": _shape(kvo, two_h),
        "self_attn.o_proj": _shape(H, qo),
        "mlp.gate_proj": _shape(inter, H),
        "mlp.up_proj": _shape(inter, H),
        "mlp.down_proj": _shape(H, inter),
    }


def _mla_projections(dv, H: int | None) -> dict[str, tuple[int, ...] | None]:
    """``Eagle3DeepseekV2ForCausalLM``'s decoder layer: DeepSeek-V2 MLA whose down projections (``q_a_proj`` and
    ``kv_a_proj_with_mqa``, which sglang fuses into ``fused_qkv_a_proj_with_mqa``, or stored so) take
    ``[embeds, hidden]`` (2 x H wide), the up projections, o and a dense MLP."""
    ml = dv.mla or {}
    ql, kvl, nope, rope, v = (ml.get(f) for f in MLA_FIELDS)
    nh, two_h, inter = dv.heads, _dims(H, times=2), dv.intermediate
    return {
        "self_attn.q_a_proj": _shape(ql, two_h),
        "self_attn.kv_a_proj_with_mqa": _shape(_dims(kvl, rope), two_h),
        "self_attn.q_b_proj": _shape(_dims(nope, rope, times=nh), ql),
        "self_attn.kv_b_proj": _shape(_dims(nope, v, times=nh), kvl),
        "self_attn.o_proj": _shape(H, _dims(v, times=nh)),
        "mlp.gate_proj": _shape(inter, H),
        "mlp.up_proj": _shape(inter, H),
        "mlp.down_proj": _shape(H, inter),
    }


def _norm_tensors(setup: PatchSetup) -> dict[str, tuple[tuple[int, ...] | None, str]]:
    """The weights of the draft norms the served draft builds (its config sets the field, and the release or a
    backporting patch the launch runs under reads it): ``input_norm`` over the k aux states, ``fc_norm.<i>`` (or
    its older name) per aux state."""
    # the converter's check of its own output (checkpoint only): the fields the release, or the backporting patch
    # a launch runs under, reads; a launch: what the launch serves
    served = reads_under_patches(setup) if setup.checkpoint_only else served_fields(setup)
    th, k = setup.fc_input()
    out: dict[str, tuple[tuple[int, ...] | None, str]] = {}
    set_names = {name for _, name, _ in F.set_fields(setup.draft_view.config)}
    if set_names & served & {"norm_before_fc", f"{F.EAGLE_CONFIG}.norm_before_fc"}:
        out["input_norm.weight"] = (_shape(k * th) if th else None, "required")
    if set_names & served & {"fc_norm", "use_aux_norm"}:
        # the older aux_norm_* names are mapped by the Llama draft's loader (and its backport), not the MLA draft's
        llama = setup_module(setup) == F.DRAFT_MODULE
        legacy = {new: old for old, new in LEGACY_FC_NORM_NAMES.items()} if llama else {}
        for i in range(k):
            old = f"{legacy.get(f'fc_norm.{i}', f'fc_norm.{i}')}.weight"
            out[old if old in setup.draft_tensors else f"fc_norm.{i}.weight"] = (_shape(th), "required")
    return out


def sglang_name(name: str) -> str:
    """``layers.0.*`` -> ``midlayer.*``: the name every release's loader accepts (0.5.12+ maps it back)."""
    return _SPECULATORS_LAYER.sub(lambda m: f"{m.group(1) or ''}midlayer.", name)


def _canonical(param_name: str) -> str:
    """A parameter name as checkpoint names spell it: no ``model.`` prefix, ``midlayer`` (0.5.12+ says ``layers.0``)."""
    return sglang_name(param_name.removeprefix("model."))


class _LoadLedger:
    """Which parameters sglang's loader wrote, with which shards, for which checkpoint name."""

    def __init__(self, model, default_loader):
        self.model = model
        self.default_loader = default_loader
        self.params = dict(model.named_parameters())
        self.current: str | None = None
        self.writes: dict[str, set] = {}  # parameter -> shard ids written (None: the whole parameter)
        self.sources: set[str | None] = set()  # checkpoint names that reached a parameter
        self.unobservable: set[str] = set()
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> _LoadLedger:
        for pname, param in self.params.items():
            own = vars(param)
            if "weight_loader" in own:  # set_weight_attrs(...): an instance attribute
                slot = "weight_loader"
            elif "_weight_loader" in own:  # sglang's BasevLLMParameter: a read-only property over it
                slot = "_weight_loader"
            elif getattr(param, "weight_loader", None) is None:  # sglang calls its default_weight_loader
                slot = "weight_loader"
            else:
                # pragma: no mutate eagle3/DeleteCallStatement: no parameter of the draft reaches it on sglang 0.5.9
                # (plain, fp8, compressed-tensors W8A8 and W4A16: every one carries its loader as an instance attribute,
                # a `_weight_loader` slot or none; `::test_patched_leaves_each_parameter_the_weight_loader_stock_leaves`
                # lists them), so the loop never stops or goes on there : the branch is not reached on the releases the
                # mutants run on
                self.unobservable.add(pname)
                # pragma: no mutate core/ReplaceContinueWithBreak: no parameter of the draft reaches it on sglang 0.5.9
                # (plain, fp8, compressed-tensors W8A8 and W4A16: every one carries its loader as an instance attribute,
                # a `_weight_loader` slot or none; `::test_patched_leaves_each_parameter_the_weight_loader_stock_leaves`
                # lists them), so the loop never stops or goes on there
                continue
            original = own.get(slot, _MISSING)
            loader = self.default_loader if original is _MISSING else original
            self._undo.append((param, slot, original))
            setattr(param, slot, self._recorder(pname, loader))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            param, slot, original = self._undo.pop()
            if original is _MISSING:
                delattr(param, slot)
            else:
                setattr(param, slot, original)

    def _recorder(self, pname: str, loader):
        def record(param, loaded_weight, *args, **kwargs):
            # pragma: no mutate core/NumberReplacer `-1`: sglang's draft loader calls a weight loader as
            # `weight_loader(param, loaded_weight)` or `weight_loader(param, loaded_weight, shard_id)`
            # (`LlamaForCausalLMEagle3.load_weights`; the draft has no experts, whose loaders take more): after the two
            # the recorder names, at most one positional argument, so the first is the last
            shard = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
            self.writes.setdefault(pname, set()).add(shard)
            self.sources.add(self.current)
            return loader(param, loaded_weight, *args, **kwargs)

        return record

    def not_loaded(self, optional: set[str]) -> list[str]:
        """Parameters (or fused shards) no checkpoint tensor reached."""
        out = []
        for pname in self.params:
            if pname in optional or pname in self.unobservable:
                continue
            shards = self.writes.get(pname)
            if not shards:
                out.append(pname)
                continue
            expected = _expected_shards(self.model, pname)
            if expected and None not in shards:
                out.extend(f"{pname} (shard {s!r})" for s in sorted(expected - shards, key=str))
        return out


def _expected_shards(model, pname: str) -> set | None:
    """The shard ids a fused parameter is loaded in (``q``/``k``/``v``, ``0``/``1``), from sglang's layer."""
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    module = model.get_submodule(pname.rsplit(".", 1)[0]) if "." in pname else model
    if isinstance(module, QKVParallelLinear):
        return {"q", "k", "v"}
    if isinstance(module, MergedColumnParallelLinear):
        return set(range(len(module.output_sizes)))
    return None


def _defaulted_params(model) -> set[str]:
    """Parameters sglang fills itself when the checkpoint lacks them: kv-cache scales of a ``BaseKVCacheMethod``."""
    from sglang.srt.layers.quantization.kv_cache import BaseKVCacheMethod

    out: set[str] = set()
    for mname, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), BaseKVCacheMethod):
            # pragma: no mutate core/ReplaceFalseWithTrue: the layers whose quant method is a `BaseKVCacheMethod` are
            # `RadixAttention`s, which have no submodules: their own parameters and all their parameters are the same
            out.update(
                f"{mname}.{p}" for p, _ in module.named_parameters(recurse=False)
            )  # an attention layer, never the root
    return out


def _kv_scale_name(name: str, params: dict) -> str | None:
    """sglang's own kv-scale spelling rules (``maybe_remap_kv_scale_name``) against the draft's parameters;
    None: the draft has no such parameter (sglang's Llama loader then skips the tensor)."""
    from sglang.srt.model_loader.weight_utils import maybe_remap_kv_scale_name

    view = {_canonical(p): v for p, v in params.items()}
    if name.removeprefix("model.") in view:  # already the parameter's own name
        return name
    return maybe_remap_kv_scale_name(name, view)


def _draft_path() -> str:
    try:
        return str(server_arg("speculative_draft_model_path"))
    # pragma: no mutate core/ExceptionReplacer: `server_arg` raises only where no server arguments are set, and there
    # the draft model cannot be built (its `LogitsProcessor.__init__` calls `get_global_server_args()`), so the load
    # never reaches the handler
    except Exception:  # noqa: BLE001 - only used to word the message
        return "the draft checkpoint"


def _fused_with_partner(name: str, sources: set[str | None]) -> bool:
    """Whether ``name`` is one of a pair the loader fuses (:data:`PAIRED_PROJECTIONS`) whose partner's arrival wrote
    the fused parameter: the pair's first tensor then reached it too."""
    for first, second in PAIRED_PROJECTIONS:
        for mine, partner in ((first, second), (second, first)):
            if f".{mine}." in name and name.replace(f".{mine}.", f".{partner}.") in sources:
                return True
    return False


def strict_load_weights(wrapped, instance, args, kwargs):
    import sys

    # pragma: no mutate core/NumberReplacer `-1`: `load_weights(weights)` has one parameter: sglang's model loader
    # passes the iterator as the one positional argument
    weights = args[0] if args else kwargs["weights"]
    config = instance.config
    default_loader = sys.modules[type(instance).__module__].default_weight_loader
    ledger = _LoadLedger(instance, default_loader)
    # pragma: no mutate core/ReplaceFalseWithTrue: transformers' `PretrainedConfig` sets `tie_word_embeddings` on every
    # config, so the default is never taken
    tied = bool(getattr(config, "tie_word_embeddings", False))
    passed: list[str] = []  # checkpoint names handed to sglang's loader
    ignored: list[str] = []  # names sglang's Llama loader ignores by design
    d2t_problem = []

    def checked():
        for raw_name, tensor in weights:
            name = sglang_name(raw_name)
            # pragma: no mutate core/NumberReplacer `, 2`: the last part of a split at dots is the same whatever the
            # number of splits
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "d2t":
                problem = check_d2t(
                    tensor, target_vocab=config.vocab_size, draft_vocab=getattr(config, "draft_vocab_size", None)
                )
                if problem:
                    d2t_problem.append(problem)
                    continue
            elif leaf != "t2d":
                if tied and name.removeprefix("model.") == "lm_head.weight":
                    ignored.append(
                        f"{raw_name} (tie_word_embeddings: the head is the embedding, taken from the target)"
                    )
                    continue
                if "scale" in leaf:
                    remapped = _kv_scale_name(name, ledger.params)
                    if remapped is None:
                        ignored.append(f"{raw_name} (a kv-cache scale; this draft has no fp8 kv-cache scales)")
                        continue
                    name = remapped
                passed.append(raw_name)
            ledger.current = raw_name
            yield name, tensor
        ledger.current = None

    with ledger:
        result = wrapped(checked())

    if ignored:
        logger.info(
            "eagle3-patches: %s: ignored as sglang's Llama loader ignores them: %s", _draft_path(), "; ".join(ignored)
        )
    unknown = [n for n in passed if n not in ledger.sources and not _fused_with_partner(n, ledger.sources)]
    optional = _defaulted_params(instance) | {"model.embed_tokens.weight"}  # embedding: shared from the target
    # pragma: no mutate core/ReplaceFalseWithTrue: `LlamaForCausalLMEagle3.__init__` sets `load_lm_head_from_target`
    # before it builds the head (sglang 0.5.9, where the mutants run), so the default is never taken
    if getattr(instance, "load_lm_head_from_target", False):
        optional.add("lm_head.weight")
    missing = ledger.not_loaded(optional)
    if unknown or missing or d2t_problem:
        found = []
        if unknown:
            found.append(f"{len(unknown)} tensor(s) sglang would drop silently: {first_few(sorted(unknown), 12)}")
        if missing:
            found.append(f"parameter(s) left at their initial value: {', '.join(missing)}")
        if d2t_problem:
            # pragma: no mutate core/NumberReplacer `-1`: a checkpoint holds one `d2t`, so the list has at most one
            # problem: the first is the last
            found.append(f"d2t: {d2t_problem[0].what}")
        fixes = []
        module = F.MLA_DRAFT_MODULE if type(instance).__name__ == MLA_DRAFT_ARCH else F.DRAFT_MODULE
        if d2t_problem:
            # pragma: no mutate core/NumberReplacer `-1`: a checkpoint holds one `d2t`, so the list has at most one
            # problem: the first is the last
            fixes.append(d2t_problem[0].fix)
        fixes.extend(
            unknown_tensor_hints(
                unknown,
                read=installed_reads(module) or frozenset(),
                release=f"sglang {installed_sglang_version()} with the patches active here",
                module=module,
            )
        )
        fixes.append(
            "check the checkpoint with `eagle3-patches doctor --draft PATH`; convert speculators drafts "
            "with `eagle3-patches convert SRC DST`"
        )
        raise Eagle3ConfigError(
            f"the EAGLE-3 draft checkpoint does not match {type(instance).__name__}",
            where=_draft_path(),
            found="; ".join(found),
            expected="exactly the draft's parameters (midlayer.* or layers.0.*, fc, norm, lm_head, d2t/t2d offsets, "
            "and the scales of the draft's quantization method)",
            fix="; ".join(fixes),
        )
    return result


class Eagle3DraftStrictLoading(Patch):
    name = "eagle3_draft_strict_loading"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 50
    summary = "the draft loader accepts layers.0.* and refuses unknown keys, unloaded parameters and bad d2t"
    module = "sglang.srt.models.llama_eagle3"
    applies_to = SpecifierSet(">=0.5.8")

    remedy = "refused"

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        """The checkpoint's tensors against the draft's parameters: what sglang would drop or leave unloaded."""
        out = Diagnostics()
        dv = setup.draft
        # pragma: no mutate core/ReplaceOrWithAnd `None and`: with a draft whose weights were not read and which has no
        # tensors, the rule returns nothing either way: the renamed and unknown lists are empty and `if not
        # setup.draft_weights_read: return out` follows; without a draft the right side is true too
        if dv is None or not (setup.draft_weights_read or setup.draft_tensors):
            return out
        renamed = setup.draft_naming.get("speculators") if dv.format == SGLANG_EAGLE3 else None
        if renamed:
            n, first = len(renamed), first_few(sorted(renamed), 4)
            if setup.rf.loads_layers0_keys:
                out.add(
                    INFO,
                    "keys-speculators-names",
                    f"{n} tensor(s) are named layers.0.*; sglang {setup.version} maps them onto midlayer.*",
                    where=str(setup.draft_dir),
                )
            else:
                out.add(
                    ERROR,
                    "keys-speculators-names",
                    f"{n} tensor(s) are named layers.0.* (speculators' naming): sglang "
                    f"{setup.version} drops them silently and the whole midlayer stays at its random init",
                    where=str(setup.draft_dir),
                    found=first,
                    expected="midlayer.*",
                    fix="convert the draft (eagle3-patches convert), launch under `eagle3-patches run` (strict loading "
                    "maps the names), or use sglang >= 0.5.12",
                )
        exp = expected_draft_tensors(setup)
        unknown = sorted(setup.draft_raw_names[c] for c in setup.draft_tensors if c not in exp)
        if unknown:
            out.add(
                ERROR,
                "keys-unknown",
                f"{len(unknown)} tensor(s) {dv.sglang_class} has no parameter for: sglang drops them silently "
                "(every release)",
                where=str(setup.draft_dir),
                found=first_few(unknown, 6),
                expected="fc, midlayer.* (or layers.0.*), norm, lm_head, embed_tokens, d2t, t2d, and the scales of the "
                "draft's quantization",
                fix="; ".join(
                    unknown_tensor_hints(
                        unknown,
                        read=served_fields(setup),
                        release=f"sglang {setup.version}" + (" under eagle3-patches" if setup.with_patches else ""),
                        module=setup_module(setup),
                    )
                )
                or "remove them if they are unused, or fix their names",
            )
        if not setup.draft_weights_read:
            return out  # a shard could not be read: do not call its tensors missing
        missing = [n for n, (_, req) in exp.items() if req == "required" and n not in setup.draft_tensors]
        if missing == ["d2t"]:
            out.add(
                ERROR,
                "d2t-missing",
                f"draft_vocab_size {dv.draft_vocab} < vocab_size {dv.vocab} but the draft has no "
                f"d2t: the draft's proposals would index target ids 0..{dv.draft_vocab}-1",
                where=str(setup.draft_dir),
                found="d2t",
                fix="re-export d2t (offsets: d2t[i] = target_id[i] - i)",
            )
        elif missing:
            out.add(
                ERROR,
                "keys-missing",
                f"{len(missing)} parameter(s) are missing from the checkpoint: sglang leaves them "
                "at their random init without a word",
                where=str(setup.draft_dir),
                found=first_few(missing, 8),
                fix="re-export the draft with every tensor (SpecForge refuses to export without fc, norm, lm_head, "
                "d2t, t2d)",
            )
        return out

    def when_patched(self, d: Diagnostic, setup: PatchSetup) -> Diagnostic:
        if d.code == "keys-speculators-names":  # renamed at load: fixed; everything else is refused at load
            return d.replace(
                severity=INFO,
                what=f"{d.what.split(':')[0]}; eagle3-patches' strict loading maps them onto midlayer.*",
                found="",
                expected="",
                fix="",
            )
        return super().when_patched(d, setup)

    def check(self, module: ModuleType) -> None:
        expect_source(
            expect_attr(module.LlamaForCausalLMEagle3, "load_weights"),
            "hot_token_id",
            "stacked_params_mapping",
            "weight_loader",
        )
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_attr(module, "default_weight_loader")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.LlamaForCausalLMEagle3, "load_weights", strict_load_weights)


PATCH = Eagle3DraftStrictLoading()
