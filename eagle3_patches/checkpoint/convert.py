"""Convert a speculators-format EAGLE-3 draft to SGLang format, streaming, atomically.

    from eagle3_patches.checkpoint.convert import convert
    result = convert("/models/draft-speculators", "/models/draft-sglang")

What changes (docs/checkpoints.md has the full mapping):

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

How: headers are planned first, then every tensor's bytes are copied from the source
file's data region into the new file (``os.copy_file_range`` where the kernel has it),
so the peak memory is one copy buffer, no pickle is ever loaded and nothing is decoded.
The output is written into a temporary directory next to DST, its headers re-read and
checked against the plan, the doctor's draft checks run on it, and only then is it
renamed to DST: an interrupted run (SIGINT, SIGTERM, SIGHUP) leaves no DST, no temporary
directory and no parent directory it created; one left by a SIGKILLed run is removed by the
next run on the same DST once its owner process is gone.  SRC is never written.  An
existing DST is refused unless ``force``.

Every source file is read through :mod:`.safe_io` (no link out of SRC, regular files only);
side files (tokenizer, generation config, chat template) are an allow-list; no DST file is
given wider permissions than its source file.

Drafts speculators trained with ``norm_before_fc``, ``norm_before_residual``,
``norm_output`` or ``fc_norm`` (or a non-llama decoder layer) are refused: sglang's
``LlamaForCausalLMEagle3`` cannot run them faithfully.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..diagnostic import first_few
from ..errors import Eagle3ConfigError
from . import layer_ids as L
from .formats import (
    SGLANG_EAGLE3,
    SPECULATORS,
    SPECULATORS_UNSUPPORTED,
    checkpoint_dir,
    detect_format,
    draft_view,
    list_weight_files,
    read_config,
    scan_shards,
    unknown_tensor_hints,
)
from .safe_io import CheckpointError, list_checkpoint_dir, open_checkpoint_file, resolve_checkpoint_file
from .safetensors_header import (
    TensorInfo,
    alignment_order,
    encode_header,
    read_header,
)

#: default largest output shard (as transformers' save_pretrained)
DEFAULT_MAX_SHARD_SIZE = 5 * 1000**3
COPY_CHUNK = 64 << 20
#: side files larger than this are refused (the largest tokenizers are ~30 MB)
MAX_SIDE_FILE_BYTES = 256 << 20
#: the permission bits DST files may have at most (and never more than their source file)
MAX_MODE = 0o644
#: the allow-list of small non-weight files copied to DST (never *.py, never pickles)
COPY_FILES = re.compile(
    r"^(tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt"
    r"|generation_config\.json|[\w.-]*\.tiktoken|tiktoken\.model|chat_template\.(json|jinja))$"
)
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


class ConvertInterrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP during a conversion: handled like Ctrl-C (cleanup, then exit 128 + signum)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@dataclass
class ConvertResult:
    src: Path
    dst: Path
    files: list[Path]
    tensors: int
    bytes_copied: int
    seconds: float
    config: dict
    renamed: dict[str, str]  # source name -> output name, where they differ
    dropped: list[str]
    report: Any = None  # the doctor's Report on the output
    notes: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)  # debris of killed earlier runs removed (or an old DST restored)


@dataclass(frozen=True)
class _Item:
    out: str
    src: TensorInfo
    src_data_start: int
    src_mode: int  # permission bits of the source shard


# ====================================================================== helpers
def parse_size(text: str | int) -> int:
    """``5GB`` / ``500MB`` / ``1GiB`` / ``123`` -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB)")
    num, unit = float(m.group(1)), (m.group(2) or "").upper()
    base = 1024 if "I" in unit else 1000
    power = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[:1] if unit and unit[0] in "KMGT" else ""]
    size = int(num * base**power)
    if size <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return size


def _err(what: str, **kw: str) -> ConvertError:
    return ConvertError(what, **kw)


def _inside(a: Path, b: Path) -> bool:
    """a == b or a is inside b."""
    try:
        a.relative_to(b)
        return True
    except ValueError:
        return False


