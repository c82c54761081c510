# long module: one decision, what a speculators draft becomes in SGLang form, read top to bottom
"""The SGLang form of a speculators-format EAGLE-3 draft: refusals, the config, the tensor plan.

What the converter writes and what ``speculators_draft_config`` hands sglang when it serves such a draft
as it is, decided from the draft's ``config.json`` and safetensors headers alone (no tensor data):

* ``config.json``: ``transformer_layer_config`` becomes the top level, with
  ``architectures: ["LlamaForCausalLMEagle3"]``, ``model_type: llama``, ``torch_dtype``,
  ``rope_theta`` / ``rope_scaling`` from ``rope_parameters``, ``draft_vocab_size``,
  ``target_hidden_size`` (from ``fc.weight`` when speculators left it null) and
  ``eagle_config``.  The aux layer ids are translated from speculators' meaning (HF
  ``hidden_states[N]`` = the input of layer N) to this library's ``output-of-layer``
  convention (``N - 1``) and the convention is recorded under
  ``eagle_config.eagle3_patches_layer_id_convention``.  speculators' ``auto_map`` and its
  ``config.py`` are neither executed nor copied.
* tensors: ``layers.0.*`` -> ``midlayer.*``; everything else keeps its name, dtype and
  bytes (``d2t`` stays int64 offsets, ``t2d`` stays bool).

* the draft norms speculators trains (``norm_before_fc`` with ``input_norm.weight``, ``fc_norm`` with
  ``fc_norm.<i>.weight``, ``norm_output``): carried, under the name and in the place the release the config
  is built for reads them (:func:`reading_for`: the converter writes what the newest observed release reads;
  ``speculators_draft_config``, what the running release and the active patch set read), their weights kept
  under the names speculators and sglang share.

What that release does not read (``norm_before_residual``: no release; a norm before the first release that
reads it), a norm weight whose field the config does not set, or a non-llama decoder layer is refused
(:func:`unsupported`), naming the first release that reads the field.  Which release reads which field is
:mod:`.draft_fields`' (parsed from sglang's ``llama_eagle3.py``).  Writing the planned draft is
:mod:`eagle3_patches.convert`'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..diagnostic import first_few
from ..errors import Eagle3ConfigError
from . import draft_fields as F
from . import expected_accept
from . import layer_ids as L
from .draft_names import draft_tensor_name
from .formats import (
    SGLANG_EAGLE3,
    SPECULATORS,
    DraftView,
    checkpoint_dir,
    detect_format,
    draft_view,
    list_weight_files,
    read_config,
    scan_shards,
    target_view,
    unknown_tensor_hints,
)
from .releases import facts
from .safe_io import CheckpointError
from .safetensors_header import TensorInfo, alignment_order

SAFETENSORS_DTYPE_TO_CONFIG = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}

_MIDLAYER_PARAMS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "hidden_norm.weight",
)
KNOWN_OUTPUT_NAMES = frozenset(
    {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", "t2d"}
    | {f"midlayer.{p}" for p in _MIDLAYER_PARAMS}
)


class ConvertError(Eagle3ConfigError):
    """The source cannot be converted (or the destination cannot be written) safely."""


def conversion_error(what: str, *, where: str = "", found: str = "", expected: str = "", fix: str = "") -> ConvertError:
    return ConvertError(what, where=where, found=found, expected=expected, fix=fix)


# pragma: no mutate core/ReplaceTrueWithFalse: nothing assigns to an `_Item`'s fields or hashes one
@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor: its name in the SGLang draft and where its bytes are in the source."""

    out: str
    src: TensorInfo
    src_data_start: int
    src_mode: int  # permission bits of the source shard


