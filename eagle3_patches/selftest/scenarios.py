"""What the checks make sglang do, each function run inside an isolated process (``run_isolated``).

A scenario drives real sglang objects (``ServerArgs``, ``ModelRunner``, ``TpModelWorker``, the EAGLE
worker) on the tiny checkpoints through :mod:`eagle3_patches.testing.sglang_harness` and returns what
it observed as plain data; it judges nothing (:mod:`.checks` does).  The same function serves the
stock run (no patch applied in its process) and the patched run (the patch set applied before sglang
is imported, as ``eagle3-patches run`` does), and the repository's behavioural tests call it too.

``overrides`` are server arguments for the device the selftest runs on (``device="cuda"``, the user's
attention backend and dtype, CUDA graphs on); empty on CPU, where the harness's CPU defaults apply.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``("ok", fn(...))``, or ``(exception type name, message)`` when it raised."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the observation
        return type(exc).__name__, str(exc)


def patch_states() -> dict[str, str]:
    import eagle3_patches

    return {n: s.state.value for n, s in eagle3_patches.status().items()}


def apply_patch_set(patches: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """Apply the patch set (default selection, or ``patches``) in this process now, with ``env`` added to the
    settings; the patches land on the sglang modules already imported.  Returns every patch's state."""
    import eagle3_patches
    from eagle3_patches import settings

    os.environ.update(env or {})
    settings.reload()
    eagle3_patches.apply(patches)
    return patch_states()


def stock_then_patched(
    fn: Callable[..., Any], *args: Any, patches: list[str] | None = None, env: dict[str, str] | None = None
) -> dict:
    """``fn(*args)`` on stock sglang, then the patch set applied in the same process and ``fn(*args)`` again.
    For scenarios whose objects are built per call (flag resolution): the stock observation is made before
    any patch exists in the process."""
    stock = fn(*args)
    states = apply_patch_set(patches, env)
    return {"stock": stock, "patched": fn(*args), "states": states}


# --------------------------------------------------------------------------- the EAGLE worker at fc
def eagle_prefill_fc_widths(target: str, draft: str, revert_first: bool = False, overrides: dict | None = None) -> dict:
    """The real target ``TpModelWorker`` and EAGLE worker, one prefill of two prompts: the widths at the
    target's output and at the draft's ``fc``.  ``revert_first``: every patch reverted before sglang builds
    anything (the process's patches applied, then their originals put back)."""
    import eagle3_patches
    from eagle3_patches.testing import sglang_harness as h

    if revert_first:
        eagle3_patches.revert()
    sa = h.eagle3_server_args(target, draft, **(overrides or {}))
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)
    result, _ = h.eagle_prefill(tw, dw, PROMPTS)
    model = tw.model_runner.model
    lm = getattr(model, "language_model", model).model
    return {
        "fc_inputs": fc_inputs,
        "target_width": tuple(result.logits_output.hidden_states.shape),
        "layers_to_capture": list(lm.layers_to_capture),
        "state": eagle3_patches.status()["kimi_k25_eagle3_delegation"].state.value,
    }


def wrapper_eagle3_prefill(target: str, draft: str, overrides: dict | None = None) -> dict:
    """A multimodal wrapper target (Kimi-VL, Qwen3-VL) with an EAGLE-3 draft: one text prefill through the real
    TpModelWorker + EAGLE worker; the widths at ``fc`` and the layers the target captured."""
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, **(overrides or {}))
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)
    model = tw.model_runner.model
    h.eagle_prefill(tw, dw, [[5, 6, 7, 8, 9]])
    captured = next(m.layers_to_capture for m in model.modules() if getattr(m, "layers_to_capture", None))
    return {"class": type(model).__name__, "fc_inputs": fc_inputs, "layers_to_capture": list(captured)}