def _check_paths(src: Path, dst: Path, force: bool) -> Path:
    """``dst`` made absolute; refuses a DST that overlaps SRC, is the current directory (or above it), or exists."""
    rs, rd = Path(os.path.realpath(src)), Path(os.path.abspath(dst))
    cwd = Path(os.getcwd())
    if rd == Path(rd.anchor) or _inside(cwd, rd):
        raise _err(
            "DST must name a new directory, not the current directory, one of its parents or the root",
            where=str(dst),
            found=str(rd),
            fix="name a new directory, e.g. ./draft-sglang",
        )
    rd_real = Path(os.path.realpath(rd))  # realpath, not Path.resolve: a symlink loop is no RuntimeError
    if _inside(rd_real, rs) or _inside(rs, rd_real):
        raise _err(
            "the destination overlaps the source; the converter never writes into SRC",
            where=str(dst),
            found=f"SRC {rs}, DST {rd}",
            fix="choose a DST outside SRC (e.g. a sibling directory)",
        )
    if os.path.lexists(rd) and not force:
        raise _err(
            "the destination already exists",
            where=str(dst),
            fix="choose a new DST, or pass --force to replace it",
        )
    return rd


def _dst_error(exc: OSError, path: Path, action: str) -> ConvertError:
    """An OSError while writing DST as what / where / found / fix."""
    where = path
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        for parent in [path, *path.parents]:  # name the component that is not a directory
            if os.path.lexists(parent) and not parent.is_dir():
                return _err(f"cannot {action}: {parent} is not a directory", where=str(path), found=f"a file at {parent}", expected="a directory (or nothing) at each component of DST", fix="choose another DST, or move that file away")
    fix = {
        errno.EACCES: "choose a DST in a directory you can write, or fix its permissions",
        errno.EPERM: "choose a DST in a directory you can write, or fix its permissions",
        errno.EROFS: "the filesystem is read-only: choose a DST on a writable one",
        errno.ENOSPC: "free space or choose a DST on another filesystem",
        errno.EDQUOT: "free space or choose a DST on another filesystem",
        errno.ENAMETOOLONG: "choose a shorter DST",
    }.get(exc.errno or 0, "check DST and its parent directory")
    return _err(f"cannot {action}: {exc.strerror or exc}", where=str(where), found=f"{type(exc).__name__} [errno {exc.errno}]", fix=fix)


def _make_parents(parent: Path) -> list[Path]:
    """``mkdir -p parent``; returns the directories it created, outermost first (removed again on failure)."""
    missing = []
    p = parent
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    created = []
    try:
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            created.append(d)
    except OSError as exc:
        _remove_dirs(created)
        raise _dst_error(exc, d, "create the destination's parent directory") from None
    return created


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            os.rmdir(d)
        except OSError:
            break


