"""eagle3_probe

What it does: not a fix: the diagnostic probe, off by default (``EAGLE3_PATCHES_PROBE=1|DIR|FILE.jsonl``, or
``eagle3-patches run --probe [PATH]``).  Once per process, hop and forward mode (extend, decode, target verify,
draft extend) it records what flows through the EAGLE-3 path: at the target's output the algorithm, the configured
aux ids, the effective ``layers_to_capture``, the number of captured states and the stored width; at the draft's
input the width, dtype, mean / std / absmax / NaN / Inf of the hidden states and whether ``fc`` ran on them; the TP
rank and pid.  Once per process too, for the draft's prefill of a batch with images (``draft_image_rows``): whether
the embedding row the draft's first layer gets at each sequence's last position is the embedding of the token there.
One log line per record on the ``eagle3_patches`` logger (sglang's format; a warning when the record shows a
problem) and, with a path, one JSON line; ``eagle3-patches probe-report`` reads them and names the first
wrong hop and its likely cause.  See docs/troubleshooting.md.

It wraps ``ModelRunner.forward`` only, which sees both models (``is_draft_worker`` tells them apart), the configured
ids, the rank, and the output of graph-replayed steps; it is never called inside CUDA graph capture (where a host
synchronisation would be illegal), and no other patch wraps it.

Cost: statistics cost one host synchronisation per record, so at most one per (process, hop, mode); once a (hop,
mode) is recorded the wrapper only does a set lookup.  Not applied (the default), it costs nothing:
``ModelRunner.forward`` is sglang's own function.

Releases: any (0.5.8 and later).

Upstream probe: none (a diagnostic, nothing to fix upstream).

Tests: ``tests/probe/test_probe.py``: the real ``TpModelWorker`` + ``EAGLEWorker`` on the tiny Kimi-K2.5 (hidden
64, aux ids ``[1, 2, 3]``), one isolated process per run: with the patches the probe sees 3 x 64 at the target's
output and at the draft's input with ``fc`` applied, once per mode, and ``probe-report`` passes the setup; with
``--speculative-algorithm EAGLE`` and both guards off it sees 64 at both, ``fc`` skipped, and the report names the
target output as the first wrong hop with the flag as the cause; with the probe off no probe code runs.  Without
sglang: the probe's output settings and ``run --probe`` (which reaches the command without importing sglang),
``probe-report`` naming lost captures and ranks that disagree, and its usage errors (exit 2, no traceback).  The
watchdog's tests apply and revert it on the real scheduler.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from types import ModuleType
from typing import Any

from packaging.specifiers import SpecifierSet

from .. import patches, settings
from ..registry import Patch, Saver, expect_attr, expect_source
from ..sglang_runtime import linear_widths, server_arg
from ..sglang_version import installed_sglang_version
from . import get_registry
from .probe_diagnosis import DRAFT, IMAGE_ROWS, SCHEMA, TARGET, judge, summarize

logger = logging.getLogger("eagle3_patches")

PROBE_NAME = "eagle3_probe"

#: how often the wrapper ran, and how many records (each with one statistics sync) it made;
#: tests read these to prove the probe does nothing when it is off and once per mode when on
COUNTERS = {"calls": 0, "records": 0, "stats": 0}
#: the records made in this process since the probe was last armed (the accept-length watchdog reads
#: them; at most one per hop and mode)
RECORDS: list[dict] = []

_lock = threading.Lock()
_done: set[tuple[str, str]] = set()
_output: list[str | None] = [None]  # the EAGLE3_PATCHES_PROBE path read when the patch landed
_draft_configs: dict[str, dict] = {}


def _reset_in_child() -> None:  # a forked child records for itself
    _done.clear()
    RECORDS.clear()
    for k in COUNTERS:
        COUNTERS[k] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def reset() -> None:
    """Forget what was recorded in this process (tests)."""
    with _lock:
        _reset_in_child()


def rearm() -> None:
    """Record every hop and mode once more, from the next forward on (the accept-length watchdog)."""
    with _lock:
        _done.clear()
        RECORDS.clear()


# ---------------------------------------------------------------------- the wrapper
def _probed_forward(wrapped, instance, args, kwargs):
    COUNTERS["calls"] += 1
    forward_batch = args[0] if args else kwargs.get("forward_batch")
    mode = _mode(forward_batch)
    hop = DRAFT if getattr(instance, "is_draft_worker", False) else TARGET
    if hop == DRAFT and mode == "extend" and (IMAGE_ROWS, mode) not in _done and _has_images(forward_batch):
        wrapped = _watching_image_rows(wrapped, instance, forward_batch)
    if mode is None or mode == "idle" or (hop, mode) in _done or _capturing():
        return wrapped(*args, **kwargs)
    if hop == DRAFT:
        return _record_draft(wrapped, instance, forward_batch, args, kwargs, mode)
    out = wrapped(*args, **kwargs)
    _guarded(_record_target, instance, forward_batch, out, mode)
    return out


def _mode(forward_batch: Any) -> str | None:
    mode = getattr(forward_batch, "forward_mode", None)
    name = getattr(mode, "name", None)
    return name.lower() if name else None


def _capturing() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 - no CUDA: never capturing
        return False


def _guarded(fn, *args: Any) -> None:
    """The probe never breaks a forward: a failure to record is logged once for that mode."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        mode = args[-1]
        with _lock:
            _done.add(("failed", str(mode)))
        logger.warning("eagle3-patches probe: could not record (%s): %s: %s", mode, type(exc).__name__, exc)


