"""eagle3_draft_strict_loading

Bug: ``LlamaForCausalLMEagle3.load_weights`` drops every name it does not recognise without a
word: a speculators-format draft (``layers.0.*``) loads with its whole midlayer left at random
init, a stray key or a missing tensor goes unnoticed, and a corrupted ``d2t`` is used as is.
Releases: 0.5.8-0.5.11 drop ``layers.0.*``; 0.5.12+ load it natively but still drop unknown keys.
Upstream probe: none for unknown keys (the loader has no else branch in any release through 0.5.23).

How it knows what sglang did: it does not predict sglang's name mapping, it *observes* it.  While
sglang's own ``load_weights`` runs, every parameter's weight loader is wrapped by a recorder (and
put back afterwards), so a checkpoint tensor that reached no parameter is one sglang dropped, and a
parameter no tensor reached (or a fused ``qkv_proj`` / ``gate_up_proj`` missing one of its shards)
is one left at its initial value.  That holds for every quantization method sglang builds the
draft with (``--quantization fp8`` or ``--speculative-draft-model-quantization``: fp8 weight
scales, ``input_scale``; compressed-tensors' ``weight_packed`` / ``weight_scale`` /
``weight_shape``): whatever parameters the method adds are loaded, or not, by sglang itself.

What sglang gives a value without the checkpoint is optional, decided from sglang's own objects:
the embedding (shared from the target), an lm_head taken from the target
(``load_lm_head_from_target``) and the kv-cache scales of an attention layer whose quant method is
sglang's ``BaseKVCacheMethod`` (created at -1 and set to 1.0 after loading when absent).
Checkpoint spellings of the kv-cache scales (``k_proj.k_scale``, ``kv_scale``, ...) are mapped
with sglang's own ``maybe_remap_kv_scale_name``, as sglang's Llama loader maps them for targets;
scales the draft has no parameter for, and an ``lm_head.weight`` of a draft whose head is tied to
the embedding, are ignored exactly as sglang's Llama loader ignores them (logged).
"""

from __future__ import annotations

import logging
import re
from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..checkpoint.d2t import check_d2t
from ..checkpoint.formats import unknown_tensor_hints
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr, expect_source

logger = logging.getLogger("eagle3_patches")

#: speculators names its single decoder layer ``layers.0``; sglang (<= 0.5.11) calls it ``midlayer``
_SPECULATORS_LAYER = re.compile(r"^(model\.)?layers\.0\.")
_MISSING = object()


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
        self.sources: set[str] = set()  # checkpoint names that reached a parameter
        self.unobservable: set[str] = set()
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> "_LoadLedger":
        for pname, param in self.params.items():
            own = vars(param)
            if "weight_loader" in own:  # set_weight_attrs(...): an instance attribute
                slot = "weight_loader"
            elif "_weight_loader" in own:  # sglang's BasevLLMParameter: a read-only property over it
                slot = "_weight_loader"
            elif getattr(param, "weight_loader", None) is None:  # sglang calls its default_weight_loader
                slot = "weight_loader"
            else:
                self.unobservable.add(pname)
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

    out = set()
    for mname, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), BaseKVCacheMethod):
            out.update(f"{mname}.{p}" if mname else p for p, _ in module.named_parameters(recurse=False))
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
        from ..sglang_runtime import server_arg

        return str(server_arg("speculative_draft_model_path"))
    except Exception:  # noqa: BLE001 - only used to word the message
        return "the draft checkpoint"


def _strict_load_weights(wrapped, instance, args, kwargs):
    import sys

    weights = args[0] if args else kwargs["weights"]
    config = instance.config
    default_loader = sys.modules[type(instance).__module__].default_weight_loader
    ledger = _LoadLedger(instance, default_loader)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    passed: list[str] = []  # checkpoint names handed to sglang's loader
    ignored: list[str] = []  # names sglang's Llama loader ignores by design
    d2t_problem = []

    def checked():
        for raw_name, tensor in weights:
            name = sglang_name(raw_name)
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "d2t":
                problem = check_d2t(tensor, target_vocab=config.vocab_size,
                                    draft_vocab=getattr(config, "draft_vocab_size", None))
                if problem:
                    d2t_problem.append(problem)
                    continue
            elif leaf != "t2d":
                if tied and name.removeprefix("model.") == "lm_head.weight":
                    ignored.append(f"{raw_name} (tie_word_embeddings: the head is the embedding, taken from the target)")
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
        logger.info("eagle3-patches: %s: ignored as sglang's Llama loader ignores them: %s", _draft_path(), "; ".join(ignored))
    unknown = [n for n in passed if n not in ledger.sources]
    optional = _defaulted_params(instance) | {"model.embed_tokens.weight"}  # embedding: shared from the target
    if getattr(instance, "load_lm_head_from_target", False):
        optional.add("lm_head.weight")
    missing = ledger.not_loaded(optional)
    if unknown or missing or d2t_problem:
        found = []
        if unknown:
            found.append(f"{len(unknown)} tensor(s) sglang would drop silently: {', '.join(sorted(unknown)[:12])}"
                         + (" ..." if len(unknown) > 12 else ""))
        if missing:
            found.append(f"parameter(s) left at their initial value: {', '.join(missing)}")
        if d2t_problem:
            found.append(f"d2t: {d2t_problem[0].what}")
        fixes = []
        if d2t_problem:
            fixes.append(d2t_problem[0].fix)
        fixes.extend(unknown_tensor_hints(unknown))
        fixes.append("check the checkpoint with `eagle3-patches doctor --draft PATH`; convert speculators drafts "
                     "with `eagle3-patches convert SRC DST`")
        raise Eagle3ConfigError(
            "the EAGLE-3 draft checkpoint does not match LlamaForCausalLMEagle3",
            where=_draft_path(),
            found="; ".join(found),
            expected="exactly the draft's parameters (midlayer.* or layers.0.*, fc, norm, lm_head, d2t/t2d offsets, "
                     "and the scales of the draft's quantization method)",
            fix="; ".join(fixes),
        )
    return result


class Eagle3DraftStrictLoading(Patch):
    name = "eagle3_draft_strict_loading"
    summary = "the draft loader accepts layers.0.* and refuses unknown keys, unloaded parameters and bad d2t"
    module = "sglang.srt.models.llama_eagle3"
    applies_to = SpecifierSet(">=0.5.8")

    def check(self, module: ModuleType) -> None:
        expect_source(expect_attr(module.LlamaForCausalLMEagle3, "load_weights"), "hot_token_id", "stacked_params_mapping",
                      "weight_loader")
        expect_attr(module, "default_weight_loader")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.LlamaForCausalLMEagle3, "load_weights", _strict_load_weights)


PATCH = Eagle3DraftStrictLoading()