# ---------------------------------------------------------------- owner tokens (stale temp dirs)
def _process_token(pid: int) -> str | None:
    """A token naming process ``pid`` uniquely across pid reuse and reboots (Linux: boot id + start time), or None if gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        try:  # a kernel without the boot id (some containers): the start time alone still tells pids apart
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
        except OSError:
            boot = ""
        return f"{boot}{stat_line.rsplit(')', 1)[1].split()[19]}"
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # /proc is there and the process is not
    except (OSError, IndexError, ValueError):
        pass
    try:  # no /proc: only "is the pid alive"
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return "0"


_TEMP = re.compile(r"^\.(?P<dst>.+)\.eagle3-(?P<kind>convert|old)-(?P<pid>\d+)-(?P<token>[0-9a-f]+)-[0-9a-f]{8}$")


def _temp_name(dst: Path, kind: str) -> Path:
    pid = os.getpid()
    return dst.parent / f".{dst.name}.eagle3-{kind}-{pid}-{_process_token(pid)}-{uuid.uuid4().hex[:8]}"


def _remove_stale(dst: Path) -> list[str]:
    """Remove temp dirs of earlier runs on ``dst`` whose owner process is gone (a SIGKILLed run's debris).

    A left ``.eagle3-old-*`` directory (a killed ``--force`` run between its two renames) is
    put back as DST when DST is missing, else removed.  Returns notes on what was done.
    """
    notes = []
    try:
        names = os.listdir(dst.parent)
    except OSError:
        return notes
    for name in names:
        m = _TEMP.match(name)
        if not m or m["dst"] != dst.name or _process_token(int(m["pid"])) == m["token"]:
            continue
        path = dst.parent / name
        try:
            st = os.lstat(path)
        except OSError:  # removed meanwhile
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if m["kind"] == "old" and not os.path.lexists(dst):
            os.rename(path, dst)
            notes.append(f"restored {dst} from {name}, left by a killed run (pid {m['pid']})")
        else:
            shutil.rmtree(path, ignore_errors=True)
            notes.append(f"removed {name}, left by a killed run (pid {m['pid']})")
    return notes


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`ConvertInterrupted` (like SIGINT's KeyboardInterrupt) while converting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise ConvertInterrupted(signum)

    old = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


# ====================================================================== planning
def _source_tensors(src: Path) -> tuple[dict[str, tuple[TensorInfo, int, int]], list[str]]:
    """name -> (tensor, data start of its shard, its shard's permission bits); and the shard names."""
    wf = list_weight_files(src)
    if not wf.files:
        if wf.pickles:
            raise _err(
                "the source has only pickle weights; the converter never loads pickles",
                where=str(src),
                found=", ".join(p.name for p in wf.pickles[:3]),
                fix="re-save the draft with safetensors (speculators' save_pretrained writes model.safetensors)",
            )
        raise _err("the source directory holds no *.safetensors weights", where=str(src), fix="pass the speculators draft's directory")
    scan = scan_shards(wf, "source draft")
    if scan.errors:
        raise scan.errors[0]
    if scan.duplicates:
        name, first, second = scan.duplicates[0]
        raise _err(f"tensor {name} is stored in two shards", where=str(src), found=f"{first}, {second}", fix="re-export the draft")
    if scan.absent:
        raise _err("tensors in the source's index are not in the shard it names", where=str(wf.index), found=", ".join(scan.absent[:5]), fix="re-export the draft")
    out = {}
    for name, t in scan.tensors.items():
        h = scan.headers[t.file]
        out[name] = (t, h.data_start, h.mode)
    return out, list(scan.headers)


def _output_name(name: str) -> str:
    m = re.match(r"^(model\.)?layers\.0\.", name)
    if m:
        return "midlayer." + name[m.end():]
    if name.startswith("model.") and name != "model.lm_head.weight":
        return name[len("model."):]
    return name


def unsupported(config: dict, tensor_names=(), *, config_path: str = "config.json") -> ConvertError | None:
    """Why sglang's ``LlamaForCausalLMEagle3`` cannot run this speculators draft faithfully, or None.

    The one place for that message: the converter raises it, ``speculators_draft_config`` raises it at
    start (before any rank loads weights) and the doctor reports it (``draft-unsupported-architecture``).
    """
    bad = [k for k in SPECULATORS_UNSUPPORTED if config.get(k)]
    if "input_norm.weight" in tensor_names and "norm_before_fc" not in bad:
        bad.append("norm_before_fc (input_norm.weight present)")
    if "norm_before_residual" not in config:  # vLLM's speculators adapter reads a missing one as true
        bad.append("norm_before_residual (missing: vLLM reads it as true)")
    if bad:
        return _err(
            "this draft was trained with options sglang's LlamaForCausalLMEagle3 does not implement; served by sglang "
            "(converted or directly) it would load but predict wrong",
            where=f"{config_path}: {bad[0].split(' ')[0]}",
            found=", ".join(b if "(" in b else f"{b}=true" for b in bad),
            expected="norm_before_fc, norm_before_residual, norm_output, fc_norm all false",
            fix="retrain (or fine-tune) the draft with those options off, or serve it with vLLM"
                + ('; if it was trained with norm_before_residual=false, write "norm_before_residual": false into its '
                   "config.json" if "norm_before_residual" not in config else ""),
        )
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        return _err("the source config has no transformer_layer_config", where=f"{config_path}: transformer_layer_config",
                    fix="this is not a speculators EAGLE-3 draft")
    if layer.get("model_type", "llama") != "llama":
        return _err(
            "the draft's decoder layer is not a llama layer; sglang's LlamaForCausalLMEagle3 runs only llama",
            where=f"{config_path}: transformer_layer_config.model_type",
            found=repr(layer.get("model_type")),
            expected="'llama'",
            fix="train the draft with a llama transformer_layer_config",
        )
    if layer.get("num_hidden_layers", 1) != 1:
        return _err("sglang's EAGLE-3 draft has exactly one decoder layer", where=f"{config_path}: transformer_layer_config.num_hidden_layers",
                    found=str(layer.get("num_hidden_layers")), expected="1")
    return None


def build_config(config: dict, tensors: dict[str, TensorInfo], *, aux_layer_ids: list[int] | None = None,
                 num_target_layers: int | None = None, release: str | None = None, config_path: str = "config.json") -> dict:
    """The SGLang-format config.json for a speculators config (raises :class:`ConvertError`).

    ``release``: None (the converter) writes the aux ids in this library's ``output-of-layer`` convention;
    an sglang version writes them in the convention that release's own rule reads
    (:func:`~.layer_ids.release_convention`: ``speculators_draft_config`` serving the draft directly).
    Either way the convention is recorded under ``eagle_config.eagle3_patches_layer_id_convention``.
    """
    dv = draft_view(config)
    if dv.problems:
        p = dv.problems[0]
        raise _err(f"the source config field {p.where} is unusable", where=f"{config_path}: {p.where}", found=p.found, expected=p.expected, fix="repair the source config.json")
    refusal = unsupported(config, tensors, config_path=config_path)
    if refusal is not None:
        raise refusal
    layer = config["transformer_layer_config"]
    ids = aux_layer_ids if aux_layer_ids is not None else dv.aux_ids
    if not ids:
        raise _err(
            "the source config names no aux layer ids",
            where=f"{config_path}: eagle_aux_hidden_state_layer_ids",
            fix="pass --aux-layer-ids with the ids the draft was trained on (speculators' meaning, e.g. 2,30,58 for Kimi-K2.5)",
        )
    ids_where = "--aux-layer-ids" if aux_layer_ids is not None else f"{config_path}: eagle_aux_hidden_state_layer_ids"
    if len(set(ids)) != len(ids) or list(ids) != sorted(ids):
        raise _err("the aux layer ids are not distinct and increasing", where=ids_where, found=str(ids), fix="sglang concatenates states in layer order: such a draft cannot be served correctly")
    if any(type(i) is not int or not 0 <= i <= L.MAX_LAYERS for i in ids):
        raise _err(
            "the aux layer ids are not layer numbers",
            where=ids_where,
            found=repr(list(ids))[:200],
            expected=f"integers in 1..{L.MAX_LAYERS} (speculators' meaning: HF hidden_states index)",
            fix="pass the ids the draft was trained on with --aux-layer-ids (and --target to check them against the target)",
        )
    out_ids = L.to_output_of_layer(ids, L.INPUT_OF_LAYER)
    convention = L.OUTPUT_OF_LAYER if release is None else L.release_convention(release)
    if out_ids[0] < 0:
        raise _err(
            "aux id 0 (the embeddings, HF hidden_states[0]) cannot be captured by sglang",
            where=ids_where,
            found=str(ids),
            fix="only the outputs of decoder layers can be captured",
        )
    if num_target_layers is not None and out_ids[-1] > num_target_layers - 2:
        raise _err(
            f"aux id {ids[-1]} (the input of layer {ids[-1]}) has no capture point in sglang on a {num_target_layers}-layer target",
            where=ids_where,
            found=str(ids),
            expected=f"ids in 1..{num_target_layers - 1}",
            fix="the final hidden state (id num_layers) cannot be captured by sglang",
        )
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

    out = {k2: v for k2, v in layer.items() if k2 not in ("rope_parameters", "dtype", "torch_dtype", "architectures", "auto_map")}
    rp = layer.get("rope_parameters")
    if isinstance(rp, dict):
        if "rope_theta" in rp:
            out["rope_theta"] = rp["rope_theta"]
        rope_type = rp.get("rope_type", rp.get("type", "default"))
        extra = {k2: v for k2, v in rp.items() if k2 not in ("rope_theta", "rope_type", "type")}
        out["rope_scaling"] = None if rope_type == "default" and not extra else {**extra, "rope_type": rope_type, "type": rope_type}
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
                "verifier": (config.get("speculators_config") or {}).get("verifier") if isinstance(config.get("speculators_config"), dict) else None,
            },
        }
    )
    if out.get("torch_dtype") is None:
        out.pop("torch_dtype")
    return out


