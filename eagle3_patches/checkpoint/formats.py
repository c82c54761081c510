# long module: one reading of config.json: the files, the format and the typed views every check reads
"""Checkpoint formats: read ``config.json`` / the safetensors index, tell formats apart,
and present target and draft configs as typed views.  Never imports sglang or torch.

Formats of an EAGLE-3 draft (see docs/checkpoints.md):

* :data:`SGLANG_EAGLE3` - SGLang / SpecForge: ``architectures: ["LlamaForCausalLMEagle3"]``,
  ``model_type: llama``, ``draft_vocab_size``, ``target_hidden_size``,
  ``eagle_config: {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state}``, ``midlayer.*``.
* :data:`SPECULATORS` - vllm-project/speculators: ``speculators_model_type: eagle3``,
  ``transformer_layer_config``, top-level ``eagle_aux_hidden_state_layer_ids`` (HF
  ``hidden_states`` index meaning), ``layers.0.*``.  No ``model_type``: transformers'
  ``AutoConfig`` cannot read it.  Its ``config.py`` is never executed nor copied.
"""

from __future__ import annotations

import builtins
import os
import posixpath
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import draft_fields as DF
from .layer_ids import CONVENTION_KEY, CONVENTIONS, INPUT_OF_LAYER, OUTPUT_OF_LAYER
from .safe_io import (
    CheckpointError,
    checked_root,
    list_checkpoint_dir,
    load_json,
    read_checkpoint_bytes,
)
from .safe_io import checkpoint_error as _err
from .safetensors_header import Header, TensorInfo, count_read, read_header

SGLANG_EAGLE3 = "sglang-eagle3"
SPECULATORS = "speculators"
EAGLE = "eagle"  # EAGLE-1/2 draft (LlamaForCausalLMEagle): no aux hidden states
MODEL = "model"  # anything else: a target model

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: a config.json is a few KB; the largest known ones (long quantization ignore lists) are < 1 MB
MAX_CONFIG_BYTES = 4 << 20
#: Kimi-K2.5's index (208k tensors) is 24 MB
MAX_INDEX_BYTES = 128 << 20
#: config integers (sizes, counts, ids) beyond this are absurd; bounding them keeps every product printable
MAX_CONFIG_INT = (1 << 31) - 1
#: an id list longer than this is no list of layers
MAX_ID_LIST = 1024

KIMI_K25_ARCH = "KimiK25ForConditionalGeneration"
#: sglang's EAGLE-3 draft with DeepSeek-V2 multi-latent attention (``models/kimi_k25_eagle3.py``, from 0.5.12),
#: the class of the published MLA drafts for Kimi-K2.x; every other EAGLE-3 draft is ``LlamaForCausalLMEagle3``
MLA_DRAFT_ARCH = "Eagle3DeepseekV2ForCausalLM"
LLAMA_DRAFT_ARCH = "LlamaForCausalLMEagle3"
#: the class each draft module (:mod:`.draft_fields`) defines: the one a message about what it reads names
DRAFT_CLASS_OF_MODULE = {DF.DRAFT_MODULE: LLAMA_DRAFT_ARCH, DF.MLA_DRAFT_MODULE: MLA_DRAFT_ARCH}
#: the MLA sizes an MLA draft's config states (sglang refuses a draft without ``q_lora_rank``)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
DEEPSEEK_ARCHS = frozenset({"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", KIMI_K25_ARCH})

__all__ = ["CheckpointError"]  # re-exported: formats.CheckpointError is the error of every checkpoint read


