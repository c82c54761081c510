"""The SGLang form of the original EAGLE repository's EAGLE-3 draft (SafeAILab/EAGLE).

The repository saves its EAGLE-3 draft (``eagle/traineagle3/config.json``, ``eagle/traineagle3/cnets.py``,
``eagle/model/cnets.py``) with a plain ``LlamaForCausalLM`` config (plus ``draft_vocab_size``, and
``target_hidden_size`` where the target's hidden size differs) and the tensors ``midlayer.*``, ``fc.weight``
(3 x the target's hidden in), ``norm.weight``, ``lm_head.weight`` (``draft_vocab_size`` rows), ``d2t`` (int64
offsets), ``t2d`` (bool), sometimes ``embed_tokens.weight``.  It names no aux layer ids: its target model feeds
the draft the states before layers 2, n//2 and n-3 of an n-layer target
(:func:`~.layer_ids.eagle_repository_points`).  sglang registers no draft class under that architecture name: it
would load the draft as a target model.

What the converter writes (:func:`build_config`): the source config with ``architectures:
["LlamaForCausalLMEagle3"]``, ``model_type: llama``, ``num_hidden_layers: 1`` (the repository's draft has one
``midlayer``, whatever the config says), ``draft_vocab_size`` (else the rows of ``lm_head.weight``),
``target_hidden_size`` (``fc`` in-width / number of states), ``torch_dtype`` (else the stored dtype of
``fc.weight``) and ``eagle_config`` with the ids in this library's ``output-of-layer`` convention, recorded as the
speculators path records it; ``rope_theta`` / ``rope_scaling`` and every other llama field carried as they are.
The tensors already have sglang's names: each keeps its name, dtype and bytes.  The target's layer count comes
from ``--target`` or ``--num-target-layers``; the converter refuses without one (or explicit ``--aux-layer-ids``).

NeMo Automodel's EAGLE-3 draft (``architectures: ["LlamaEagle3DraftModel"]``, tensors under ``model.``,
``lm_head.weight``, ``d2t`` / ``t2d``) and an sglang-layout EAGLE-3 draft saved under an EAGLE-1/2 class name
(``LlamaForCausalLMEagle``, whose class builds a 2 x hidden ``fc``) are written the same way, a ``model.`` prefix
dropped; no rule gives their aux ids, so the converter needs ``--aux-layer-ids`` (the ids their training
captured, HF ``hidden_states`` indices) unless the config states ``eagle_config.eagle_aux_hidden_state_layer_ids``.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import draft_layouts as D
from . import layer_ids as L
from .conversion_plan import (
    SAFETENSORS_DTYPE_TO_CONFIG,
    ConvertError,
    Plan,
    _plan,
    _source_tensors,
    checked_aux_ids,
    conversion_error,
    reading_for,
    target_layers,
    usable_view,
)
from .draft_names import draft_tensor_name
from .formats import SGLANG_EAGLE3, SPECULATORS, checkpoint_dir, detect_format, read_config
from .safetensors_header import TensorInfo

FORMAT = "eagle-repository"
#: the layouts this module converts (:data:`.draft_layouts.LAYOUTS` keys) and the source format each is recorded as
SOURCES = {
    "eagle-repo-eagle3": FORMAT,
    "automodel-eagle3": "nemo-automodel",
    "eagle1-name-eagle3-fc": "sglang-with-an-eagle1-class-name",
}
#: what a pickle-only EAGLE repository draft (its published ``pytorch_model.bin``) needs first
RESAVE_FIX = (
    "re-save the weights as safetensors from a copy you trust (e.g. `safetensors.torch.save_file(torch.load("
    "'pytorch_model.bin', weights_only=True), 'model.safetensors')`), then convert that directory"
)
#: NeMo Automodel's report of a draft served without d2t
NO_D2T_FAILURE = (
    "served without d2t, the draft's token i is read as target token i: the acceptance collapse of NeMo Automodel #2447"
)


class ConvertUsageError(ConvertError):
    """The converter needs an argument the command line did not give (the CLI exits 2)."""


def _ids(
    aux_layer_ids: list[int] | None, n_layers: int | None, config_path: str, layout: str, stated: list | None
) -> tuple[list[int], str]:
    """The input-of-layer ids the draft was trained on, and where they came from."""
    if aux_layer_ids is not None:
        return list(aux_layer_ids), "--aux-layer-ids"
    if layout != "eagle-repo-eagle3":
        if stated:
            return list(stated), f"{config_path}: eagle_config.eagle_aux_hidden_state_layer_ids"
        raise ConvertUsageError(
            "this draft names no aux layer ids, and no rule gives them",
            where=config_path,
            found="no eagle_config.eagle_aux_hidden_state_layer_ids, no --aux-layer-ids",
            expected="--aux-layer-ids with the ids its training captured (HF hidden_states indices, e.g. 2,30,58 "
            "for Kimi-K2.5)",
            fix="pass --aux-layer-ids with the layers the recipe captured (its training config)",
        )
    if n_layers is None:
        raise ConvertUsageError(
            "the original EAGLE repository's draft names no aux layer ids: the converter needs the target's layer "
            "count to compute them",
            where=config_path,
            found="no eagle_aux_hidden_state_layer_ids, no --target, no --num-target-layers",
            expected="--target PATH (the target checkpoint) or --num-target-layers N",
            fix="pass --target with the target model the draft was trained for (or --num-target-layers N); the "
            "repository feeds the states before layers 2, n//2 and n-3 of an n-layer target",
        )
    points = L.eagle_repository_points(n_layers)
    if len(points) < D.MIN_AUX_STATES:
        raise conversion_error(
            f"on a {n_layers}-layer target the EAGLE repository feeds {len(points)} distinct state(s) (before layers "
            f"{points}), not the {D.MIN_AUX_STATES} an EAGLE-3 draft takes",
            where="--num-target-layers / --target",
            found=str(n_layers),
            expected="a target of at least 7 layers",
            fix="pass the layer count of the target the draft was trained for, or --aux-layer-ids",
        )
    return points, f"the EAGLE repository's rule for a {n_layers}-layer target"


def build_config(
    config: dict,
    tensors: dict[str, TensorInfo],
    *,
    aux_layer_ids: list[int] | None = None,
    num_target_layers: int | None = None,
    target_vocab: int | None = None,
    config_path: str = "config.json",
    layout: str = "eagle-repo-eagle3",
) -> dict:
    """The SGLang-format config.json for an EAGLE repository EAGLE-3 draft (raises :class:`ConvertError`).

    ``aux_layer_ids``: the ids the draft was trained on (input-of-layer); default: the repository's rule on a
    ``num_target_layers``-layer target.  ``target_vocab``: the target's vocabulary (default: the config's
    ``vocab_size``)."""
    dv = usable_view(config, config_path)
    if config.get("model_type", "llama") != "llama":
        raise conversion_error(
            "the draft's config is not a llama config; the EAGLE repository's EAGLE-3 draft is a llama layer and "
            "sglang's LlamaForCausalLMEagle3 runs only llama",
            where=f"{config_path}: model_type",
            found=repr(config.get("model_type"))[:80],
            expected="'llama'",
        )
    eagle = config.get("eagle_config")
    stated = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    ids, ids_where = _ids(aux_layer_ids, num_target_layers, config_path, layout, stated)
    out_ids = checked_aux_ids(ids, ids_where, num_target_layers)
    fc, lm_head = tensors.get("fc.weight"), tensors.get("lm_head.weight")
    if fc is None or len(fc.shape) != 2 or fc.shape[1] % len(ids):
        raise conversion_error(
            f"fc.weight does not take one target hidden state per aux layer ({len(ids)})",
            where=f"{config_path}: fc.weight",
            found=str(list(fc.shape)) if fc is not None else "no fc.weight",
            expected=f"[hidden, {len(ids)} x target hidden]",
            fix="pass the ids the draft was trained on with --aux-layer-ids",
        )
    target_hidden = fc.shape[1] // len(ids)
    if dv.target_hidden is not None and dv.target_hidden != target_hidden:
        raise conversion_error(
            "target_hidden_size disagrees with fc.weight",
            where=f"{config_path}: target_hidden_size",
            found=f"{dv.target_hidden}; fc.weight {list(fc.shape)}",
            expected=f"{target_hidden} (fc in-width / {len(ids)} states)",
            fix="repair the source config.json",
        )
    rows = lm_head.shape[0] if lm_head is not None and len(lm_head.shape) == 2 else None
    vocab = target_vocab or dv.vocab
    if "d2t" not in tensors and rows is not None and vocab is not None and rows < vocab:
        raise conversion_error(
            f"the draft's lm_head has {rows} rows, fewer than the target's {vocab} tokens, and it has no d2t: "
            f"{NO_D2T_FAILURE}",
            where=str(Path(config_path).parent),
            found=f"lm_head.weight {list(lm_head.shape) if lm_head is not None else []}, no d2t",
            expected="a d2t tensor (draft-to-target offsets) next to a reduced lm_head",
            fix="export d2t (and t2d) with the draft: the EAGLE repository keeps them as buffers of its Model "
            "(cnets.py); its training writes them from the token frequencies",
        )
    dtype = dv.dtype or SAFETENSORS_DTYPE_TO_CONFIG.get(fc.dtype)
    # the dtype is written once, as torch_dtype (below); architectures and eagle_config are replaced
    out = {k: v for k, v in config.items() if k not in ("auto_map", "dtype")}
    out.update(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "draft_vocab_size": dv.draft_vocab if dv.draft_vocab is not None else rows,
            "target_hidden_size": target_hidden,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": out_ids,
                "use_aux_hidden_state": True,
                L.CONVENTION_KEY: L.OUTPUT_OF_LAYER,
            },
            "eagle3_patches_converted_from": {
                "format": SOURCES[layout],
                "architectures": config.get("architectures"),
                "eagle_aux_hidden_state_layer_ids": ids,
                "layer_id_convention": L.INPUT_OF_LAYER,
                "num_target_layers": num_target_layers,
            },
        }
    )
    if dtype is not None:
        out["torch_dtype"] = dtype
    return out


def is_source(config: dict) -> bool:
    """Whether the converter plans a source with this ``config.json`` here (not speculators' nor SGLang's format:
    :func:`plan_eagle_repo` judges which layout it is) rather than with :func:`.conversion_plan.plan_conversion`."""
    fmt = detect_format(config)
    if fmt == SPECULATORS:
        return False
    found = D.classify(config, {})  # Automodel's architecture name reads as sglang's format, but is not one it serves
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: the formats that reach this line are `eagle`, `model`
    # and `sglang-eagle3` (speculators returns earlier); the other two sort before `sglang-eagle3`, so `<` and `!=`
    # agree
    return fmt != SGLANG_EAGLE3 or (found is not None and found.layout.key in SOURCES)


def plan_eagle_repo(
    src: os.PathLike | str,
    *,
    aux_layer_ids: list[int] | None = None,
    drop_embed_tokens: bool = False,
    target=None,
    num_target_layers: int | None = None,
) -> Plan:
    """Read a source that is not in speculators' nor SGLang's format: the EAGLE repository's EAGLE-3 draft is
    planned; any other layout is refused with what :mod:`.draft_layouts` says serves it."""
    src_dir = checkpoint_dir(src, "source draft")
    config = read_config(src_dir, "source draft")
    tensors, src_files = _source_tensors(src_dir, pickle_fix=RESAVE_FIX)
    infos = {n: t for n, (t, _, _) in tensors.items()}
    found = D.classify(config, {n: t.shape for n, t in infos.items()})
    config_path = str(src_dir / "config.json")
    if found is None or found.layout.key not in SOURCES:
        raise conversion_error(
            "the source is neither a speculators EAGLE-3 draft, the original EAGLE repository's nor NeMo Automodel's",
            where=config_path,
            found=f"{found.describe()} ({found.evidence})"
            if found
            else f"architectures {config.get('architectures')!r:.80}",
            expected='"speculators_model_type": "eagle3" and a transformer_layer_config, a LlamaForCausalLM '
            "config whose fc.weight takes 3 x hidden (the EAGLE repository's EAGLE-3 draft), or "
            "LlamaEagle3DraftModel (NeMo Automodel's)",
            fix=found.layout.fix if found else "pass an EAGLE-3 draft's directory",
        )
    n_layers, target_vocab = target_layers(target, num_target_layers)
    out_config = build_config(
        config,
        # the names sglang reads (Automodel's ``model.`` dropped)
        {draft_tensor_name(n)[0]: t for n, t in infos.items()},
        aux_layer_ids=aux_layer_ids,
        num_target_layers=n_layers,
        target_vocab=target_vocab,
        config_path=config_path,
        layout=found.layout.key,
    )
    items, renamed, dropped = _plan(src_dir, config, tensors, drop_embed_tokens, [], reading_for(None))
    return Plan(src_dir, config, out_config, items, renamed, dropped, src_files)
