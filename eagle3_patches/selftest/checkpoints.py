"""The tiny checkpoints the checks run on, built locally on first use (nothing is downloaded).

Every builder is a pure function of its arguments and writes atomically
(:func:`eagle3_patches.testing.tiny_models.write_checkpoint`), so a directory that exists is
complete and is reused: ``EAGLE3_TINY_CACHE`` (the tests' cache) or the selftest's own temporary
directory.  The tests build their variants with the same functions (one copy of each recipe).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from ..checkpoint.layer_ids import CONVENTION_KEY, OUTPUT_OF_LAYER
from ..testing import tiny_models as tm

#: draft ids of the layer-id check: the outputs of layers 2, 3, 4 of the 6-layer tiny target in the
#: library's convention (output of layer i); sglang <= 0.5.12 adds 1, stock 0.5.13+ does not
LAYER_CHECK_IDS = (2, 3, 4)


def draft_variant(
    root: os.PathLike,
    name: str,
    *,
    spec: tm.TinyDraftSpec = tm.TinyDraftSpec(),
    edit: Callable[[dict], None] | None = None,
    prefix: str = "midlayer.",
) -> Path:
    """The tiny SGLang-format draft at ``root/name`` with its tensors named under ``prefix`` and edited by ``edit``."""
    tensors = tm.eagle3_draft_tensors(spec, midlayer_prefix=prefix)
    if edit:
        edit(tensors)
    return tm.build_eagle3_draft(Path(root) / name, spec, tensors=tensors)


def layer_ids_draft_spec(convention: str | None) -> tm.TinyDraftSpec:
    """The tiny draft with ids :data:`LAYER_CHECK_IDS`, its config recording ``convention`` (None: none recorded)."""
    eagle_config = {"eagle_aux_hidden_state_layer_ids": list(LAYER_CHECK_IDS), "use_aux_hidden_state": True}
    if convention:
        eagle_config[CONVENTION_KEY] = convention
    return tm.TinyDraftSpec(aux_ids=LAYER_CHECK_IDS, extra_config={"eagle_config": eagle_config})


def _unknown_key(tensors: dict) -> None:
    import torch

    tensors["input_norm.weight"] = torch.ones(
        3 * tm.HIDDEN
    )  # speculators' norm_before_fc, which sglang does not implement


def _d2t_absolute(tensors: dict) -> None:
    import torch

    tensors["d2t"] = tensors["d2t"] + torch.arange(tm.DRAFT_VOCAB)  # target ids where sglang wants offsets


def _d2t_twice(tensors: dict) -> None:
    import torch

    tensors["d2t"] = tensors["d2t"] - torch.arange(tm.DRAFT_VOCAB)  # the arange subtracted once more


def no_capture_target(path: os.PathLike) -> Path:
    """A config-only GPT-2 target: a real sglang model class without the EAGLE-3 capture hooks.  Only its
    ``config.json`` (and a tokenizer) exist: the launcher's flag resolution reads no weights."""
    path = Path(path)
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        tm.write_tokenizer(path, tm.VOCAB)
        (path / "config.json").write_text(
            json.dumps(
                {
                    "architectures": ["GPT2LMHeadModel"],
                    "model_type": "gpt2",
                    "n_embd": tm.HIDDEN,
                    "n_layer": 2,
                    "n_head": 4,
                    "vocab_size": tm.VOCAB,
                    "n_positions": 256,
                }
            )
        )
    return path


def no_aux_draft(path: os.PathLike) -> Path:
    """The tiny draft with ``eagle_config.use_aux_hidden_state: false`` (the target then captures nothing)."""
    spec = tm.TinyDraftSpec()
    config = tm.eagle3_draft_config(spec)
    config["eagle_config"]["use_aux_hidden_state"] = False
    return tm.write_checkpoint(Path(path), config, tm.eagle3_draft_tensors(spec), spec.vocab)


def _quantized(kind: str) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        from ..testing import quantized_drafts as qd

        return qd.build_quantized_draft(path, kind)

    return build


def _qwen3_vl(path: Path, moe: bool) -> Path:
    from ..testing.tiny_vl_models import build_qwen3_vl

    return build_qwen3_vl(path, moe=moe)


def _converted_speculators(path: Path) -> Path:
    """The speculators fixture after ``eagle3-patches convert`` (the SGLang format)."""
    from ..convert import convert

    if not (path / "config.json").exists():
        convert(tm.build_speculators_fixture(path.parent / "speculators"), path, progress=False)
    return path


