"""hidden_state_dump

What it does: not a bug fix: the way to produce EAGLE-3 training data so that training and serving capture the
same layers.  Off by default: with ``EAGLE3_PATCHES_ENABLE=hidden_state_dump`` and ``EAGLE3_PATCHES_DUMP_DIR=DIR``,
every target forward of a served request writes, from sglang's own capture path (``DeepseekV2Model.forward``
appending ``hidden_states + residual`` before each captured layer, the list the draft's ``fc`` receives
concatenated), the aux hidden states and the token ids to safetensors shards in DIR.  Each shard's metadata records
the capture convention: the configured ids, sglang's internal ``layers_to_capture``, which layer outputs those are,
and the sglang version: training data captured exactly as serving captures it.  Used by
``tools/train_tiny_draft.py`` and ``eagle3-patches measure-accept`` (a known-good server's dump is the target
states a draft's expected accept length is measured on); see docs/e2e.md.

Which layers: the ids sglang already configured (``--speculative-algorithm EAGLE3``: the draft's
``eagle_aux_hidden_state_layer_ids``), else ``EAGLE3_PATCHES_DUMP_LAYER_IDS`` (comma list, in the installed
sglang's convention), else the ids of the draft named by ``--speculative-draft-model-path``.  Without speculation
the patch switches the capture on itself through the model's real ``set_eagle3_layers_to_capture`` (validated by
``aux_capture_validation``).

What is dumped: prefill (extend) and plain decode forwards of served requests.  Speculative verify forwards are
skipped (they hold rejected draft tokens), so for training data serve the target without speculation.  Rows are
tokens; ``seq_ids`` groups the rows of one request (a new sequence starts at an extend with no cached prefix),
``positions`` orders them.  With the radix cache on, a request whose prefix was cached starts at its first uncached
position: serve with ``--disable-radix-cache`` to dump whole sequences.  Only tensor-parallel rank 0 (last pipeline
stage) writes.  sglang's own server warm-up request (``--skip-server-warmup`` turns it off) and health checks are
served requests and are recorded like any other.

Never recorded, and nothing copied to the host: forwards run while sglang captures CUDA graphs (its capture-mode
flag, or torch's stream-capturing check; the capture's warm-up runs included) and sglang's dummy runs
(``ModelRunner._dummy_run``, the MoE autotune warm-up): their rows belong to no request, and a device-to-host copy
inside a graph capture fails on rank 0 ("operation not permitted when stream is capturing") and hangs the other
ranks.  CUDA-graph replays never reach Python, so on a GPU with CUDA graphs on (sglang's default) decode steps are
not recorded; the first skipped capture logs a warning saying so.  To dump decode rows, serve with
``--disable-cuda-graph`` (prefill rows are dumped either way).

Shard tensors: ``input_ids`` int64 [N], ``positions`` int64 [N], ``seq_ids`` int64 [N], ``hidden_states``
[N, k x H] (the model dtype), ``decoded`` int8 [N] (1 for a decode forward's row: its token is one the model
generated; 0 for a prefill row; what ``eagle3-patches measure-accept`` measures acceptance on), and with
``EAGLE3_PATCHES_DUMP_FINAL_STATES=1`` ``final_hidden_states`` [N, H] (the model dtype): the target's final normed
hidden state of each row, ``DeepseekV2Model.forward``'s own output, what the ``lm_head`` turns into the next token's
logits (``measure-accept --temperature`` needs it; readers take shards without it as before).  Shards are
written atomically (temp file renamed) when ``EAGLE3_PATCHES_DUMP_SHARD_TOKENS`` rows are buffered (default 4096),
after one idle second, and at exit.

Cost: each recorded forward copies its ``[tokens, k x H]`` aux states (and the token ids and positions) to the host
synchronously, one device synchronisation per forward.  At Kimi-K2.5's width that is 21504 x 2 bytes = 42 KiB a
token in bf16 (the final states add 7168 x 2 = 14 KiB): about 170 MiB for a 4096-token prefill, a few milliseconds
over an H200's PCIe Gen5 host link, and for decode (``--disable-cuda-graph``) the synchronisation, tens of
microseconds a step, dominates.  These are estimates from the sizes, not measurements (no GPU has run this library).
Serve dumping runs apart from latency-sensitive traffic.

Releases: 0.5.8 - 0.5.12: the capture path it reads is that one (the ``val + 1`` convention).

Upstream probe: none (an instrument, nothing to fix upstream).

Tests: ``tests/probe/test_hidden_state_dump.py``: sglang's real ``CudaGraphRunner`` (init,
``capture_one_batch_size`` with its warm-up runs) for the tiny DeepSeek-V3 target, with the graph capture itself
run eagerly under a mode in which any device-to-host copy made by this library raises, as a real capture would:
nothing recorded and nothing copied during capture or ``_dummy_run``, the warning logged, then an eager prefill of
two prompts and a decode step give exactly their 9 rows at 3 x H.  The same test with the previous version of the
patch failed with sglang's "Capture cuda graph failed: operation not permitted when stream is capturing".
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from packaging.specifiers import SpecifierSet

from .. import settings
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr, expect_source
from ..sglang_runtime import server_arg
from ..sglang_version import installed_sglang_version

logger = logging.getLogger("eagle3_patches")

FORMAT = "eagle3-patches/hidden-state-dump/1"
CONVENTION = (
    "sglang<=0.5.12: configured id i is captured before layer i+1 runs, as hidden_states + residual, "
    "i.e. the output of decoder layer i (0-based); HF/speculators id = i + 1"
)


def _dump_layer_ids():
    raw = settings.current().dump_layer_ids
    if raw:
        try:
            return [int(x) for x in raw.replace(";", ",").split(",") if x.strip()]
        except ValueError:
            raise Eagle3ConfigError(
                "hidden_state_dump: bad layer ids",
                where=settings.DUMP_LAYER_IDS,
                found=repr(raw),
                expected="a comma list of integers, e.g. 1,2,3",
                fix=f"fix {settings.DUMP_LAYER_IDS}",
            ) from None
    try:
        draft = server_arg("speculative_draft_model_path")
    except Exception:  # noqa: BLE001 - no server args in this process
        draft = None
    if draft and (Path(draft) / "config.json").is_file():
        cfg = json.loads((Path(draft) / "config.json").read_text())
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids:
            return list(ids)
    raise Eagle3ConfigError(
        "hidden_state_dump is on but no aux layer ids are known",
        where=f"{settings.DUMP_DIR} set, target served without EAGLE3",
        found=f"{settings.DUMP_LAYER_IDS} unset and no EAGLE-3 draft config",
        expected="the ids the draft will be served with",
        fix=f"set {settings.DUMP_LAYER_IDS}=1,2,3 (the draft config's eagle_aux_hidden_state_layer_ids)",
    )


class _Dumper:
    """Buffers rows in the process that runs the target and writes shards."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.lock = threading.RLock()
        self.rows: list = []  # (input_ids, positions, seq_ids, hidden) tensors per forward
        self.n_rows = 0
        self.shard = 0
        self.next_seq = 0
        self.seq_of_slot: dict[int, int] = {}
        self.meta: dict[str, str] = {}
        self.timer: threading.Timer | None = None
        self.shard_tokens = settings.current().dump_shard_tokens
        self.final_states = settings.current().dump_final_states
        atexit.register(self.flush)

    def record(self, model, forward_batch, aux, final=None) -> None:
        """``aux``: the captured states of one forward; ``final``: its final normed states (the model's output),
        recorded where ``EAGLE3_PATCHES_DUMP_FINAL_STATES`` is on."""
        import torch

        mode = forward_batch.forward_mode
        if mode.is_target_verify() or mode.is_idle() or not (mode.is_extend() or mode.is_decode()):
            return
        hidden = torch.cat(aux, dim=-1).detach().to("cpu")
        last = final.detach().to("cpu") if self.final_states and final is not None else None
        ids = forward_batch.input_ids.detach().to("cpu", torch.int64)
        pos = forward_batch.positions.detach().to("cpu", torch.int64)
        slots = forward_batch.req_pool_indices.detach().to("cpu").tolist()
        if mode.is_extend():
            lens = list(forward_batch.extend_seq_lens_cpu)
            prefix = list(forward_batch.extend_prefix_lens_cpu or [0] * len(lens))
        else:
            lens, prefix = [1] * len(slots), [None] * len(slots)
        seq = []
        with self.lock:
            for slot, n, p in zip(slots, lens, prefix):
                if (p == 0) or slot not in self.seq_of_slot:
                    self.seq_of_slot[slot] = (os.getpid() << 20) + self.next_seq
                    self.next_seq += 1
                seq.extend([self.seq_of_slot[slot]] * n)
            if (
                len(seq) != ids.shape[0]
                or hidden.shape[0] != ids.shape[0]
                or (self.final_states and (last is None or last.dim() != 2 or last.shape[0] != ids.shape[0]))
            ):
                logger.warning(
                    "hidden_state_dump: %d tokens, %d rows, %d states, final states %s; forward skipped",
                    ids.shape[0],
                    len(seq),
                    hidden.shape[0],
                    "off" if not self.final_states else (list(last.shape) if last is not None else "none"),
                )
                return
            if not self.meta:
                self.meta = self._metadata(model, hidden)
            decoded = torch.full((ids.shape[0],), 0 if mode.is_extend() else 1, dtype=torch.int8)
            self.rows.append((ids, pos, torch.tensor(seq, dtype=torch.int64), hidden, decoded, last))
            self.n_rows += ids.shape[0]
            if self.n_rows >= self.shard_tokens:
                self.flush()
            else:
                self._arm_timer()

    def _metadata(self, model, hidden) -> dict[str, str]:
        lm = model
        ids = getattr(lm, "_eagle3_dump_layer_ids", None)
        capture = list(lm.model.layers_to_capture)
        return {
            "format": FORMAT,
            "sglang_version": str(installed_sglang_version()),
            "layer_ids": json.dumps(ids if ids is not None else [c - 1 for c in capture]),
            "layers_to_capture": json.dumps(capture),
            "captured_layer_outputs": json.dumps([c - 1 for c in capture]),
            "convention": CONVENTION,
            "architecture": type(lm).__name__,
            "hidden_size": str(lm.config.hidden_size),
            "num_hidden_layers": str(lm.config.num_hidden_layers),
            "aux_width": str(hidden.shape[-1]),
            "dtype": str(hidden.dtype).replace("torch.", ""),
            **(
                {"final_hidden_states": "the final normed hidden state of each row, the input of lm_head"}
                if self.final_states
                else {}
            ),
        }

    def _arm_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = threading.Timer(1.0, self.flush)
        self.timer.daemon = True
        self.timer.start()

    def flush(self) -> None:
        import torch
        from safetensors.torch import save_file

        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if not self.rows:
                return
            rows, self.rows, self.n_rows = self.rows, [], 0
            tensors = {
                "input_ids": torch.cat([r[0] for r in rows]),
                "positions": torch.cat([r[1] for r in rows]),
                "seq_ids": torch.cat([r[2] for r in rows]),
                "hidden_states": torch.cat([r[3] for r in rows]).contiguous(),
                "decoded": torch.cat([r[4] for r in rows]),
            }
            if self.final_states:
                tensors["final_hidden_states"] = torch.cat([r[5] for r in rows]).contiguous()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            name = f"shard-{os.getpid()}-{self.shard:05d}.safetensors"
            self.shard += 1
            tmp = self.out_dir / f".{name}.tmp"
            save_file(tensors, str(tmp), metadata=dict(self.meta, written=str(time.time())))
            os.replace(tmp, self.out_dir / name)
            logger.info(
                "eagle3-patches: hidden_state_dump wrote %s (%d tokens, width %d)",
                name,
                tensors["input_ids"].shape[0],
                tensors["hidden_states"].shape[-1],
            )