def _claim(hop: str, mode: str) -> bool:
    with _lock:
        if (hop, mode) in _done:
            return False
        _done.add((hop, mode))
        return True


# ---------------------------------------------------------------------- target output
def _record_target(runner, forward_batch, out, mode: str) -> None:
    logits_output = getattr(out, "logits_output", None)
    stored = getattr(logits_output, "hidden_states", None)
    if stored is not None and stored.shape[0] == 0:
        return  # an empty batch tells nothing; record the next one
    if not _claim(TARGET, mode):
        return
    model = runner.model
    causal = _find(model, "capture_aux_hidden_states") or model
    inner = _find(getattr(causal, "model", None), "layers_to_capture")
    hidden = _hidden_size(runner)
    capture = bool(getattr(causal, "capture_aux_hidden_states", False))
    layers = list(getattr(inner, "layers_to_capture", None) or []) if inner is not None else []

    draft_cfg = _draft_config(server_arg("speculative_draft_model_path", server_args=runner.server_args))
    draft_ids = draft_cfg.get("aux_ids")
    use_aux = getattr(runner, "eagle_use_aux_hidden_state", None)
    if use_aux:
        configured = getattr(runner, "eagle_aux_hidden_state_layer_ids", None)
        source = (
            "draft config.json eagle_config (read by sglang)" if configured is not None else "none: sglang defaults"
        )
    else:
        configured, source = None, "not read by sglang (no EAGLE-3 capture for this algorithm)"
    width = int(stored.shape[-1]) if stored is not None else None
    captured = None
    if width is not None:
        if not capture:
            captured = 0
        elif hidden and width % hidden == 0:
            captured = width // hidden
    expected, expected_from = None, None
    if hidden and draft_cfg.get("eagle3"):
        if capture and layers:
            expected, expected_from = len(layers) * hidden, f"len(layers_to_capture) {len(layers)} x hidden {hidden}"
        else:
            k = len(draft_ids) if draft_ids else 3
            expected, expected_from = k * hidden, f"{k} aux states x hidden {hidden} (EAGLE-3 draft)"
    rec = _base(runner, TARGET, mode)
    rec.update(
        model=type(model).__name__,
        hidden_size=hidden,
        aux_ids_configured=_plain(configured),
        aux_ids_source=source,
        draft_aux_ids=_plain(draft_ids),
        draft_eagle3=draft_cfg.get("eagle3"),
        use_aux_hidden_state=use_aux,
        capture_aux_hidden_states=capture,
        layers_to_capture=_plain(layers),
        captured_states=captured,
        width=width,
        expected_width=expected,
        expected_from=expected_from,
        tokens=int(stored.shape[0]) if stored is not None else None,
        dtype=_dtype(stored),
        stats=_stats(stored),
        can_run_graph=bool(getattr(out, "can_run_graph", False)),
    )
    _emit(rec)