def _plan(src: Path, config: dict, tensors: dict[str, tuple[TensorInfo, int, int]], drop_embed_tokens: bool) -> tuple[list[_Item], dict[str, str], list[str]]:
    items: list[_Item] = []
    renamed: dict[str, str] = {}
    dropped: list[str] = []
    unknown: list[str] = []
    seen: dict[str, str] = {}
    for name, (t, data_start, mode) in tensors.items():
        out = _output_name(name)
        if out not in KNOWN_OUTPUT_NAMES:
            unknown.append(name)
            continue
        if out == "embed_tokens.weight" and drop_embed_tokens:
            dropped.append(name)
            continue
        if out in seen:
            raise _err(f"tensors {seen[out]} and {name} map to the same output name {out}", where=str(src), fix="keep one of them")
        seen[out] = name
        if out != name:
            renamed[name] = out
        items.append(_Item(out, t, data_start, mode))
    if unknown:
        hints = unknown_tensor_hints(unknown)
        raise _err(
            f"{len(unknown)} source tensor(s) have no place in sglang's LlamaForCausalLMEagle3 (sglang would drop them silently)",
            where=str(src),
            found=first_few(sorted(unknown), 8),
            expected="fc, layers.0.* (self_attn q/k/v/o, mlp gate/up/down, input_layernorm, post_attention_layernorm, hidden_norm), norm, lm_head, embed_tokens, d2t, t2d",
            fix="; ".join(hints) or "this draft's architecture differs from sglang's; it cannot be converted faithfully",
        )
    names = {i.out for i in items}
    required = {"fc.weight", "norm.weight"} | {f"midlayer.{p}" for p in _MIDLAYER_PARAMS}
    if not config.get("tie_word_embeddings"):
        required.add("lm_head.weight")
    missing = sorted(required - names)
    if missing:
        raise _err("the source lacks tensors every EAGLE-3 draft needs", where=str(src), found=", ".join(missing), fix="re-export the draft")
    return items, renamed, dropped