# ------------------------------------------------------------------ files
def checkpoint_dir(path: os.PathLike | str, role: str = "checkpoint") -> Path:
    """The checkpoint directory for ``path`` (a directory, or its ``config.json``)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _err(
            "not-a-checkpoint",
            f"the {role} path cannot be read: {exc.strerror or exc}",
            where=str(p),
            found=type(exc).__name__,
            fix="check the path and its permissions",
        ) from None
    if p.name == "config.json" and st is not None and stat.S_ISREG(st.st_mode):
        p = p.parent
    elif st is None:
        raise _err(
            "not-a-checkpoint",
            f"the {role} path does not exist",
            where=str(p),
            fix=f"pass the local directory of the {role} checkpoint (hub ids are not downloaded by the doctor)",
        )
    elif not stat.S_ISDIR(st.st_mode):
        raise _err(
            "not-a-checkpoint",
            f"the {role} path is not a directory",
            where=str(p),
            found="a file",
            expected="a checkpoint directory holding config.json and *.safetensors",
            fix=f"pass the directory that holds the {role}'s config.json",
        )
    checked_root(p, role)
    return p


def read_json(path: Path, what: str, *, max_bytes: int = MAX_CONFIG_BYTES, code: str = "config-json") -> Any:
    """Parse a JSON file of the checkpoint ``path.parent`` (safe open, size and parse budgets)."""
    raw = read_checkpoint_bytes(path.parent, path.name, max_bytes=max_bytes, what=what, code=code)
    count_read(len(raw))
    return load_json(raw, what=what, where=str(path), code=code)


def read_config(path: os.PathLike | str, role: str = "checkpoint") -> dict:
    """The checkpoint's ``config.json`` as a dict (clear errors for missing, malformed, not a checkpoint)."""
    d = checkpoint_dir(path, role)
    cfg = d / "config.json"
    if not os.path.lexists(cfg):
        has_weights = any(n.endswith(".safetensors") or n == INDEX_NAME for n in list_checkpoint_dir(d, role))
        if not has_weights:
            raise _err(
                "not-a-checkpoint",
                f"the {role} directory is not a checkpoint: no config.json and no *.safetensors",
                where=str(d),
                fix=f"pass the directory that holds the {role}'s config.json and weights",
            )
        raise _err(
            "config-json",
            f"the {role} checkpoint has weights but no config.json",
            where=str(d),
            fix="copy the config.json that belongs to these weights into the directory",
        )
    obj = read_json(cfg, f"the {role}'s config.json")
    if not isinstance(obj, dict):
        raise _err(
            "config-json",
            f"the {role}'s config.json is not a JSON object",
            where=str(cfg),
            found=type(obj).__name__,
            expected="an object",
            fix=f"repair or re-download {cfg}",
        )
    return obj


@dataclass
class WeightFiles:
    directory: Path
    index: Path | None = None
    weight_map: dict[str, str] | None = None  # None when the index was not read; file names normalized
    files: list[Path] = field(default_factory=list)  # every candidate, read or not: opening refuses by name
    pickles: list[Path] = field(default_factory=list)


def shard_name(name: str) -> str | None:
    """``name`` from an index as a normalized relative path (``./a`` -> ``a``), or None when it leaves the directory."""
    if not name or "\0" in name or posixpath.isabs(name):
        return None
    norm = posixpath.normpath(name)
    if norm in (".", "..") or norm.startswith("../"):
        return None
    return norm


def read_index(path: Path) -> dict[str, str]:
    """The index's ``weight_map`` (tensor name -> normalized shard file name)."""
    obj = read_json(path, "the safetensors index", max_bytes=MAX_INDEX_BYTES, code="safetensors-index")
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not set(map(type, wm.values())) <= {str}:  # JSON keys are always strings
        raise _err(
            "safetensors-index",
            "the safetensors index has no weight_map of tensor name -> file name",
            where=str(path),
            found=repr(obj)[:200],
            fix=f"repair {path.name}, or delete it if the directory holds a single model.safetensors",
        )
    names = {v: shard_name(v) for v in set(wm.values())}
    bad = sorted(v for v, n in names.items() if n is None)
    if bad:
        raise _err(
            "safetensors-index",
            "the safetensors index names files outside the checkpoint directory",
            where=str(path),
            found=", ".join(repr(b) for b in bad[:5]),
            fix="shard file names must be relative names inside the checkpoint directory",
        )
    if all(n == v for v, n in names.items()):
        return wm
    return {k: names[v] or v for k, v in wm.items()}  # every name was checked above: none is None here