def eagle_without_capture(target: str, draft: str, overrides: dict | None = None, then_patched: bool = False) -> dict:
    """``--speculative-algorithm EAGLE`` with the EAGLE-3 draft: the target captures nothing and hands the
    draft H-wide states.  Did ``fc`` run, did anything raise?  ``then_patched``: the same workers again after
    the patch set was applied in this process (the draft's forward is what the fix changes):
    ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, algorithm="EAGLE", **(overrides or {}))
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)

    def prefill() -> dict:
        before = len(fc_inputs)
        try:
            h.eagle_prefill(tw, dw, PROMPTS[:1])
        except Exception as exc:  # noqa: BLE001
            return {"error": type(exc).__name__, "message": str(exc), "fc_inputs": fc_inputs[before:]}
        return {"error": None, "message": "", "fc_inputs": fc_inputs[before:]}

    stock = prefill()
    if not then_patched:
        return stock
    apply_patch_set()
    return {"stock": stock, "patched": prefill()}


# --------------------------------------------------------------------------- flag resolution (launcher)
def launcher_outcomes(cases: dict[str, tuple], overrides: dict | None = None) -> dict[str, tuple[str, Any]]:
    """Per case ``(target, draft, algorithm)``, or ``(target, draft, algorithm, flags)`` with server arguments of
    its own: the server arguments resolved as the launcher resolves them, before any rank starts.
    ``("ok", resolved algorithm)`` or ``(exception type, message)``."""
    from eagle3_patches.testing import sglang_harness as h

    def resolve(target: str, draft: str, algorithm: str, flags: dict | None = None) -> str:
        return h.launcher_server_args(
            h.eagle3_server_args, target, draft, algorithm=algorithm, **(overrides or {}), **(flags or {})
        ).speculative_algorithm

    return {name: outcome(resolve, *case) for name, case in cases.items()}


def missing_capture_hooks(model_path: str) -> list[str]:
    """What sglang's EAGLE-3 path calls on a target that the target's sglang class (from its config's
    ``architectures``) does not have."""
    import json
    from pathlib import Path

    from sglang.srt.models.registry import ModelRegistry

    from eagle3_patches.patches.eagle3_target_capability import REQUIRED

    archs = json.loads((Path(model_path) / "config.json").read_text())["architectures"]
    cls, _ = ModelRegistry.resolve_model_cls(archs)
    return [m for m in REQUIRED if not callable(getattr(cls, m, None))]


# --------------------------------------------------------------------------- layer ids at the target
def capture_outcomes(
    target: str, cases: dict[str, list], overrides: dict | None = None, then_patched: bool = False
) -> dict:
    """For each case, the ids set on a real target model and one capturing prefill: ``("ok", aux shape)``
    or ``(exception type, message)``.  ``then_patched``: the cases again on the same model after the patch set
    was applied in this process: ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target, **(overrides or {})))
    model = runner.model

    def run_cases() -> dict:
        out = {}
        for name, ids in cases.items():
            model.model.layers_to_capture = []

            def run(ids=ids):
                model.set_eagle3_layers_to_capture(ids)
                step = h.prefill(runner, PROMPTS[:1], return_hidden_states=True)
                return tuple(step.logits_output.hidden_states.shape)

            out[name] = outcome(run)
        return out

    stock = run_cases()
    if not then_patched:
        return stock
    apply_patch_set()
    return {"stock": stock, "patched": run_cases()}


def a2a_capture_rows(target: str, overrides: dict | None = None, then_patched: bool = False) -> dict:
    """One capturing prefill of ``PROMPTS[0]`` with an all-to-all MoE backend on (``enable_a2a_moe``: sglang gathers
    each aux state past the dense layers) under DP attention at TP 2, emulated on one rank: the TP group's gather
    (``parallel_state._TP``, whichever name reaches it) returns this rank's rows and a second attention-DP rank's,
    which serves other tokens (zeros here); the attention-TP group is this rank alone.  ``("ok", shape of the
    stored hidden states)`` or ``(exception type, message)``; ``then_patched``: again after the patch set was applied
    in this process, ``{"stock": ..., "patched": ...}``."""
    import torch
    from sglang.srt.distributed import parallel_state

    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target, **(overrides or {})))
    runner.model.set_eagle3_layers_to_capture([1, 2, 3])  # layers past the tiny target's one dense layer
    runner.model.model.enable_a2a_moe = True
    this_rank = parallel_state.get_tp_group()

    class TpGroupOfTwo:
        """This rank's TP group as a group of two whose other rank serves other tokens."""

        def all_gather(self, input_, dim: int = -1):
            return torch.cat([input_, torch.zeros_like(input_)], dim=dim)

        def __getattr__(self, name: str):
            return getattr(this_rank, name)

    # the group itself, not one module's name for it: a gather that reaches the TP group by any path (the module's
    # tensor_model_parallel_all_gather, get_tp_group() from parallel_state or from sglang.srt.distributed) gets both
    # ranks' rows, while the attention-TP group (parallel_state._ATTN_TP) stays this rank alone
    assert parallel_state.get_attn_tp_group() is not None
    parallel_state._TP = TpGroupOfTwo()

    def run() -> tuple:
        step = h.prefill(runner, PROMPTS[:1], return_hidden_states=True)
        return tuple(step.logits_output.hidden_states.shape)

    stock = outcome(run)
    if not then_patched:
        return {"stock": stock}
    apply_patch_set()
    return {"stock": stock, "patched": outcome(run)}