_DUMPER: _Dumper | None = None


def _dumper() -> _Dumper | None:
    global _DUMPER
    out = settings.current().dump_dir
    if not out:
        return None
    if _DUMPER is None:
        _DUMPER = _Dumper(Path(out))
    return _DUMPER


def _is_writer(model) -> bool:
    try:
        from sglang.srt.distributed import get_tensor_model_parallel_rank

        rank = get_tensor_model_parallel_rank()
    except Exception:  # noqa: BLE001 - no parallel state: a single process
        rank = 0
    pp = getattr(model, "pp_group", None)
    return rank == 0 and (pp is None or pp.is_last_rank)


def _causal_lm_forward(wrapped, instance, args, kwargs):
    if _dumper() is not None and not instance.capture_aux_hidden_states:
        ids = _dump_layer_ids()
        instance.set_eagle3_layers_to_capture(ids)  # the real capture switch (and its validation)
        instance._eagle3_dump_layer_ids = list(ids)
        logger.info(
            "eagle3-patches: hidden_state_dump switched the aux capture on: ids %s -> layers_to_capture %s",
            ids,
            instance.model.layers_to_capture,
        )
    dumper = _dumper()
    if dumper is not None:
        instance.model._eagle3_dump_owner = instance
    return wrapped(*args, **kwargs)