def list_weight_files(path: os.PathLike | str, *, read_the_index: bool = True) -> WeightFiles:
    """The safetensors files of a checkpoint (from its index when present and read, else every ``*.safetensors`` entry).

    Entries are listed by name, never opened or followed here: a FIFO, a directory or an
    outward link named ``*.safetensors`` is listed, and refused by name when it is opened.
    """
    d = Path(path)
    wf = WeightFiles(d)
    names = list_checkpoint_dir(d)
    if INDEX_NAME in names:
        wf.index = d / INDEX_NAME
        if read_the_index:
            wf.weight_map = read_index(wf.index)
            wf.files = [d / n for n in sorted(set(wf.weight_map.values()))]
    if not wf.files:
        wf.files = [d / n for n in names if n.endswith(".safetensors")]
    wf.pickles = [d / n for n in names if n.endswith(PICKLE_SUFFIXES)]
    return wf


@dataclass
class ShardScan:
    """Every header of a (small) checkpoint, read: what the draft checks and the converter need."""

    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    headers: dict[str, Header] = field(default_factory=dict)  # shard file name -> header
    errors: list[CheckpointError] = field(default_factory=list)  # unreadable, refused or missing shards
    duplicates: list[tuple[str, str, str]] = field(default_factory=list)  # (name, first file, second file)
    absent: list[str] = field(default_factory=list)  # index names not in the shard the index names

    @property
    def ok(self) -> bool:
        return not self.errors


def scan_shards(wf: WeightFiles, role: str = "checkpoint") -> ShardScan:
    """Read every shard header of ``wf`` (through the safe open), collecting problems instead of raising."""
    scan = ShardScan()
    for p in wf.files:
        if not os.path.lexists(p):
            scan.errors.append(
                _err(
                    "safetensors-index",
                    f"a shard named by the {role}'s index is missing",
                    where=str(wf.index),
                    found=str(p.relative_to(wf.directory)),
                    fix=f"restore the shard or re-export the {role}",
                )
            )
            continue
        try:
            h = read_header(p, root=wf.directory)
            tensors = h.tensors
        except CheckpointError as exc:
            scan.errors.append(exc)
            continue
        scan.headers[h.file] = h
        for name, t in tensors.items():
            if name in scan.tensors:
                scan.duplicates.append((name, scan.tensors[name].file, t.file))
            scan.tensors[name] = t
    if wf.weight_map is not None and scan.ok:
        scan.absent = [n for n, f in wf.weight_map.items() if n not in scan.tensors or scan.tensors[n].file != f]
    return scan


# ------------------------------------------------------------------ formats
def detect_format(config: dict) -> str:
    """:data:`SPECULATORS`, :data:`SGLANG_EAGLE3`, :data:`EAGLE` or :data:`MODEL`."""
    spec_type = config.get("speculators_model_type")
    if spec_type == "eagle3" or (spec_type is None and isinstance(config.get("transformer_layer_config"), dict)):
        return SPECULATORS  # speculators' EAGLE-1 ("eagle") is no EAGLE-3 draft: checkpoint/draft_layouts names it
    archs = config.get("architectures")
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if any(a in ("Eagle3Speculator", "Eagle3DraftModel") for a in archs):
        return SPECULATORS
    if any("eagle3" in a.lower() for a in archs):
        return SGLANG_EAGLE3
    ec = config.get("eagle_config")
    if isinstance(ec, dict) and ec.get("use_aux_hidden_state"):
        return SGLANG_EAGLE3
    if any("eagle" in a.lower() for a in archs):
        return EAGLE
    return MODEL


# ------------------------------------------------------------------ typed access
@dataclass
class FieldProblem:
    where: str
    found: str
    expected: str