def chunked_prefix_switch(target: str, draft: str, overrides: dict | None = None, then_patched: bool = False) -> dict:
    """The real target and draft model runners on their shared ``ServerArgs``, each running its own
    ``model_specific_adjustment`` as it does when it is built, with an MLA backend that reads the chunked prefix cache
    named (fa3: the flag value only, no kernel runs) and the switch on.  ``{"target": switch after the target's
    adjustment, "draft": after the draft's}`` (``disable_chunked_prefix_cache``); ``then_patched``: again after the
    patch set was applied in this process, ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, **(overrides or {}))
    target_runner = h.model_runner(sa)
    draft_runner = h.draft_runner(sa, target_runner)
    backend = sa.attention_backend

    def run() -> dict:
        sa.attention_backend, sa.disable_chunked_prefix_cache = "fa3", False
        try:
            target_runner.model_specific_adjustment()
            after_target = sa.disable_chunked_prefix_cache
            draft_runner.model_specific_adjustment()
            return {"target": after_target, "draft": sa.disable_chunked_prefix_cache}
        finally:
            sa.attention_backend = backend

    stock = outcome(run)
    if not then_patched:
        return {"stock": stock}
    apply_patch_set()
    return {"stock": stock, "patched": outcome(run)}


def captured_layers(target: str, marked: str, unmarked: str, overrides: dict | None = None) -> dict:
    """Which target layers' outputs the aux tensor holds for the draft config ``marked`` (ids recording the
    library's convention): with the process's patches, then with ``layer_id_convention`` reverted (the same
    model, stock rule).  The aux tensor of a real prefill is compared chunk by chunk with every decoder
    layer's output (forward hooks on the same run).  Then ``unmarked`` (no convention recorded) with the
    patch on again: the layers it captures, set twice; the same ids in the convention the environment names
    (``input-of-layer``, first id 1); and the default no-argument call.  What eagle3-patches logged in each
    phase comes with it."""
    import logging
    import os

    import torch

    import eagle3_patches
    from eagle3_patches import settings
    from eagle3_patches.checkpoint.layer_ids import INPUT_OF_LAYER
    from eagle3_patches.sglang_runtime import current_server_args
    from eagle3_patches.testing import sglang_harness as h

    from .checkpoints import LAYER_CHECK_IDS

    records: list[str] = []
    handler = h.LogSink(lambda rec: records.append(rec.getMessage()))
    logger = logging.getLogger("eagle3_patches")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))

    def logs() -> list[str]:
        out, records[:] = list(records), []
        return out

    overrides = dict(overrides or {})
    overrides.setdefault(
        "attention_backend", "torch_native"
    )  # CPU: the target alone runs faster than interpreted triton
    sa = h.eagle3_server_args(target, marked, **overrides)
    runner = h.model_runner(sa)
    model = runner.model
    outputs = layer_output_hooks(model)

    def run() -> dict:
        outputs.clear()
        step = h.prefill(runner, PROMPTS, return_hidden_states=True)
        aux = step.logits_output.hidden_states
        found = []
        for chunk in aux.split(model.config.hidden_size, dim=-1):
            same = [
                i
                for i in sorted(outputs)
                if outputs[i].shape == chunk.shape
                and torch.allclose(chunk.float(), outputs[i].float(), rtol=1e-5, atol=1e-6)
            ]
            found.append(same[0] if len(same) == 1 else same)
        return {"layers_to_capture": list(model.model.layers_to_capture), "width": aux.shape[-1], "outputs_of": found}

    def capture(*ids) -> list[int]:
        model.set_eagle3_layers_to_capture(*ids)
        return list(model.model.layers_to_capture)

    status = eagle3_patches.status()["layer_id_convention"]
    result: dict[str, Any] = {"state": status.state.value, "reason": status.reason, "patched": run()}
    result["patched"]["logs"] = logs()

    first_id_1 = [1, *list(LAYER_CHECK_IDS)[1:]]  # sglang >= 0.5.13 adds 1 to such a list
    eagle3_patches.revert(["layer_id_convention"])
    result["stock"] = {"default": capture(), "first_id_1": capture(first_id_1)}
    model.set_eagle3_layers_to_capture(list(LAYER_CHECK_IDS))
    result["stock"].update(run())

    eagle3_patches.apply(["layer_id_convention"])
    logs()
    h.set_server_arg(current_server_args(), "speculative_draft_model_path", unmarked)
    capture(list(LAYER_CHECK_IDS))
    result["unmarked"] = {"layers_to_capture": capture(list(LAYER_CHECK_IDS)), "logs": logs()}  # set twice
    try:
        settings.reload({**os.environ, settings.LAYER_ID_CONVENTION: INPUT_OF_LAYER})
        result["unmarked_input_of_layer"] = {"layers_to_capture": capture(first_id_1), "logs": logs()}
    finally:
        settings.reload()
    result["default"] = {"layers_to_capture": capture(), "logs": logs()}
    logger.removeHandler(handler)
    logger.setLevel(level)
    return result


def layer_output_hooks(model) -> dict:
    """Forward hooks on every decoder layer of ``model`` (Kimi-K2.5: of its language model): the dict they fill,
    layer index -> that layer's output (``hidden_states + residual``) in the last eager forward."""
    import torch

    lm = getattr(model, "language_model", model)
    outputs: dict[int, torch.Tensor] = {}

    def hook(i):
        def record(module, args, kwargs, out):
            hs, res = out[0], out[1]
            if isinstance(res, torch.Tensor) and res.shape == hs.shape:  # (hidden_states, residual)
                value = hs + res  # the layer's output
            else:  # sglang >= 0.5.23: (contribution, topk_indices); the residual lives in the batch's stream
                forward_batch = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
                value = forward_batch.residual_stream.snapshot(hs)
            outputs[i] = value.detach().clone()

        return record

    for i, layer in enumerate(lm.model.layers):
        layer.register_forward_hook(hook(i), with_kwargs=True)
    return outputs