def _source_tensors(
    src: Path,
    pickle_fix: str = "re-save the draft with safetensors (speculators' save_pretrained writes model.safetensors)",
) -> tuple[dict[str, tuple[TensorInfo, int, int]], list[str]]:
    """name -> (tensor, data start of its shard, its shard's permission bits); and the shard names."""
    wf = list_weight_files(src)
    if not wf.files:
        if wf.pickles:
            raise conversion_error(
                "the source has only pickle weights; the converter never loads pickles",
                where=str(src),
                found=", ".join(p.name for p in wf.pickles[:3]),
                fix=pickle_fix,
            )
        raise conversion_error(
            "the source directory holds no *.safetensors weights",
            where=str(src),
            fix="pass the speculators draft's directory",
        )
    scan = scan_shards(wf, "source draft")
    if scan.errors:
        raise scan.errors[0]
    if scan.duplicates:
        name, first, second = scan.duplicates[0]
        raise conversion_error(
            f"tensor {name} is stored in two shards",
            where=str(src),
            found=f"{first}, {second}",
            fix="re-export the draft",
        )
    if scan.absent:
        raise conversion_error(
            "tensors in the source's index are not in the shard it names",
            where=str(wf.index),
            found=", ".join(scan.absent[:5]),
            fix="re-export the draft",
        )
    out = {}
    for name, t in scan.tensors.items():
        h = scan.headers[t.file]
        out[name] = (t, h.data_start, h.mode)
    return out, list(scan.headers)


def reading_for(release: str | None, read: Iterable[str] | None = None) -> tuple[frozenset[str], str]:
    """The draft config fields (read names, :mod:`.draft_fields`) the SGLang config is built for, and how to name
    that release: ``read`` as given (``speculators_draft_config``: the installed release's source and the active
    patch set), else what ``release`` reads by the table observed from the released wheels, else (the converter)
    what the newest observed release reads."""
    if release is None:
        newest = ".".join(map(str, F.OBSERVED_UP_TO))
        label = f"sglang {newest} (the newest release known, which the converter writes for)"
        return frozenset(F.newest_read() if read is None else read), label
    label = f"sglang {release}"
    if read is None:
        read = F.read_by_release(facts(release).release)
    return frozenset(read), label


def math_fields(config: dict) -> dict[str, Any]:
    """The draft config fields that change the draft's math (:data:`.draft_fields.MATH_FIELDS`) a speculators
    config sets true (speculators writes them at the top of its config)."""
    return {f: config[f] for f in F.MATH_FIELDS if config.get(f) not in (None, False, 0)}


def unsupported(
    config: dict,
    tensor_names=(),
    *,
    config_path: str = "config.json",
    release: str | None = None,
    read: Iterable[str] | None = None,
) -> ConvertError | None:
    """Why the SGLang form of this speculators draft, built for ``release`` (:func:`reading_for`: ``release`` and
    ``read``), cannot run faithfully, or None.

    The one place for that message: the converter raises it, ``speculators_draft_config`` raises it at
    start (before any rank loads weights) and the doctor reports it (``draft-unsupported-architecture``).
    A field the release reads is carried into the SGLang config (:func:`build_config`); one it does not is refused,
    naming the first release that reads it.
    """
    read, label = reading_for(release, read)
    set_fields = math_fields(config)
    # field -> (found, expected)
    bad = {
        f: (f"{f}=true ({F.reads_it(f)})", f"{f} false, or a release that reads it")
        for f in set_fields
        if F.read_name(f, read) is None
    }
    unread = list(bad)
    orphans = []
    for name in tensor_names:
        field = F.field_of_weight(name)
        if field is None:
            continue
        owners = [f for f, pattern in F.FIELD_WEIGHTS.items() if pattern == F.FIELD_WEIGHTS[field]]
        if field not in bad and not any(f in set_fields for f in owners):
            bad[field] = (f"{field} ({name} present, the field not set)", f"{field} true with {name}, or neither")
            orphans.append(field)
    if "norm_before_residual" not in config:  # vLLM's speculators adapter reads a missing one as true
        bad["norm_before_residual"] = (
            "norm_before_residual (missing: vLLM reads it as true)",
            "norm_before_residual stated, false",
        )
    if bad:
        firsts = [F.FIRST_READ.get(f) for f in unread]
        elsewhere = ""
        if unread and len(unread) == len(bad) and all(firsts):
            newest = max(f for f in firsts if f is not None)
            elsewhere = f" or on sglang >= {'.'.join(map(str, newest))}, which reads " + (
                "it" if len(bad) == 1 else "them"
            )
        return conversion_error(
            f"this draft was trained with options the LlamaForCausalLMEagle3 of {label} does not read"
            + (", or with norm weights its config does not enable" if orphans else "")
            + "; served by it (converted or directly) it would load but predict wrong",
            where=f"{config_path}: {next(iter(bad))}",
            found=", ".join(found for found, _ in bad.values()),
            expected="; ".join(expected for _, expected in bad.values()),
            fix="retrain (or fine-tune) the draft with those options off, or serve it with vLLM"
            + elsewhere
            + (
                '; if it was trained with norm_before_residual=false, write "norm_before_residual": false into its '
                "config.json"
                if "norm_before_residual" not in config
                else ""
            ),
        )
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        return conversion_error(
            "the source config has no transformer_layer_config",
            where=f"{config_path}: transformer_layer_config",
            fix="this is not a speculators EAGLE-3 draft",
        )
    if layer.get("model_type", "llama") != "llama":
        return conversion_error(
            "the draft's decoder layer is not a llama layer; sglang's LlamaForCausalLMEagle3 runs only llama",
            where=f"{config_path}: transformer_layer_config.model_type",
            found=repr(layer.get("model_type")),
            expected="'llama'",
            fix="train the draft with a llama transformer_layer_config",
        )
    if layer.get("num_hidden_layers", 1) != 1:
        return conversion_error(
            "sglang's EAGLE-3 draft has exactly one decoder layer",
            where=f"{config_path}: transformer_layer_config.num_hidden_layers",
            found=str(layer.get("num_hidden_layers")),
            expected="1",
        )
    return None