def _shards(items: list[_Item], max_shard_size: int) -> list[list[_Item]]:
    ordered = {e[0]: None for e in alignment_order((i.out, i.src.dtype, i.src.shape) for i in items)}
    by_name = {i.out: i for i in items}
    shards: list[list[_Item]] = [[]]
    size = 0
    for name in ordered:
        it = by_name[name]
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
    items: list[_Item]
    renamed: dict[str, str]
    dropped: list[str]
    src_files: list[str]


def plan_conversion(src: os.PathLike | str, *, aux_layer_ids: list[int] | None = None, drop_embed_tokens: bool = False,
                    target: os.PathLike | str | None = None, release: str | None = None) -> Plan:
    """Read the speculators draft at ``src`` (its ``config.json`` and safetensors headers, through the safe
    open) and plan its SGLang form; raises :class:`ConvertError` for anything the converter refuses.

    ``release``: see :func:`build_config` (None: this library's convention, as ``convert`` writes it).
    """
    src_dir = checkpoint_dir(src, "source draft")
    config = read_config(src_dir, "source draft")
    fmt = detect_format(config)
    if fmt != SPECULATORS:
        if fmt == SGLANG_EAGLE3:
            raise _err("the source is already in SGLang format; nothing to convert", where=str(src_dir / "config.json"), fix=f"check it with `eagle3-patches doctor --draft {src_dir}`")
        raise _err(
            "the source is not a speculators EAGLE-3 draft",
            where=str(src_dir / "config.json"),
            found=f"architectures {config.get('architectures')}",
            expected='"speculators_model_type": "eagle3" and a transformer_layer_config',
        )
    tensors, src_files = _source_tensors(src_dir)
    n_target = None
    if target is not None:
        from .formats import target_view

        n_target = target_view(read_config(target, "target")).num_layers
    out_config = build_config(config, {n: t for n, (t, _, _) in tensors.items()}, aux_layer_ids=aux_layer_ids,
                              num_target_layers=n_target, release=release, config_path=str(src_dir / "config.json"))
    items, renamed, dropped = _plan(src_dir, config, tensors, drop_embed_tokens)
    return Plan(src_dir, config, out_config, items, renamed, dropped, src_files)