_LOCAL = threading.local()  # .dummy_run: inside ModelRunner._dummy_run
_WARNED_GRAPHS: list[bool] = []


def _graph_capturing() -> bool:
    """sglang is capturing CUDA graphs (its own flag, set around the whole capture, warm-up runs
    included), or the current CUDA stream is capturing."""
    graphs = sys.modules.get("sglang.srt.model_executor.cuda_graph_runner")
    if graphs is not None and getattr(graphs, "get_is_capture_mode", lambda: False)():
        return True
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _not_a_served_forward() -> bool:
    if getattr(_LOCAL, "dummy_run", False):
        return True
    if not _graph_capturing():
        return False
    if not _WARNED_GRAPHS:
        _WARNED_GRAPHS.append(True)
        logger.warning(
            "eagle3-patches: hidden_state_dump: sglang is capturing CUDA graphs; decode steps replayed from them never "
            "reach Python and will not be dumped (prefill rows are). Serve with --disable-cuda-graph to dump decode "
            "rows too."
        )
    return True


def _mark_dummy_run(wrapped, instance, args, kwargs):
    """``ModelRunner._dummy_run`` (warm-up / MoE autotune forwards on made-up batches): nothing is recorded."""
    _LOCAL.dummy_run = True
    try:
        return wrapped(*args, **kwargs)
    finally:
        _LOCAL.dummy_run = False


