"""eagle3_draft_strict_loading

Bug: ``LlamaForCausalLMEagle3.load_weights`` drops every name it does not recognise without a
word: a speculators-format draft (``layers.0.*``) loads with its whole midlayer left at random
init, a stray key or a missing tensor goes unnoticed, and a corrupted ``d2t`` is used as is.
Releases: 0.5.8-0.5.11 drop ``layers.0.*``; 0.5.12+ load it natively but still drop unknown keys.
Upstream probe: none for unknown keys (the loader has no else branch in any release through 0.5.23).
"""

from __future__ import annotations

import re
from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..checkpoint.d2t import check_d2t
from ..checkpoint.formats import unknown_tensor_hints
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr, expect_source

#: speculators names its single decoder layer ``layers.0``; sglang calls it ``midlayer``
_SPECULATORS_LAYER = re.compile(r"^(model\.)?layers\.0\.")
#: the (shard name -> fused parameter) renames sglang's loader performs
_STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
            (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))


def sglang_name(name: str) -> str:
    return _SPECULATORS_LAYER.sub(lambda m: f"{m.group(1) or ''}midlayer.", name)


#: sglang >= 0.5.12 names the draft's layer ``layers.0`` and renames these legacy names while loading
_LEGACY_NAMES = (("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
                 ("aux_norm_high", "fc_norm.2"))


def loader_name(name: str, params: dict) -> str:
    """``name`` as the installed loader looks it up: ``midlayer.*`` (<= 0.5.11) or ``layers.0.*`` (0.5.12+)."""
    if any(p.startswith(("midlayer.", "model.midlayer.")) for p in params):
        return name
    for legacy, new in _LEGACY_NAMES:
        if legacy in name:
            name = name.replace(legacy, new)
    return name


def resolve_param(name: str, params: dict) -> str | None:
    """The parameter sglang 0.5.9's loader would write ``name`` into, or None (it would drop it)."""
    for shard, fused in _STACKED:
        if shard in name:
            name = name.replace(shard, fused)
            break
    for candidate in (name, f"model.{name}"):
        if candidate in params:
            return candidate
    return None


def _draft_path() -> str:
    try:
        from ..sglang_runtime import server_arg

        return str(server_arg("speculative_draft_model_path"))
    except Exception:  # noqa: BLE001 - only used to word the message
        return "the draft checkpoint"


def _strict_load_weights(wrapped, instance, args, kwargs):
    weights = args[0] if args else kwargs["weights"]
    params = dict(instance.named_parameters())
    config = instance.config
    loaded: set[str] = set()
    unknown: list[str] = []
    d2t_problem = []

    def checked():
        for raw_name, tensor in weights:
            name = sglang_name(raw_name)
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "d2t":
                problem = check_d2t(tensor, target_vocab=config.vocab_size, draft_vocab=getattr(config, "draft_vocab_size", None))
                if problem:
                    d2t_problem.append(problem)
                    continue
            elif leaf != "t2d":
                param = resolve_param(loader_name(name, params), params)
                if param is None:
                    unknown.append(raw_name)
                    continue
                loaded.add(param)
            yield name, tensor

    result = wrapped(checked())

    optional = {"model.embed_tokens.weight"}  # shared from the target (EAGLEWorker.set_embed)
    if getattr(instance, "load_lm_head_from_target", False):
        optional.add("lm_head.weight")
    missing = sorted(set(params) - loaded - optional)
    if unknown or missing or d2t_problem:
        found = []
        if unknown:
            found.append(f"{len(unknown)} tensor(s) sglang would drop silently: {', '.join(sorted(unknown)[:12])}"
                         + (" ..." if len(unknown) > 12 else ""))
        if missing:
            found.append(f"parameter(s) left at their random init: {', '.join(missing)}")
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
            expected="exactly the draft's parameters (midlayer.* or layers.0.*, fc, norm, lm_head, d2t/t2d offsets)",
            fix="; ".join(fixes),
        )
    return result


class Eagle3DraftStrictLoading(Patch):
    name = "eagle3_draft_strict_loading"
    summary = "the draft loader accepts layers.0.* and refuses unknown keys, unloaded parameters and bad d2t"
    module = "sglang.srt.models.llama_eagle3"
    applies_to = SpecifierSet(">=0.5.8")

    def check(self, module: ModuleType) -> None:
        expect_source(expect_attr(module.LlamaForCausalLMEagle3, "load_weights"), "hot_token_id", "stacked_params_mapping")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.LlamaForCausalLMEagle3, "load_weights", _strict_load_weights)


PATCH = Eagle3DraftStrictLoading()