class _Reader:
    """Typed reads from a config dict that record, rather than raise, on wrong types."""

    def __init__(self, d: dict, prefix: str, problems: list[FieldProblem]):
        self.d, self.prefix, self.problems = d, prefix, problems

    def where(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def int(self, key: str, *, minimum: int = 1, required: bool = False) -> int | None:
        v = self.d.get(key)
        expected = f"an integer in {minimum}..{MAX_CONFIG_INT}"
        if v is None:
            if required:
                self.problems.append(FieldProblem(self.where(key), "missing", expected))
            return None
        if type(v) is not int or not minimum <= v <= MAX_CONFIG_INT:
            self.problems.append(FieldProblem(self.where(key), repr(v)[:80], expected))
            return None
        return v

    def str(self, key: str) -> str | None:
        v = self.d.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            self.problems.append(FieldProblem(self.where(key), repr(v)[:80], "a string"))
            return None
        return v

    # the methods below are named after the types they read, so their annotations spell the builtins out
    def bool(self, key: builtins.str, default: builtins.bool | None = None) -> builtins.bool | None:
        # pragma: no mutate eagle3/IgnoreArgument: every caller of `_Reader.bool` gives a default of `None` or `False`
        # and reads the result through `bool()`: a missing field reads false either way
        v = self.d.get(key, default)
        if v is None or isinstance(v, bool):
            return v
        self.problems.append(FieldProblem(self.where(key), repr(v)[:80], "true or false"))
        # pragma: no mutate eagle3/IgnoreArgument: every caller of `_Reader.bool` gives a default of `None` or `False`
        # and reads the result through `bool()`: a missing field reads false either way (the value returned for a field
        # of the wrong type, whose problem is recorded either way)
        return default

    def dict(self, key: builtins.str) -> builtins.dict | None:
        v = self.d.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            self.problems.append(FieldProblem(self.where(key), repr(v)[:80], "an object"))
            return None
        return v

    def int_list(self, key: builtins.str) -> list[builtins.int] | None:
        v = self.d.get(key)
        if v is None:
            return None
        if (
            not isinstance(v, list)
            or len(v) > MAX_ID_LIST
            or not all(type(i) is int and abs(i) <= MAX_CONFIG_INT for i in v)
        ):
            self.problems.append(
                FieldProblem(
                    self.where(key),
                    repr(v)[:80],
                    f"a list of at most {MAX_ID_LIST} integers in -{MAX_CONFIG_INT}..{MAX_CONFIG_INT}",
                )
            )
            return None
        return list(v)

    def str_list(self, key: builtins.str) -> list[builtins.str]:
        v = self.d.get(key)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(i, str) for i in v):
            self.problems.append(FieldProblem(self.where(key), repr(v)[:80], "a list of strings"))
            return []
        return list(v)


def config_dtype(d: dict) -> str | None:
    """The dtype a config states (``dtype`` first, as sglang reads it, then ``torch_dtype``)."""
    for key in ("dtype", "torch_dtype"):
        v = d.get(key)
        if isinstance(v, str) and v:
            return v.replace("torch.", "")
    return None


@dataclass
class TargetView:
    config: dict
    architectures: list[str]
    model_type: str | None
    text_prefix: str  # "text_config." for multimodal wrappers, else ""
    num_layers: int | None
    hidden: int | None
    vocab: int | None
    dtype: str | None
    first_k_dense_replace: int | None
    quantized: bool
    problems: list[FieldProblem]
    #: the target's attention is MLA (a DeepSeek-V3-family config stating ``kv_lora_rank``): one latent KV per token,
    #: which sglang's disaggregation sends whole from one prefill rank
    mla: bool = False

    @property
    def arch(self) -> str:
        return self.architectures[0] if self.architectures else ""

    @property
    def is_kimi_k25(self) -> bool:
        return self.arch == KIMI_K25_ARCH or self.model_type == "kimi_k25"

    @property
    def deepseek_family(self) -> bool:
        return self.arch in DEEPSEEK_ARCHS or self.model_type in ("deepseek_v3", "deepseek_v2", "kimi_k25", "kimi_k2")


def target_view(config: dict) -> TargetView:
    problems: list[FieldProblem] = []
    top = _Reader(config, "", problems)
    archs = top.str_list("architectures")
    text = config.get("text_config")
    prefix = ""
    if isinstance(text, dict):
        prefix = "text_config."
        src = text
    else:
        if text is not None:
            problems.append(FieldProblem("text_config", repr(text)[:80], "an object"))
        src = config
    r = _Reader(src, prefix, problems)
    return TargetView(
        config=config,
        architectures=archs,
        model_type=top.str("model_type"),
        text_prefix=prefix,
        num_layers=r.int("num_hidden_layers", required=True),
        hidden=r.int("hidden_size", required=True),
        vocab=r.int("vocab_size", required=True),
        dtype=config_dtype(config) or config_dtype(src),
        first_k_dense_replace=r.int("first_k_dense_replace", minimum=0),
        quantized=isinstance(config.get("quantization_config"), dict)
        or isinstance(src.get("quantization_config"), dict),
        problems=problems,
        mla=r.int("kv_lora_rank") is not None,
    )