def checked_aux_ids(ids, where: str, num_target_layers: int | None = None) -> list[int]:
    """Input-of-layer aux ids (HF ``hidden_states`` index: speculators', the EAGLE repository's) as output-of-layer
    ids sglang can capture on a ``num_target_layers``-layer target (None: unknown, only plausibility checked); raises
    :class:`ConvertError` naming ``where`` the ids came from."""
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt `) > sorted`: a list is never less than its sorted copy,
    # so `!=` and `>` agree
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt `) < len`: a set is never longer than the list it was
    # made of
    if len(set(ids)) != len(ids) or list(ids) != sorted(ids):
        raise conversion_error(
            "the aux layer ids are not distinct and increasing",
            where=where,
            found=str(ids),
            fix="sglang concatenates states in layer order: such a draft cannot be served correctly",
        )
    if any(type(i) is not int or not 0 <= i <= L.MAX_LAYERS for i in ids):
        raise conversion_error(
            "the aux layer ids are not layer numbers",
            where=where,
            found=repr(list(ids))[:200],
            expected=f"integers in 1..{L.MAX_LAYERS} (speculators' meaning: HF hidden_states index)",
            fix="pass the ids the draft was trained on with --aux-layer-ids (and --target to check them against the "
            "target)",
        )
    out_ids = L.to_output_of_layer(ids, L.INPUT_OF_LAYER)
    if out_ids[0] < 0:
        raise conversion_error(
            "aux id 0 (the embeddings, HF hidden_states[0]) cannot be captured by sglang",
            where=where,
            found=str(ids),
            fix="only the outputs of decoder layers can be captured",
        )
    if num_target_layers is not None and out_ids[-1] > num_target_layers - 2:
        raise conversion_error(
            f"aux id {ids[-1]} (the input of layer {ids[-1]}) has no capture point in sglang on a "
            f"{num_target_layers}-layer target",
            where=where,
            found=str(ids),
            expected=f"ids in 1..{num_target_layers - 1}",
            fix="the final hidden state (id num_layers) cannot be captured by sglang",
        )
    return out_ids


def usable_view(config: dict, config_path: str = "config.json") -> DraftView:
    """The source config's draft view, or the :class:`ConvertError` naming its first unusable field."""
    dv = draft_view(config)
    if dv.problems:
        p = dv.problems[0]
        raise conversion_error(
            f"the source config field {p.where} is unusable",
            where=f"{config_path}: {p.where}",
            found=p.found,
            expected=p.expected,
            fix="repair the source config.json",
        )
    return dv