def _model_forward(wrapped, instance, args, kwargs):
    out = wrapped(*args, **kwargs)
    dumper = _dumper()
    owner = getattr(instance, "_eagle3_dump_owner", None)
    if dumper is not None and owner is not None and isinstance(out, tuple) and len(out) == 2 and out[1]:
        if _not_a_served_forward():
            return out
        forward_batch = args[2] if len(args) > 2 else kwargs["forward_batch"]
        if _is_writer(owner):
            dumper.record(owner, forward_batch, out[1], out[0])
    return out


class HiddenStateDump(Patch):
    name = "hidden_state_dump"
    summary = f"opt-in: served requests' aux hidden states + token ids to safetensors shards in ${settings.DUMP_DIR}"
    module = "sglang.srt.models.deepseek_v2"
    applies_to = SpecifierSet(">=0.5.8,<0.5.13")
    default_enabled = False

    def enabled_by(self, s: settings.Settings) -> bool:
        return s.dump_dir is not None or self.name in s.enable

    def check(self, module: ModuleType) -> None:
        expect_source(
            expect_attr(module.DeepseekV2ForCausalLM, "set_eagle3_layers_to_capture"), "val + 1 for val in layer_ids"
        )
        expect_source(
            expect_attr(module.DeepseekV2Model, "forward"), "aux_hidden_states.append(hidden_states + residual)"
        )
        expect_source(expect_attr(module.DeepseekV2ForCausalLM, "forward"), "capture_aux_hidden_states")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        import importlib

        runner = importlib.import_module("sglang.srt.model_executor.model_runner")  # loads the model: imported already
        saver.wrap(module.DeepseekV2ForCausalLM, "forward", _causal_lm_forward)
        saver.wrap(module.DeepseekV2Model, "forward", _model_forward)
        if "_dummy_run" in vars(runner.ModelRunner):
            saver.wrap(runner.ModelRunner, "_dummy_run", _mark_dummy_run)


PATCH = HiddenStateDump()