# ---------------------------------------------------------------------- draft input
def _record_draft(wrapped, runner, forward_batch, args, kwargs, mode: str):
    spec = getattr(forward_batch, "spec_info", None)
    hs = getattr(spec, "hidden_states", None)
    if hs is None or getattr(hs, "ndim", 0) < 1 or hs.shape[0] == 0 or not _claim(DRAFT, mode):
        return wrapped(*args, **kwargs)
    rec: dict | None = None
    fc_calls: list[tuple[int, ...]] = []
    handle = None
    try:
        rec = _draft_record(runner, mode, hs)
        fc = getattr(getattr(runner.model, "model", None), "fc", None)
        if fc is not None and hasattr(fc, "register_forward_hook"):
            handle = fc.register_forward_hook(lambda mod, inp, out: fc_calls.append(tuple(inp[0].shape)))
    except Exception as exc:  # noqa: BLE001
        logger.warning("eagle3-patches probe: could not record (%s): %s: %s", mode, type(exc).__name__, exc)
        rec = None
    try:
        out = wrapped(*args, **kwargs)
    except Exception as exc:
        if rec is not None:
            rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            _guarded(_finish_draft, rec, fc_calls, False, mode)
        raise
    finally:
        if handle is not None:
            handle.remove()
    if rec is not None:
        _guarded(_finish_draft, rec, fc_calls, bool(getattr(out, "can_run_graph", False)), mode)
    return out


def _draft_record(runner, mode: str, hs) -> dict:
    inner = getattr(runner.model, "model", None)
    fc_in, fc_out = linear_widths(getattr(inner, "fc", None))
    embed = getattr(getattr(inner, "embed_tokens", None), "weight", None)
    cfg = getattr(getattr(runner, "model_config", None), "hf_config", None)
    rec = _base(runner, DRAFT, mode)
    rec.update(
        model=type(runner.model).__name__,
        hidden_size=_hidden_size(runner),
        target_hidden_size=getattr(cfg, "target_hidden_size", None),
        fc_in_features=fc_in,
        fc_out_features=fc_out,
        embed_width=int(embed.shape[-1]) if embed is not None and getattr(embed, "ndim", 0) == 2 else None,
        width=int(hs.shape[-1]),
        tokens=int(hs.shape[0]),
        dtype=_dtype(hs),
        stats=_stats(hs),
    )
    return rec


def _finish_draft(rec: dict, fc_calls: list, replayed: bool, mode: str) -> None:
    if rec.get("fc_in_features") is None:
        rec["fc_applied"], rec["fc_observed"] = None, None
    elif fc_calls:
        rec["fc_applied"], rec["fc_observed"] = True, "observed"
    elif replayed or rec.get("error"):
        # a CUDA-graph replay runs no Python hooks; a forward that raised may not have reached fc:
        # say what sglang's condition (width != embedding width) decides
        embed = rec.get("embed_width")
        rec["fc_applied"] = None if embed is None or rec.get("error") else rec["width"] != embed
        rec["fc_observed"] = "not observed (forward raised)" if rec.get("error") else "inferred (CUDA graph replay)"
    else:
        rec["fc_applied"], rec["fc_observed"] = False, "observed"
    if fc_calls:
        rec["fc_input_shape"] = list(fc_calls[0])
    _emit(rec)


# ---------------------------------------------------------------------- the draft's image rows
def _has_images(forward_batch: Any) -> bool:
    try:
        return bool(forward_batch.contains_mm_inputs()) and not _capturing()
    except Exception:  # noqa: BLE001 - a batch without the method carries no images
        return False