def served_sglang_config(path: os.PathLike | str, release: str) -> dict | None:
    """The SGLang-format config sglang ``release`` is handed for the speculators draft in the local directory
    ``path`` (``speculators_draft_config``): the converter's config with the aux ids in that release's own
    convention.  None when ``path`` is not a local directory whose ``config.json`` (read through the safe
    open) is in speculators format; :class:`ConvertError` for a speculators draft the converter refuses."""
    try:
        if not os.path.isdir(path):
            return None
        config = read_config(path, "draft")
    except (CheckpointError, OSError, TypeError, ValueError):
        return None  # not a checkpoint eagle3-patches reads: sglang's own reader decides
    if detect_format(config) != SPECULATORS:
        return None
    return plan_conversion(path, release=release).sglang_config


# ====================================================================== copying
class _Progress:
    def __init__(self, total: int, progress: Any):
        self.total, self.done, self.bar, self.cb = total, 0, None, None
        if callable(progress) and not isinstance(progress, bool):
            self.cb = progress
        elif progress is True or (progress is None and total >= (256 << 20) and sys.stderr.isatty()):
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="convert", file=sys.stderr)
            except ImportError:  # pragma: no cover - tqdm is in the test env, optional otherwise
                self.bar = None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.cb is not None:
            self.cb(self.done, self.total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _copy_range(src_fd: int, offset: int, length: int, dst_fd: int, progress: _Progress) -> None:
    """Copy ``length`` bytes at ``offset`` of ``src_fd`` to the current position of ``dst_fd``."""
    use_cfr = hasattr(os, "copy_file_range")
    remaining = length
    while remaining:
        n = min(remaining, COPY_CHUNK)
        done = 0
        if use_cfr:
            try:
                done = os.copy_file_range(src_fd, dst_fd, n, offset)
            except OSError:
                use_cfr, done = False, 0
        if not use_cfr:
            buf = os.pread(src_fd, n, offset)
            if not buf:
                raise _err("the source file ended early while copying", found=f"offset {offset}")
            view = memoryview(buf)
            while view:
                w = os.write(dst_fd, view)
                view = view[w:]
            done = len(buf)
        if done <= 0:
            raise _err("the source file ended early while copying", found=f"offset {offset}")
        offset += done
        remaining -= done
        progress.update(done)


def _narrowed(mode: int) -> int:
    """DST permission bits for a file whose source has ``mode``: never wider than it, at most :data:`MAX_MODE`."""
    return mode & MAX_MODE


def _write_shard(src: Path, path: Path, items: list[_Item], progress: _Progress) -> dict[str, tuple[int, int]]:
    header, offsets = encode_header(((i.out, i.src.dtype, i.src.shape) for i in items), {"format": "pt"})
    mode = MAX_MODE
    for it in items:
        mode &= it.src_mode
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _narrowed(mode))
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        files: dict[str, Any] = {}
        os.write(fd, header)
        for it in items:
            f = files.get(it.src.file)
            if f is None:
                f = files[it.src.file] = stack.enter_context(open_checkpoint_file(src, it.src.file, what="source shard"))
            _copy_range(f.fd, it.src_data_start + it.src.start, it.src.nbytes, fd, progress)
        os.fsync(fd)
    return offsets