def nearest_layers(aux, outputs: dict, hidden: int) -> list[int | None]:
    """Per aux state (chunk of ``hidden`` columns of ``aux``): the decoder layer whose output it is closest to."""
    found = []
    for chunk in aux.float().split(hidden, dim=-1):
        diffs = {i: float((chunk - out.float()).abs().max()) for i, out in outputs.items() if out.shape == chunk.shape}
        found.append(min(diffs, key=lambda i: diffs[i]) if diffs else None)
    return found


# --------------------------------------------------------------------------- CUDA graph capture order (CPU)
def graph_capture_sequence(target: str, draft: str, patched: bool) -> dict:
    """The real target ``ModelRunner`` (EAGLE3) built through sglang's GPU graph path on CPU: which layers
    are in force when graph capture starts, and for eager runs afterwards; again after a re-capture (the
    weight-update path).  ``patched``: the patch set applied (lazily, before sglang is imported).

    There is no CUDA graph on CPU, so only the graph capture itself is replaced:
    ``init_device_graphs`` skips graphs for device ``cpu`` unless torch.compile is on, and its ``cpu``
    slot is ``CPUGraphRunner``; ``enable_torch_compile`` is set on the built ``ServerArgs`` and a subclass
    of the real ``CudaGraphRunner`` whose ``capture()`` records ``layers_to_capture`` takes that slot."""
    import eagle3_patches
    from eagle3_patches.patches import cuda_graph_capture_order as cgo

    if patched:
        eagle3_patches.apply()  # lazy: lands when sglang's modules are imported below
    reg = eagle3_patches.get_registry()

    import sglang.srt.model_executor.model_runner as mr
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    from eagle3_patches.testing import sglang_harness as h

    def layers(model) -> list[int]:
        lm = getattr(model, "language_model", model)  # Kimi-K2.5 wraps a DeepseekV3ForCausalLM
        return list(lm.model.layers_to_capture)

    at_capture: list[list[int]] = []

    class CudaGraphRunnerOnCpu(CudaGraphRunner):
        """The real CudaGraphRunner; only the CUDA graph capture itself is replaced by a record."""

        def capture(self) -> None:
            at_capture.append(layers(self.model_runner.model))

    mr.CPUGraphRunner = CudaGraphRunnerOnCpu  # the GPU path's runner in the cpu slot of init_device_graphs
    sa = h.eagle3_server_args(target, draft)
    sa.enable_torch_compile = True  # the only way past `if device == "cpu" and not enable_torch_compile: return`

    status = reg.status()[cgo.NAME]
    out: dict = {"state": status.state.value, "reason": status.reason, "upstream": cgo.PATCH.upstream(mr)}
    original = reg.get_original(mr.ModelRunner, "init_device_graphs")
    out["wrapped"] = mr.ModelRunner.__dict__["init_device_graphs"] is not original

    runner = h.model_runner(sa)
    out["configured_ids"] = runner.eagle_aux_hidden_state_layer_ids
    out["graph_runner"] = type(runner.graph_runner).__name__
    out["at_capture"] = list(at_capture)
    out["eager"] = layers(runner.model)
    out["shadow_left"] = cgo.SETTER in vars(runner.model)

    runner.init_device_graphs()  # update_weights_from_disk with recapture captures the graphs again
    out["at_recapture"] = at_capture[-1]
    out["eager_after_recapture"] = layers(runner.model)

    if out["wrapped"]:
        reg.revert([cgo.NAME])
        out["revert_identity"] = mr.ModelRunner.__dict__["init_device_graphs"] is original
        out["original_is_sglangs"] = original.__code__.co_filename == mr.__file__
    return out