def _first_layer(inner: Any) -> Any:
    """The draft's first decoder layer, which gets the embedding rows (``midlayer``; ``layers[0]`` in the releases
    with several)."""
    layer = getattr(inner, "midlayer", None)
    if layer is None:
        layers = getattr(inner, "layers", None)
        layer = layers[0] if layers is not None and len(layers) else None
    return layer if hasattr(layer, "register_forward_pre_hook") else None


def _watching_image_rows(wrapped, runner, forward_batch):
    """``wrapped`` with a look at the embedding rows the draft's first layer gets: the record compares each
    sequence's last row with the draft's own embedding of the token there, after the forward."""

    def call(*args: Any, **kwargs: Any) -> Any:
        inner = getattr(runner.model, "model", None)
        layer = _first_layer(inner)
        if layer is None or not _claim(IMAGE_ROWS, "extend"):
            return wrapped(*args, **kwargs)
        seen: list = []

        def grab(module, a, kw):
            embeds = a[1] if len(a) > 1 else kw.get("embeds")
            if embeds is not None and not seen:
                seen.append(embeds.detach().clone())

        handle = layer.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            out = wrapped(*args, **kwargs)
        finally:
            handle.remove()
        _guarded(_record_image_rows, runner, inner, forward_batch, seen, "extend")
        return out

    return call


def _record_image_rows(runner, inner, forward_batch, seen: list, mode: str) -> None:
    import torch

    starts, lens = forward_batch.extend_start_loc, forward_batch.extend_seq_lens
    last = (starts + lens - 1).long()
    ids = forward_batch.input_ids[last]
    rows: list[bool] | None = None
    diffs: list[float] | None = None
    if seen:
        with torch.no_grad():
            want = inner.embed_tokens(ids).float()
        got = seen[0][last].float()
        diff = (got - want).abs().amax(dim=-1)
        diffs = [float(d) for d in diff.tolist()]
        rows = [d <= 1e-6 * (1.0 + float(w.abs().max())) for d, w in zip(diffs, want)]
    mm = list(getattr(forward_batch, "mm_inputs", None) or [])
    rec = _base(runner, IMAGE_ROWS, mode)
    rec.update(
        model=type(runner.model).__name__,
        sequences=int(last.numel()),
        with_images=[m is not None for m in mm] if mm else None,
        last_tokens=[int(i) for i in ids.tolist()],
        last_rows=rows,
        last_row_max_abs_diff=diffs,
    )
    _emit(rec)


# ---------------------------------------------------------------------- shared pieces
def _base(runner, hop: str, mode: str) -> dict:
    sa = getattr(runner, "server_args", None)
    return {
        "probe": SCHEMA,
        "hop": hop,
        "mode": mode,
        "pid": os.getpid(),
        "tp_rank": getattr(runner, "tp_rank", None),
        "pp_rank": getattr(runner, "pp_rank", None),
        "time": round(time.time(), 3),
        "algorithm": getattr(sa, "speculative_algorithm", None),
        "sglang": _sglang_version(),
        "patches_applied": _applied_patches(),
    }


def _find(obj: Any, attr: str) -> Any:
    """``obj`` or the language model it wraps (Kimi-K2.5: ``language_model``) that has ``attr``."""
    for candidate in (obj, getattr(obj, "language_model", None)):
        if candidate is not None and hasattr(candidate, attr):
            return candidate
    return None


def _hidden_size(runner) -> int | None:
    mc = getattr(runner, "model_config", None)
    for obj in (mc, getattr(mc, "hf_text_config", None), getattr(mc, "hf_config", None)):
        h = getattr(obj, "hidden_size", None)
        if isinstance(h, int):
            return h
    return None