def _mla_variant(edit: Callable[[dict], object] | None = None) -> Callable[[Path], Path]:
    """The tiny MLA draft (``Eagle3DeepseekV2ForCausalLM``), its tensors changed by ``edit``."""

    def build(path: Path) -> Path:
        t = tm.mla_draft_tensors()
        if edit is not None:
            edit(t)
        return tm.build_mla_draft(path, t)

    return build


_MLA = "layers.0.self_attn."
#: the MLA drafts the MLA strict-loading check loads, and what a bad one must be refused for (a needle)
MLA_REFUSED_FOR = {
    "mla_missing_draft": "kv_b_proj.weight",
    "mla_unknown_draft": "q_proj.weight",
    "mla_unpaired_draft": "fused_qkv_a_proj_with_mqa.weight",
}

#: name -> (directory under the root, builder of that directory)
BUILDERS: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "deepseek_v3": ("tiny-deepseek-v3", tm.build_deepseek_v3),
    "kimi_k25": ("tiny-kimi-k25", tm.build_kimi_k25),
    "draft": ("tiny-eagle3-draft", tm.build_eagle3_draft),
    "trained_draft": ("trained", tm.build_trained_eagle3_draft),
    "midlayer_draft": ("strict-loading/midlayer", lambda p: draft_variant(p.parent, p.name)),
    "layers0_draft": ("strict-loading/layers0", lambda p: draft_variant(p.parent, p.name, prefix="layers.0.")),
    "unknown_key_draft": ("strict-loading/unknown", lambda p: draft_variant(p.parent, p.name, edit=_unknown_key)),
    "missing_tensor_draft": (
        "strict-loading/missing",
        lambda p: draft_variant(p.parent, p.name, edit=lambda t: t.pop("midlayer.mlp.down_proj.weight")),
    ),
    "d2t_absolute_draft": (
        "strict-loading/d2t-absolute",
        lambda p: draft_variant(p.parent, p.name, edit=_d2t_absolute),
    ),
    "d2t_twice_draft": ("strict-loading/d2t-twice", lambda p: draft_variant(p.parent, p.name, edit=_d2t_twice)),
    "full_vocab_draft": (
        "strict-loading/full-vocab",
        lambda p: draft_variant(p.parent, p.name, spec=tm.TinyDraftSpec(draft_vocab=tm.VOCAB)),
    ),
    "layer_ids_marked_draft": (
        "tiny-eagle3-draft-ids234-output-of-layer",
        lambda p: tm.build_eagle3_draft(p, layer_ids_draft_spec(OUTPUT_OF_LAYER)),
    ),
    "layer_ids_unmarked_draft": (
        "tiny-eagle3-draft-ids234",
        lambda p: tm.build_eagle3_draft(p, layer_ids_draft_spec(None)),
    ),
    "no_capture_target": ("tiny-gpt2-config-only", no_capture_target),
    "no_aux_draft": ("draft-no-aux-states", no_aux_draft),
    "fp8_draft": ("strict-loading-quantized/fp8", _quantized("fp8")),
    "kimi_vl": ("tiny-kimi-vl", tm.build_kimi_vl),
    "qwen3_vl": ("tiny-qwen3-vl-dense", lambda p: _qwen3_vl(p, moe=False)),
    "qwen3_vl_moe": ("tiny-qwen3-vl-moe", lambda p: _qwen3_vl(p, moe=True)),
    "speculators_draft": ("speculators", lambda p: tm.build_speculators_fixture(p)),
    "speculators_converted": ("speculators-converted", _converted_speculators),
    "mla_draft": ("tiny-eagle3-mla-draft", _mla_variant()),
    "mla_missing_draft": ("mla-strict-loading/missing", _mla_variant(lambda t: t.pop(_MLA + "kv_b_proj.weight"))),
    "mla_unknown_draft": (
        "mla-strict-loading/unknown",
        _mla_variant(lambda t: t.update({_MLA + "q_proj.weight": t[_MLA + "q_a_proj.weight"].clone()})),
    ),
    "mla_unpaired_draft": (
        "mla-strict-loading/unpaired",
        _mla_variant(lambda t: t.pop(_MLA + "kv_a_proj_with_mqa.weight")),
    ),
}


def build(root: os.PathLike, name: str) -> Path:
    """The checkpoint ``name`` (a key of :data:`BUILDERS`) under ``root``, built if it is not there yet."""
    where, builder = BUILDERS[name]
    return Path(builder(Path(root) / where))