def build_config(
    config: dict,
    tensors: dict[str, TensorInfo],
    *,
    aux_layer_ids: list[int] | None = None,
    num_target_layers: int | None = None,
    release: str | None = None,
    read: Iterable[str] | None = None,
    config_path: str = "config.json",
) -> dict:
    """The SGLang-format config.json for a speculators config (raises :class:`ConvertError`).

    The draft norms it sets (``norm_before_fc``, ``fc_norm``, ``norm_output``...) are carried under the name and
    in the place the release reads them (:func:`reading_for` with ``release`` and ``read``; the top level first,
    then ``eagle_config``); one it does not read is refused (:func:`unsupported`).

    ``release``: None (the converter) writes the aux ids in this library's ``output-of-layer`` convention;
    an sglang version writes them in the convention that release's own rule reads
    (:func:`~.layer_ids.release_convention`: ``speculators_draft_config`` serving the draft directly).
    Either way the convention is recorded under ``eagle_config.eagle3_patches_layer_id_convention``.
    """
    dv = usable_view(config, config_path)
    refusal = unsupported(config, tensors, config_path=config_path, release=release, read=read)
    if refusal is not None:
        raise refusal
    read, _ = reading_for(release, read)
    layer = config["transformer_layer_config"]
    ids = aux_layer_ids if aux_layer_ids is not None else dv.aux_ids
    if not ids:
        raise conversion_error(
            "the source config names no aux layer ids",
            where=f"{config_path}: eagle_aux_hidden_state_layer_ids",
            fix="pass --aux-layer-ids with the ids the draft was trained on (speculators' meaning, e.g. 2,30,58 for "
            "Kimi-K2.5)",
        )
    ids_where = "--aux-layer-ids" if aux_layer_ids is not None else f"{config_path}: eagle_aux_hidden_state_layer_ids"
    out_ids = checked_aux_ids(ids, ids_where, num_target_layers)
    convention = L.OUTPUT_OF_LAYER if release is None else L.release_convention(release)
    fc = tensors.get("fc.weight")
    k = len(ids)
    target_hidden = dv.target_hidden
    if target_hidden is None and fc is not None and len(fc.shape) == 2 and fc.shape[1] % k == 0:
        target_hidden = fc.shape[1] // k
    dtype = dv.dtype
    if dtype is None and fc is not None:
        dtype = SAFETENSORS_DTYPE_TO_CONFIG.get(fc.dtype)
    draft_vocab = dv.draft_vocab
    lm_head = tensors.get("lm_head.weight")
    if draft_vocab is None and lm_head is not None and len(lm_head.shape) == 2:
        draft_vocab = lm_head.shape[0]

    out = {
        k2: v
        for k2, v in layer.items()
        # pragma: no mutate eagle3/DropLiteralElement `"dtype", "architectures`, `torch_dtype", "auto_map`: set
        # by the update below: `torch_dtype` (or removed there) and `architectures`
        if k2 not in ("rope_parameters", "dtype", "torch_dtype", "architectures", "auto_map")
    }
    rp = layer.get("rope_parameters")
    if isinstance(rp, dict):
        if "rope_theta" in rp:
            out["rope_theta"] = rp["rope_theta"]
        rope_type = rp.get("rope_type", rp.get("type", "default"))
        # pragma: no mutate eagle3/DropLiteralElement `rope_type")}`: the `"type"` key is written over with `rope_type`
        # right after
        extra = {k2: v for k2, v in rp.items() if k2 not in ("rope_theta", "rope_type", "type")}
        out["rope_scaling"] = (
            None if rope_type == "default" and not extra else {**extra, "rope_type": rope_type, "type": rope_type}
        )
    out.update(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "torch_dtype": dtype,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", layer.get("tie_word_embeddings", False))),
            "draft_vocab_size": draft_vocab,
            "target_hidden_size": target_hidden,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": L.from_output_of_layer(out_ids, convention),
                "use_aux_hidden_state": True,
                L.CONVENTION_KEY: convention,
            },
            "eagle3_patches_converted_from": {
                "format": "speculators",
                "speculators_version": config.get("speculators_version"),
                "architectures": config.get("architectures"),
                "eagle_aux_hidden_state_layer_ids": list(ids),
                "layer_id_convention": L.INPUT_OF_LAYER,
                "verifier": (config.get("speculators_config") or {}).get("verifier")
                if isinstance(config.get("speculators_config"), dict)
                else None,
            },
        }
    )
    for field_name in math_fields(config):  # every one is read (unsupported refused the others)
        name = F.read_name(field_name, read) or field_name
        block = out["eagle_config"] if name.startswith(f"{F.EAGLE_CONFIG}.") else out
        block[name.rpartition(".")[2]] = True
    if out.get("torch_dtype") is None:
        out.pop("torch_dtype")
    if expected_accept.FIELD in config:  # the figure the watchdog compares with, checked before it is carried
        try:
            expected_accept.from_value(config[expected_accept.FIELD], source=f"{config_path}: {expected_accept.FIELD}")
        except CheckpointError as exc:
            d = exc.diagnostic
            raise conversion_error(d.what, where=d.where, found=d.found, expected=d.expected, fix=d.fix) from None
        out[expected_accept.FIELD] = config[expected_accept.FIELD]
    return out