@dataclass
class DraftView:
    format: str
    config: dict
    layer_prefix: str  # where the llama fields live ("" or "transformer_layer_config.")
    architectures: list[str]
    model_type: str | None
    hidden: int | None
    vocab: int | None
    draft_vocab: int | None  # None: not stated
    target_hidden: int | None  # None: not stated (sglang uses hidden_size)
    num_layers: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    intermediate: int | None
    dtype: str | None
    tie_word_embeddings: bool
    fc_bias: bool
    aux_ids: list[int] | None
    aux_ids_where: str
    convention: str
    convention_stated: bool
    use_aux_hidden_state: bool | None
    ignored_top_level_ids: list[int] | None  # sglang format: a top-level id list sglang never reads
    layer_model_type: str | None
    problems: list[FieldProblem]
    #: an MLA draft's sizes (:data:`MLA_FIELDS`, None where not stated); None for every other draft
    mla: dict[str, int | None] | None = None

    @property
    def sglang_class(self) -> str:
        """The class sglang builds for this draft."""
        return MLA_DRAFT_ARCH if self.mla is not None else LLAMA_DRAFT_ARCH

    @property
    def is_eagle3(self) -> bool:
        return self.format in (SGLANG_EAGLE3, SPECULATORS)

    @property
    def effective_target_hidden(self) -> int | None:
        return self.target_hidden if self.target_hidden is not None else self.hidden

    @property
    def effective_draft_vocab(self) -> int | None:
        return self.draft_vocab if self.draft_vocab is not None else self.vocab

    @property
    def output_ids(self) -> list[int] | None:
        """The aux ids in the output-of-layer convention."""
        if self.aux_ids is None:
            return None
        return [i - 1 for i in self.aux_ids] if self.convention == INPUT_OF_LAYER else list(self.aux_ids)