def _side_files(src: Path) -> list[str]:
    """The allow-listed side files of ``src``, each checked by the safe-open rules before anything is written.

    Refuses the conversion naming every side file that links out of SRC, is not a regular
    file or is implausibly large.
    """
    names = [n for n in list_checkpoint_dir(src, "source draft") if COPY_FILES.match(n)]
    refused: list[Eagle3ConfigError] = []
    for name in names:
        try:
            _, _, st = resolve_checkpoint_file(src, name, what="side file")
            if st.st_size > MAX_SIDE_FILE_BYTES:
                raise _err(f"side file {name} is implausibly large", where=str(src / name), found=f"{st.st_size} bytes (at most {MAX_SIDE_FILE_BYTES})")
        except Eagle3ConfigError as exc:
            refused.append(exc)
    if refused:
        raise _err(
            f"the source's side file(s) {', '.join(Path(e.where).name for e in refused)} are refused: the converter copies "
            "nothing through a link out of SRC, nothing that is not a regular file, nothing implausibly large",
            where=str(src),
            found="; ".join(f"{e.where}: {e.found or e.what}" for e in refused),
            expected="regular files inside the source directory",
            fix="replace each link with the file it stands for (or remove it), then convert again",
        )
    return names


def _copy_side_files(src: Path, tmp: Path, names: list[str]) -> None:
    """Copy the checked side files through the safe open, each with no wider permissions than its source."""
    for name in names:
        with open_checkpoint_file(src, name, what="side file") as f:
            out = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _narrowed(f.stat.st_mode))
            try:
                _copy_range(f.fd, 0, min(f.size, MAX_SIDE_FILE_BYTES), out, _Progress(0, False))
            finally:
                os.close(out)


def _verify(path: Path, items: list[_Item], offsets: dict[str, tuple[int, int]]) -> None:
    """Re-read the written shard (the safetensors library validates it) and compare it with the plan."""
    try:
        h = read_header(path)
        tensors = h.tensors
    except CheckpointError as exc:
        raise _err("the written shard does not read back", where=str(path), found=exc.what) from None
    # ``tensors`` holds exactly the names the library read (``read_header`` refuses duplicates), so
    # comparing it with the plan also compares the names
    want = {i.out: (i.src.dtype, i.src.shape, offsets[i.out]) for i in items}
    got = {n: (t.dtype, t.shape, (t.start, t.end)) for n, t in tensors.items()}
    if want != got:
        bad = sorted(n for n in want.keys() | got.keys() if want.get(n) != got.get(n))
        raise _err(
            "the written shard's header does not match the plan",
            where=str(path),
            found=f"{len(bad)} tensor(s) differ; " + "; ".join(f"{n}: planned {want.get(n)}, written {got.get(n)}" for n in bad[:3]),
            expected="(dtype, shape, data offsets) as planned for every tensor",
        )
    if h.metadata.get("format") != "pt":  # what a PyTorch safetensors file declares (transformers reads it)
        raise _err("the written shard's metadata does not say format pt", where=str(path), found=str(h.metadata), expected="{'format': 'pt'}")


# ====================================================================== entry point
def convert(
    src: os.PathLike | str,
    dst: os.PathLike | str,
    *,
    force: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    aux_layer_ids: list[int] | None = None,
    drop_embed_tokens: bool = False,
    target: os.PathLike | str | None = None,
    sglang_version: str | None = None,
    progress: bool | Callable[[int, int], None] | None = None,
    run_doctor: bool = True,
) -> ConvertResult:
    """Convert the speculators draft at ``src`` into an SGLang-format draft at ``dst``.

    ``aux_layer_ids``: override the source's ids (speculators' meaning).  ``drop_embed_tokens``:
    leave out ``embed_tokens.weight`` (sglang uses the target's embedding anyway).
    ``target``: also run the doctor's target cross-checks (layer range, hidden, vocab) on the
    result.  ``progress``: True for a progress bar, a ``callable(done, total)``, or None (a
    bar for large checkpoints on a terminal).  Raises :class:`ConvertError` /
    :class:`Eagle3ConfigError` with what / where / fix; on any failure DST is left untouched.
    """
    with _signals_interrupt():
        return _convert(src, dst, force, max_shard_size, aux_layer_ids, drop_embed_tokens, target, sglang_version, progress, run_doctor)