# --------------------------------------------------------------------------- TP all-reduce fusion
def fusion_decisions(
    kimi: str, deepseek: str, draft: str, stand_in_gpu: bool = True, overrides: dict | None = None
) -> dict:
    """``enable_flashinfer_allreduce_fusion`` as the real ``ServerArgs`` decides it: stock, then with
    ``tp_allreduce_fusion_capture`` applied alone in this process (the other flag guards would refuse
    the EAGLE cases), then reverted.  ``stand_in_gpu``: the hardware facts ``ServerArgs`` reads are an
    H200's (sm90), then a B200's (sm100) - on a machine without that GPU; False: this machine's own."""
    import logging

    import sglang.srt.server_args as sa_mod

    from eagle3_patches.patches import tp_allreduce_fusion_capture as tafc
    from eagle3_patches.registry import Registry
    from eagle3_patches.testing import sglang_harness as h

    records: list[logging.LogRecord] = []
    logging.getLogger("eagle3_patches").addHandler(h.LogSink(records.append, logging.DEBUG))

    def fusion(path: str, algorithm: str | None, tp: int, **kw) -> dict:
        before = len(records)
        kw = {**(overrides or {}), **kw}
        if algorithm:
            sa = h.eagle3_server_args(path, draft, algorithm=algorithm, tp_size=tp, **kw)
        else:
            sa = h.server_args(path, tp_size=tp, **kw)
        logs = [(r.levelname, r.getMessage()) for r in records[before:]]
        return {"fusion": sa.enable_flashinfer_allreduce_fusion, "algorithm": sa.speculative_algorithm, "logs": logs}

    out: dict = {"stand_in_gpu": stand_in_gpu, "machine_stock": fusion(kimi, "EAGLE3", 2)}
    if stand_in_gpu:  # an H200, as the hardware-detection functions in server_args would report it
        sa_mod.is_sm90_supported = lambda *a, **k: True
        sa_mod.get_device_name = lambda *a, **k: "NVIDIA H200"
    out["stock"] = {name: fusion(path, "EAGLE3", 2) for name, path in (("kimi", kimi), ("deepseek", deepseek))}

    reg = Registry("selftest", [tafc.PATCH])
    original = sa_mod.ServerArgs.__dict__["_handle_model_specific_adjustments"]
    reg.apply()  # sglang.srt.server_args is imported: lands now
    out["state"] = reg.status()[tafc.NAME].state.value
    out["reason"] = reg.status()[tafc.NAME].reason
    out["upstream"] = tafc.PATCH.upstream(sa_mod)
    out["patched"] = {
        "kimi_eagle3_tp2": fusion(kimi, "EAGLE3", 2),
        "deepseek_eagle3_tp2": fusion(deepseek, "EAGLE3", 2),
        "kimi_eagle3_tp2_explicit": fusion(kimi, "EAGLE3", 2, enable_flashinfer_allreduce_fusion=True),
        "kimi_eagle3_tp1": fusion(kimi, "EAGLE3", 1),
        "kimi_none_tp2": fusion(kimi, None, 2),
        "kimi_eagle_tp2": fusion(kimi, "EAGLE", 2),
        "kimi_eagle_tp2_explicit": fusion(kimi, "EAGLE", 2, enable_flashinfer_allreduce_fusion=True),
    }
    if stand_in_gpu:  # sm100 (B200) instead of sm90
        sa_mod.is_sm90_supported = lambda *a, **k: False
        sa_mod.is_sm100_supported = lambda *a, **k: True
        sa_mod.get_device_name = lambda *a, **k: "NVIDIA B200"
        out["patched"]["kimi_eagle3_tp2_sm100"] = fusion(kimi, "EAGLE3", 2)

    reg.revert([tafc.NAME])
    out["revert_identity"] = sa_mod.ServerArgs.__dict__["_handle_model_specific_adjustments"] is original
    out["reverted"] = fusion(kimi, "EAGLE3", 2)
    return out