def draft_view(config: dict) -> DraftView:
    problems: list[FieldProblem] = []
    fmt = detect_format(config)
    top = _Reader(config, "", problems)
    if fmt == SPECULATORS:
        layer = top.dict("transformer_layer_config") or {}
        prefix = "transformer_layer_config."
    else:
        layer = config
        prefix = ""
    r = _Reader(layer, prefix, problems)
    hidden = r.int("hidden_size", required=True)
    heads = r.int("num_attention_heads", required=True)
    head_dim = r.int("head_dim")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    ignored_top = None
    if fmt == SPECULATORS:
        ids = top.int_list("eagle_aux_hidden_state_layer_ids")
        ids_where = "eagle_aux_hidden_state_layer_ids"
        convention, stated = INPUT_OF_LAYER, True
        use_aux = True
    else:
        ec = top.dict("eagle_config") or {}
        er = _Reader(ec, "eagle_config.", problems)
        ids = er.int_list("eagle_aux_hidden_state_layer_ids")
        ids_where = "eagle_config.eagle_aux_hidden_state_layer_ids"
        conv = er.str(CONVENTION_KEY)
        if conv is not None and conv not in CONVENTIONS:
            problems.append(FieldProblem(f"eagle_config.{CONVENTION_KEY}", repr(conv)[:80], " or ".join(CONVENTIONS)))
            conv = None
        convention, stated = (conv, True) if conv else (OUTPUT_OF_LAYER, False)
        use_aux = bool(er.bool("use_aux_hidden_state"))
        if "eagle_aux_hidden_state_layer_ids" in config:
            ignored_top = top.int_list("eagle_aux_hidden_state_layer_ids")
    draft_vocab = top.int("draft_vocab_size")
    target_hidden = top.int("target_hidden_size")
    # speculators: a null target_hidden_size means "the verifier's hidden size"
    tie = top.bool("tie_word_embeddings", False)
    archs = top.str_list("architectures")
    return DraftView(
        format=fmt,
        config=config,
        layer_prefix=prefix,
        architectures=archs,
        model_type=top.str("model_type"),
        hidden=hidden,
        vocab=r.int("vocab_size", required=True),
        draft_vocab=draft_vocab,
        target_hidden=target_hidden,
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: `detect_format` gives `eagle`, `model`,
        # `sglang-eagle3` or `speculators`, and the other three sort before `speculators`, so `<` is `!=` on every value
        # `fmt` takes (as in `speculators_draft_config` above)
        num_layers=r.int("num_hidden_layers", minimum=0, required=fmt != SPECULATORS),
        heads=heads,
        kv_heads=r.int("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate=r.int("intermediate_size", required=True),
        dtype=config_dtype(config) or config_dtype(layer),
        tie_word_embeddings=bool(tie),
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: `detect_format` gives `eagle`, `model`,
        # `sglang-eagle3` or `speculators`, and the other three sort before `speculators`, so `<` is `!=` on every value
        # `fmt` takes (as in `speculators_draft_config` above)
        fc_bias=bool(r.bool("bias", False)) if fmt != SPECULATORS else False,
        aux_ids=ids,
        aux_ids_where=ids_where,
        convention=convention,
        convention_stated=stated,
        use_aux_hidden_state=use_aux,
        ignored_top_level_ids=ignored_top,
        layer_model_type=layer.get("model_type") if isinstance(layer.get("model_type"), str) else None,
        problems=problems,
        mla={f: r.int(f) for f in MLA_FIELDS} if MLA_DRAFT_ARCH in archs else None,
    )


def per_head_draft_beside_mla(target: os.PathLike | str, draft: os.PathLike | str) -> bool:
    """An MLA target (its config states ``kv_lora_rank``) with a draft that is not the MLA class: the pair whose
    draft KV sglang's disaggregation sends unsliced from one prefill rank.  Raises :class:`CheckpointError` for a
    config that cannot be read."""
    mla_target = target_view(read_config(target, "target")).mla
    return mla_target and MLA_DRAFT_ARCH not in (read_config(draft, "draft").get("architectures") or [])


def draft_module(config: Any) -> str:
    """The module (:mod:`.draft_fields`) of the sglang class that serves a draft whose ``config.json`` is ``config``:
    the MLA draft's for its architecture, the Llama draft's for every other."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    return DF.MLA_DRAFT_MODULE if isinstance(archs, list) and MLA_DRAFT_ARCH in archs else DF.DRAFT_MODULE


def unknown_tensor_hints(names, *, read: Iterable[str], release: str, module: str = DF.DRAFT_MODULE) -> list[str]:
    """What tensors sglang's ``LlamaForCausalLMEagle3`` has no parameter for usually mean (doctor,
    converter and the strict loader say the same).  ``read``: the config fields (read names, as
    :mod:`.draft_fields` spells them) the judged release reads, or the patch set adds; ``release``: how to
    name that release in the hint.  A draft norm's weight (:data:`.draft_fields.FIELD_WEIGHTS`) the release
    reads has no parameter only because the config does not set its field; one it does not read: the first
    release that reads it."""
    import re

    names = list(names)
    hints = []
    by_field: dict[str, list[str]] = {}
    for n in names:
        fld = DF.field_of_weight(n)
        if fld is not None:
            by_field.setdefault(fld, []).append(n)
    for fld, weights in by_field.items():
        shown = ", ".join(sorted(weights)[:3]) + (" ..." if len(weights) > 3 else "")
        if DF.read_name(fld, read) is not None:
            hints.append(
                f"{shown} belong(s) to {fld} ({DF.MATH_FIELDS[fld]}), which {release} reads: they load only when the "
                f"draft's config sets {fld} true, as the draft was trained"
            )
        else:
            hints.append(
                f"{shown} mean(s) the draft was trained with {fld}=true, which {release}'s "
                f"{DRAFT_CLASS_OF_MODULE[module]} does not read ({DF.reads_it(fld, module)}): serve it on such a "
                f"release, or retrain without {fld}"
            )
    if any(re.search(r"(q_norm|k_norm)", n) for n in names):
        hints.append("q_norm/k_norm come from a qwen3 decoder layer, which LlamaForCausalLMEagle3 does not run")
    if any(re.match(r"^(model\.)?(layers|midlayer)\.[1-9]", n) for n in names):
        hints.append("sglang's EAGLE-3 draft has one decoder layer")
    if "model.lm_head.weight" in names:
        hints.append("rename model.lm_head.weight to lm_head.weight")
    return hints