def carried(sglang_config: dict) -> dict[str, tuple[int, int, int] | None]:
    """The draft norms an SGLang config built by :func:`build_config` sets (read names), each with the first
    release that reads it (:data:`.draft_fields.FIRST_READ`)."""
    return {name: F.FIRST_READ.get(name) for _, name, _ in F.set_fields(sglang_config)}


def norm_weights(sglang_config: dict) -> list[str]:
    """The weights of the draft norms an SGLang config built by :func:`build_config` sets."""
    k = len(sglang_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    return [w for field_name, _, _ in F.set_fields(sglang_config) for w in F.weights_of(field_name, k)]


def _plan(
    src: Path,
    config: dict,
    tensors: dict[str, tuple[TensorInfo, int, int]],
    drop_embed_tokens: bool,
    norms: list[str],
    reading: tuple[frozenset[str], str],
) -> tuple[list[PlannedTensor], dict[str, str], list[str]]:
    items: list[PlannedTensor] = []
    renamed: dict[str, str] = {}
    dropped: list[str] = []
    unknown: list[str] = []
    seen: dict[str, str] = {}
    for name, (t, data_start, mode) in tensors.items():
        out = draft_tensor_name(name)[0]
        if out not in KNOWN_OUTPUT_NAMES and out not in norms:
            unknown.append(name)
            continue
        if out == "embed_tokens.weight" and drop_embed_tokens:
            dropped.append(name)
            continue
        if out in seen:
            raise conversion_error(
                f"tensors {seen[out]} and {name} map to the same output name {out}",
                where=str(src),
                fix="keep one of them",
            )
        seen[out] = name
        if out != name:
            renamed[name] = out
        items.append(PlannedTensor(out, t, data_start, mode))
    if unknown:
        hints = unknown_tensor_hints(unknown, read=reading[0], release=reading[1])
        raise conversion_error(
            f"{len(unknown)} source tensor(s) have no place in sglang's LlamaForCausalLMEagle3 (sglang would drop "
            "them silently)",
            where=str(src),
            found=first_few(sorted(unknown), 8),
            expected="fc, layers.0.* (self_attn q/k/v/o, mlp gate/up/down, input_layernorm, post_attention_layernorm, "
            "hidden_norm), norm, lm_head, embed_tokens, d2t, t2d",
            fix="; ".join(hints)
            or "this draft's architecture differs from sglang's; it cannot be converted faithfully",
        )
    names = {i.out for i in items}
    required = {"fc.weight", "norm.weight"} | {f"midlayer.{p}" for p in _MIDLAYER_PARAMS} | set(norms)
    if not config.get("tie_word_embeddings"):
        required.add("lm_head.weight")
    missing = sorted(required - names)
    if missing:
        raise conversion_error(
            "the source lacks tensors every EAGLE-3 draft needs",
            where=str(src),
            found=", ".join(missing),
            fix="re-export the draft",
        )
    return items, renamed, dropped


def shards(items: list[PlannedTensor], max_shard_size: int) -> list[list[PlannedTensor]]:
    """The planned tensors cut into output shards of at most ``max_shard_size`` bytes (one tensor may exceed it), in
    the order that aligns every tensor's data."""
    ordered = {e[0]: None for e in alignment_order((i.out, i.src.dtype, i.src.shape) for i in items)}
    by_name = {i.out: i for i in items}
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for name in ordered:
        it = by_name[name]
        # pragma: no mutate core/NumberReplacer `0`: only the first shard can be empty when an item comes, and then
        # `shards[0]` is `shards[-1]`
        if shards[-1] and size + it.src.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += it.src.nbytes
    return shards


@dataclass
class Plan:
    """A speculators draft read and judged as the converter judges it (config and headers only, no tensor data)."""

    src: Path
    config: dict  # the source config.json
    sglang_config: dict  # the equivalent SGLang-format config (build_config)
    items: list[PlannedTensor]
    renamed: dict[str, str]
    dropped: list[str]
    src_files: list[str]


def target_layers(target: os.PathLike | str | None, num_target_layers: int | None) -> tuple[int | None, int | None]:
    """The target's layer count and vocabulary, from its config (``--target``) and / or ``--num-target-layers``
    (refused where the two disagree); None where not known."""
    n, vocab = num_target_layers, None
    if target is not None:
        tv = target_view(read_config(target, "target"))
        vocab = tv.vocab
        if n is not None and tv.num_layers is not None and tv.num_layers != n:
            raise conversion_error(
                "--num-target-layers disagrees with the target's config",
                where=f"{target}: {tv.text_prefix}num_hidden_layers",
                found=f"{tv.num_layers} in the config, --num-target-layers {n}",
                fix="pass one of them (--target alone reads the count from the config)",
            )
        n = tv.num_layers if tv.num_layers is not None else n
    return n, vocab


def plan_conversion(
    src: os.PathLike | str,
    *,
    aux_layer_ids: list[int] | None = None,
    drop_embed_tokens: bool = False,
    target: os.PathLike | str | None = None,
    release: str | None = None,
    read: Iterable[str] | None = None,
    num_target_layers: int | None = None,
) -> Plan:
    """Read the speculators draft at ``src`` (its ``config.json`` and safetensors headers, through the safe open)
    and plan its SGLang form; raises :class:`ConvertError` for anything the converter refuses (the original EAGLE
    repository's layout is :func:`.eagle_repo.plan_eagle_repo`'s).

    ``release``, ``read``: see :func:`build_config` (``release`` None: this library's convention and the newest
    release's fields, as ``convert`` writes them).  ``target`` / ``num_target_layers``: the target's layer count
    (:func:`target_layers`).
    """
    src_dir = checkpoint_dir(src, "source draft")
    config = read_config(src_dir, "source draft")
    fmt = detect_format(config)
    if fmt == SGLANG_EAGLE3:
        raise conversion_error(
            "the source is already in SGLang format; nothing to convert",
            where=str(src_dir / "config.json"),
            fix=f"check it with `eagle3-patches doctor --draft {src_dir}`",
        )
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: every other format (`sglang-eagle3`, `eagle`, `model`)
    # sorts before `speculators`
    if fmt != SPECULATORS:
        raise conversion_error(
            "the source is not a speculators EAGLE-3 draft",
            where=str(src_dir / "config.json"),
            found=f"architectures {config.get('architectures')!r:.80}",
            expected='"speculators_model_type": "eagle3" and a transformer_layer_config',
            fix="`eagle3-patches convert` (convert.convert) also reads the original EAGLE repository's layout",
        )
    tensors, src_files = _source_tensors(src_dir)
    n_target, _ = target_layers(target, num_target_layers)
    out_config = build_config(
        config,
        {n: t for n, (t, _, _) in tensors.items()},
        aux_layer_ids=aux_layer_ids,
        num_target_layers=n_target,
        release=release,
        read=read,
        config_path=str(src_dir / "config.json"),
    )
    reading = reading_for(release, read)
    items, renamed, dropped = _plan(src_dir, config, tensors, drop_embed_tokens, norm_weights(out_config), reading)
    return Plan(src_dir, config, out_config, items, renamed, dropped, src_files)


def served_sglang_config(
    path: os.PathLike | str, release: str | None, read: Iterable[str] | None = None
) -> dict | None:
    """The SGLang-format config sglang ``release`` is handed for the speculators draft in the local directory
    ``path`` (``speculators_draft_config``): the converter's config with the aux ids in that release's own
    convention and the draft norms under the names it reads (``read``: the fields the release and the active
    patch set read, :func:`reading_for`).  None when ``path`` is not a local directory whose ``config.json``
    (read through the safe open) is in speculators format; :class:`ConvertError` for a speculators draft the
    converter refuses."""
    try:
        if not os.path.isdir(path):
            return None
        config = read_config(path, "draft")
    except (CheckpointError, OSError, TypeError, ValueError):
        return None  # not a checkpoint eagle3-patches reads: sglang's own reader decides
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: every other format (`sglang-eagle3`, `eagle`, `model`)
    # sorts before `speculators`
    if detect_format(config) != SPECULATORS:
        return None
    return plan_conversion(path, release=release, read=read).sglang_config