# --------------------------------------------------------------------------- the draft's loader
def bit_exact_mismatches(loaded: dict, path) -> list[str]:
    """The draft parameters (as sglang holds them, q/k/v and gate/up fused) that differ bit for bit from the
    checkpoint file at ``path`` (``midlayer.*`` or ``layers.0.*`` names).  Runs in the parent."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    t = {
        name.replace("layers.0.", "midlayer."): v.float()
        for name, v in load_file(str(Path(path) / "model.safetensors")).items()
    }
    a, m = "midlayer.self_attn.", "midlayer.mlp."
    expected = {
        "model.midlayer.self_attn.qkv_proj.weight": torch.cat(
            [t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]
        ),
        "model.midlayer.mlp.gate_up_proj.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
    }
    for name in (
        "midlayer.self_attn.o_proj.weight",
        "midlayer.mlp.down_proj.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "fc.weight",
        "norm.weight",
    ):
        expected[f"model.{name}"] = t[name]
    expected["lm_head.weight"] = t["lm_head.weight"]

    def param(name: str) -> str:  # sglang >= 0.5.12 names the decoder layer layers.0 instead of midlayer
        return name if name in loaded else name.replace("model.midlayer.", "model.layers.0.")

    return [n for n, v in expected.items() if not torch.equal(loaded[param(n)].float().to(v.device), v)]


#: set by the selftest: the file a check's processes write their output to (sglang logs a lot)
LOG_VARIABLE = "EAGLE3_SELFTEST_LOG"


def to_log() -> None:
    """This process's stdout and stderr (file descriptors 1 and 2) appended to the check's log, when the selftest
    gave one."""
    path = os.environ.get(LOG_VARIABLE)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def differing_tensors(a: dict | None, b: dict | None) -> list[str]:
    """The parameters two loads of one draft hold differently, bit for bit (dtype included); a parameter only one
    of them has counts too, and a load that did not happen is ``["(not loaded)"]``.  The embedding is left out:
    no checkpoint fills it, sglang replaces it by the target's, and until then it holds whatever memory it was
    allocated in.  Runs in the parent."""
    import torch

    if a is None or b is None:
        return ["(not loaded)"]

    def raw(t):
        return t.reshape(-1).view(torch.uint8)

    return sorted(set(a) ^ set(b)) + [
        n
        for n in a
        if n in b
        and n != "model.embed_tokens.weight"
        and not (a[n].dtype == b[n].dtype and torch.equal(raw(a[n]), raw(b[n])))
    ]


def observed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """The child side of :meth:`.base.Context.observe`: the scenario's outcome and every patch's state afterwards."""
    import eagle3_patches

    to_log()
    result = outcome(fn, *args, **kwargs)
    status = eagle3_patches.status()
    return {
        "outcome": result,
        "states": {n: s.state.value for n, s in status.items()},
        "reasons": {n: s.reason for n, s in status.items()},
    }


def load_drafts_to_host(target: str, drafts: list, overrides: dict | None = None) -> list[dict]:
    """:func:`eagle3_patches.testing.sglang_harness.load_drafts` with the device's server arguments, every tensor
    returned on the host (a CUDA tensor does not survive the trip back to the parent process)."""
    from eagle3_patches.testing import sglang_harness as h

    return to_host(h.load_drafts(target, drafts, **(overrides or {})))


def to_host(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


# --------------------------------------------------------------------------- prefill/decode disaggregation
def pd_metadata_commits(target: str, draft: str, other_draft: str, then_patched: bool = True) -> dict:
    """One request's metadata row through sglang's real disaggregation code, per prefill setup: the prefill side's
    ``MetadataBuffers.set_buf`` writes it (its ``ServerArgs`` this process's, as in a prefill scheduler), the row's
    bytes are copied into the decode side's buffers (what the transfer engine does), and the decode side's
    ``DecodeTransferQueue._commit_transfer_to_req`` commits it.  Per case: ``pd_commit``'s (committed first token,
    abort message or None, the row's ``output_ids`` as sent).  Cases: ``same`` (the decode server's own flags),
    ``unpatched`` (the same flags, the prefill process without eagle3-patches), ``no_spec`` (the prefill without
    speculation), ``other_draft``, ``topk`` (another ``--speculative-eagle-topk``), ``attention_tp`` (the prefill
    at TP 2: the MLA target's Llama-class draft KV split otherwise), ``fake`` (the fake backend on the decode side, the
    prefill without speculation), ``health_check`` (sglang's own health-check request, nothing transferred),
    ``decode_no_spec`` (neither side speculates).  ``then_patched``: again after the patch set was applied in this
    process, ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    p, d, fake = {"disaggregation_mode": "prefill"}, {"disaggregation_mode": "decode"}, "fake"
    decode = h.eagle3_server_args(target, draft, **d)
    prefills = {
        "same": h.eagle3_server_args(target, draft, **p),
        "no_spec": h.server_args(target, **p),
        "other_draft": h.eagle3_server_args(target, other_draft, **p),
        "topk": h.eagle3_server_args(target, draft, speculative_eagle_topk=2, speculative_num_draft_tokens=4, **p),
        "attention_tp": h.eagle3_server_args(target, draft, tp_size=2, **p),
    }
    # the fake case's prefill keeps the default backend: some releases (0.5.10) refuse a fake prefill server, and
    # only the decode side's backend decides what is transferred
    fake_prefill = prefills["no_spec"]
    fake_decode = h.eagle3_server_args(target, draft, disaggregation_transfer_backend=fake, **d)

    def run() -> dict:
        out = {name: outcome(h.pd_commit, prefill, decode) for name, prefill in prefills.items()}
        out["unpatched"] = outcome(h.pd_commit, prefills["same"], decode, stamped=False)
        out["health_check"] = outcome(h.pd_commit, prefills["no_spec"], decode, stamped=False, health_check=True)
        out["fake"] = outcome(h.pd_commit, fake_prefill, fake_decode)
        out["decode_no_spec"] = outcome(h.pd_commit, prefills["no_spec"], h.server_args(target, **d))
        return out

    stock = run()
    if not then_patched:
        return {"stock": stock}
    apply_patch_set()
    return {"stock": stock, "patched": run()}