def _convert(src, dst, force, max_shard_size, aux_layer_ids, drop_embed_tokens, target, sglang_version, progress, run_doctor) -> ConvertResult:
    t0 = time.perf_counter()
    src_dir = checkpoint_dir(src, "source draft")
    shown = Path(dst)
    dst = _check_paths(src_dir, shown, force)
    # a killed --force run's DST is put back before anything is planned or copied: without --force it is then
    # refused at once, not after the whole copy
    cleaned = _remove_stale(dst)
    if not force and os.path.lexists(dst):
        raise _err(
            "the destination already exists: a killed `--force` run had moved it aside, and it was put back",
            where=str(shown),
            found="; ".join(cleaned),
            fix="choose a new DST, or pass --force to replace it",
        )
    plan = plan_conversion(src_dir, aux_layer_ids=aux_layer_ids, drop_embed_tokens=drop_embed_tokens, target=target)
    out_config, items, renamed, dropped, src_files = plan.sglang_config, plan.items, plan.renamed, plan.dropped, plan.src_files
    limit = parse_size(max_shard_size)
    shards = _shards(items, limit)
    total = sum(i.src.nbytes for i in items)
    side = _side_files(src_dir)
    config_mode = _narrowed(resolve_checkpoint_file(src_dir, "config.json", what="config")[2].st_mode)
    dir_mode = 0o755 & os.stat(src_dir).st_mode

    created = _make_parents(dst.parent)
    tmp = _temp_name(dst, "convert")
    try:
        with contextlib.closing(_Progress(total, progress)) as bar:  # the bar ends with the copying (or its failure)
            try:
                os.mkdir(tmp, dir_mode)
            except OSError as exc:
                raise _dst_error(exc, dst, "create the destination") from None
            _write_json(tmp / "config.json", out_config, config_mode, sort_keys=True)
            n = len(shards)
            names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
            weight_map: dict[str, str] = {}
            written: list[Path] = []
            for name, shard in zip(names, shards):
                path = tmp / name
                offsets = _write_shard(src_dir, path, shard, bar)
                _verify(path, shard, offsets)
                weight_map.update({i.out: name for i in shard})
                written.append(path)
            if n > 1:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                _write_json(tmp / "model.safetensors.index.json", index, config_mode)
            _copy_side_files(src_dir, tmp, side)
        report = None
        if run_doctor:
            from .doctor import check_draft

            report = check_draft(tmp, target=target, sglang_version=sglang_version)
            # the doctor checked the temporary directory: its report names DST (in every text field)
            report.findings[:] = [fnd.replace(**{k: v.replace(str(tmp), str(dst)) for k, v in vars(fnd).items() if isinstance(v, str)})
                                  for fnd in report.findings]
            for key, value in list(report.facts.items()):
                if isinstance(value, str):
                    report.facts[key] = value.replace(str(tmp), str(dst))
            if report.errors:
                first = report.errors[0]
                raise _err(
                    f"the converted draft fails the doctor's checks: {first.what}",
                    where=first.where,
                    found=first.found,
                    expected=first.expected,
                    fix=first.fix or "see `eagle3-patches doctor --draft` on the source",
                )
        _fsync_dir(tmp)
        _replace(tmp, dst, force)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_dirs(created)
        if isinstance(exc, OSError):
            raise _dst_error(exc, dst, "write the converted draft") from None
        raise
    return ConvertResult(
        src=src_dir,
        dst=shown,
        files=[shown / p.name for p in written],
        tensors=len(items),
        bytes_copied=total,
        seconds=time.perf_counter() - t0,
        config=out_config,
        renamed=renamed,
        dropped=dropped,
        report=report,
        cleaned=cleaned,
        notes=[f"read {len(src_files)} source shard(s)", f"aux ids {out_config['eagle_config']['eagle_aux_hidden_state_layer_ids']} (output-of-layer) from speculators' {out_config['eagle3_patches_converted_from']['eagle_aux_hidden_state_layer_ids']}"],
    )


def _write_json(path: Path, obj: Any, mode: int, *, sort_keys: bool = False) -> None:
    data = (json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _replace(tmp: Path, dst: Path, force: bool) -> None:
    """Rename ``tmp`` to ``dst``; with ``force`` an existing ``dst`` is moved aside first and removed after."""
    old = None
    if os.path.lexists(dst):
        if not force:  # appeared while we were writing
            raise _err("the destination appeared while converting", where=str(dst), fix="pass --force to replace it")
        old = _temp_name(dst, "old")
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    _fsync_dir(dst.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