def _draft_config(path: Any) -> dict:
    """What the probe needs of the draft's config.json (read once; never raises)."""
    if not path:
        return {}
    key = str(path)
    if key not in _draft_configs:
        info: dict = {}
        try:
            with open(os.path.join(key, "config.json"), encoding="utf-8") as fh:
                cfg = json.load(fh)
            archs = cfg.get("architectures") or []
            eagle_cfg = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
            ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids", cfg.get("eagle_aux_hidden_state_layer_ids"))
            info = {
                "eagle3": any("eagle3" in str(a).lower() for a in archs)
                or bool(eagle_cfg)
                or cfg.get("speculators_model_type") == "eagle3",
                "aux_ids": ids if isinstance(ids, list) else None,
            }
        except (OSError, ValueError, AttributeError):
            info = {}
        _draft_configs[key] = info
    return _draft_configs[key]


def _dtype(t: Any) -> str | None:
    return str(t.dtype).removeprefix("torch.") if t is not None and hasattr(t, "dtype") else None


def _stats(t: Any) -> dict | None:
    """mean, std, absmax, NaN, Inf of a tensor: one host synchronisation."""
    if t is None or not hasattr(t, "detach") or t.numel() == 0:
        return None
    import torch

    COUNTERS["stats"] += 1
    with torch.no_grad():
        x = t.detach().float()
        vals = torch.stack(
            [x.mean(), x.std(unbiased=False), x.abs().max(), torch.isnan(x).any().float(), torch.isinf(x).any().float()]
        ).tolist()
    mean, std, absmax, nan, inf = vals

    def finite(v: float) -> float | None:
        return round(v, 6) if v == v and v not in (float("inf"), float("-inf")) else None

    return {"mean": finite(mean), "std": finite(std), "absmax": finite(absmax), "nan": bool(nan), "inf": bool(inf)}


def _plain(v: Any) -> Any:
    if v is None:
        return None
    try:
        return [int(i) for i in v]
    except (TypeError, ValueError):
        return str(v)


def _sglang_version() -> str | None:
    try:
        v = installed_sglang_version()
        return str(v) if v is not None else None
    except Exception:  # noqa: BLE001
        return None


def _applied_patches() -> list[str]:
    try:
        return [
            n
            for reg in (patches.get_registry(), get_registry())
            for n, s in reg.status().items()
            if s.state.value == "applied"
        ]
    except Exception:  # noqa: BLE001
        return []


def _emit(rec: dict) -> None:
    COUNTERS["records"] += 1
    RECORDS.append(rec)
    problems = judge(rec)
    line = "eagle3-patches probe " + summarize(rec)
    if problems:
        logger.warning("%s -- WRONG: %s", line, "; ".join(p.what for p in problems))
    else:
        logger.info("%s", line)
    path = output_file()
    if path is None:
        return
    data = (json.dumps(rec, default=str) + "\n").encode("utf-8")
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)  # one write per record: lines from several processes do not interleave
        finally:
            os.close(fd)
    except OSError as exc:
        logger.warning("eagle3-patches probe: cannot write %s: %s", path, exc)


def output_file(setting: str | None = None, pid: int | None = None) -> str | None:
    """Where this process writes its JSON lines: ``DIR/probe-<pid>.jsonl``, or the ``*.jsonl`` file named."""
    raw = _output[0] if setting is None else setting
    if not raw:
        return None
    if raw.endswith(".jsonl"):
        return raw
    return os.path.join(raw, f"probe-{pid or os.getpid()}.jsonl")


# ---------------------------------------------------------------------- the patch
class Eagle3Probe(Patch):
    name = PROBE_NAME
    summary = "opt-in diagnostic: records widths, dtype and statistics on the EAGLE-3 path once per process and mode"
    module = "sglang.srt.model_executor.model_runner"
    applies_to = SpecifierSet(">=0.5.8")
    default_enabled = False

    def enabled_by(self, s: settings.Settings) -> bool:
        return s.probe or self.name in s.enable

    def check(self, module: ModuleType) -> None:
        expect_source(expect_attr(module.ModelRunner, "forward"), "forward_batch")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        _output[0] = settings.current().probe_path
        saver.wrap(module.ModelRunner, "forward", _probed_forward)


PATCH = Eagle3Probe()
