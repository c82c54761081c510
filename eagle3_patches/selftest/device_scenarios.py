"""The scenarios only a CUDA device can run: real CUDA graphs, the user's attention backend and dtype,
real quantization kernels, TP 2 over NCCL.  Each runs inside an isolated process like
:mod:`.scenarios` and returns plain data (tensors moved to the host: a CUDA tensor does not survive
the trip back to the parent process).

NOT YET RUN ON A GPU (docs/upgrading.md says what is verified).  They follow sglang 0.5.9's CUDA paths
as read from its source (``cuda_graph_runner.py``, ``model_runner.py``, ``communicator.py``) and the CPU
recreations of the same situations in the test suite.
"""

from __future__ import annotations

from .scenarios import PROMPTS, outcome, patch_states, to_host, to_log


def _record_fc_inputs_from_construction() -> list[tuple[int, ...]]:
    """Input shapes of every EAGLE-3 draft's ``fc`` from the moment the draft model is built, so the forwards
    sglang runs while it captures CUDA graphs (inside the worker's constructor) are seen too."""
    import sglang.srt.models.llama_eagle3 as llama_eagle3

    shapes: list[tuple[int, ...]] = []
    klass = llama_eagle3.LlamaForCausalLMEagle3
    init = klass.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.model.fc.register_forward_hook(lambda mod, inp, out: shapes.append(tuple(inp[0].shape)))  # shapes only

    klass.__init__ = recording_init
    return shapes


def graph_replay_vs_eager(target: str, draft: str, overrides: dict, decode_steps: int = 3) -> dict:
    """The real target ``TpModelWorker`` and EAGLE worker with CUDA graphs on (sglang's default), a prefill
    and ``decode_steps`` speculative decode steps.  Every target forward that sglang runs as a CUDA graph
    replay (target verify) is run again eagerly on the same ``ForwardBatch``; for each aux state of both
    runs, the decoder layer whose output it is (the eager run's layer outputs, taken by forward hooks;
    a replay never reaches Python).  Graphs that baked in other layers than the eager path captures name
    other layers."""
    import torch

    from eagle3_patches.testing import sglang_harness as h

    from .scenarios import layer_output_hooks, nearest_layers

    sa = h.eagle3_server_args(target, draft, **overrides)
    tw, dw = h.eagle_workers(sa)  # captures the graphs
    runner = tw.model_runner
    fc_inputs = h.record_fc_inputs(dw)
    hidden = runner.model_config.hidden_size
    outputs = layer_output_hooks(runner.model)  # after capture: the hooks run in eager forwards only
    compared: list[dict] = []
    forward = runner.forward  # the bound method, patched or not

    def replay_then_eager(forward_batch, *args, **kwargs):
        out = forward(forward_batch, *args, **kwargs)
        aux = getattr(out.logits_output, "hidden_states", None)
        if not getattr(out, "can_run_graph", False) or aux is None:
            return out
        replayed = aux.detach().clone()  # the graph's static output buffer: overwritten by the next replay
        graphs, runner.graph_runner = runner.graph_runner, None
        outputs.clear()
        try:
            kwargs = dict(kwargs, skip_attn_backend_init=False)  # the eager path sets up its own attention metadata
            eager = forward(forward_batch, *args, **kwargs).logits_output.hidden_states
        finally:
            runner.graph_runner = graphs
        diff = [
            float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))
            for a, b in zip(replayed.float().split(hidden, dim=-1), eager.float().split(hidden, dim=-1))
        ]
        compared.append(
            {
                "mode": forward_batch.forward_mode.name,
                "shape": tuple(replayed.shape),
                "graph_layers": nearest_layers(replayed, outputs, hidden),
                "eager_layers": nearest_layers(eager, outputs, hidden),
                "relative_difference": diff,
            }
        )
        return out

    runner.forward = replay_then_eager
    batch = h.eagle_prefill_batch(tw, PROMPTS)
    error = None
    try:  # graphs that captured other layers can also hand fc a width it cannot take: what was compared still counts
        h.eagle_step(dw, batch)
        for _ in range(decode_steps):
            batch.prepare_for_decode()
            h.eagle_step(dw, batch)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the observation
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    model = runner.model
    lm = getattr(model, "language_model", model).model
    return {
        "compared": compared,
        "error": error,
        "fc_inputs": fc_inputs,
        "layers_to_capture": list(lm.layers_to_capture),
        "graphs": runner.graph_runner is not None,
        "dtype": str(getattr(runner, "dtype", runner.model_config.dtype)),
        "attention_backend": runner.server_args.attention_backend,
        "output_ids": [list(r.output_ids) for r in batch.reqs],
    }


def draft_extend_graphs(target: str, draft: str, overrides: dict) -> dict:
    """The EAGLE worker built with CUDA graphs on: sglang captures its draft-extend graphs (a real
    ``torch.cuda.graph``) inside the worker's constructor; what reached ``fc`` during capture, the static
    hidden-state buffer's width, or the error the construction raised."""
    from eagle3_patches.testing import sglang_harness as h

    fc_inputs = _record_fc_inputs_from_construction()
    sa = h.eagle3_server_args(target, draft, **overrides)
    try:
        _, eagle = h.eagle_workers(sa)
    except Exception as exc:  # noqa: BLE001 - the observation
        return {"error": type(exc).__name__, "message": str(exc), "fc_inputs": fc_inputs}
    holders = [eagle, getattr(eagle, "draft_worker", None), getattr(eagle, "_draft_worker", None)]
    runner = next(
        (
            r
            for x in holders
            if x is not None
            for r in [getattr(x, "cuda_graph_runner_for_draft_extend", None)]
            if r is not None
        ),
        None,
    )
    buffer = getattr(runner, "hidden_states", None)
    return {
        "error": None,
        "message": "",
        "fc_inputs": fc_inputs,
        "captured": runner is not None,
        "runner": type(runner).__name__ if runner is not None else None,
        "buffer": None if buffer is None else int(buffer.shape[-1]),
    }


def dump_under_graph_capture(target: str, overrides: dict) -> dict:
    """The target without speculation, CUDA graphs on (sglang captures DECODE graphs), the opt-in
    ``hidden_state_dump`` on (``EAGLE3_PATCHES_DUMP_DIR`` in the process's environment): did the capture
    succeed, what was recorded by it and by sglang's warm-up, and by a served prefill and decode step."""
    import logging

    from eagle3_patches.instruments import hidden_state_dump as dump
    from eagle3_patches.testing import sglang_harness as h

    warnings: list[str] = []
    handler = h.LogSink(lambda record: warnings.append(record.getMessage()), logging.WARNING)
    logging.getLogger("eagle3_patches").addHandler(handler)

    def rows() -> int:
        return dump._DUMPER.n_rows if dump._DUMPER else 0

    built = outcome(h.model_runner, h.server_args(target, **overrides))
    if built[0] != "ok":
        return {"error": built[0], "message": built[1], "warnings": warnings}
    runner = built[1]
    out: dict = {"error": None, "graphs": runner.graph_runner is not None, "rows_after_capture": rows()}
    step = h.prefill(runner, [[5, 6, 7, 8], [9, 10, 11]])
    out["rows_after_prefill"] = rows()
    h.decode(runner, step)  # a graph replay: never reaches Python, so not recorded
    out["rows_after_decode"] = rows()
    if dump._DUMPER is not None:
        dump._DUMPER.flush()
    out["warnings"] = warnings
    return out


def tp_capture(rank: int, world_size: int, port: int, target: str, overrides: dict) -> dict:
    """One TP rank (``run_ranks``; on a GPU machine each rank sees its own GPU as ``cuda:0`` through
    ``CUDA_VISIBLE_DEVICES``) of the tiny target with EAGLE-3 capture on: the aux states of one prefill, on the
    host.  Also what ``tests/distributed/test_tp2_capture.py`` runs on CPU over gloo."""
    import os

    from eagle3_patches.testing import sglang_harness as h
    from eagle3_patches.testing.tiny_models import DRAFT_AUX_IDS

    to_log()
    sa = h.server_args(target, tp_size=world_size, **overrides)
    runner = h.model_runner(sa, tp_rank=rank, nccl_port=port)
    runner.model.set_eagle3_layers_to_capture(list(DRAFT_AUX_IDS))
    step = h.prefill(runner, PROMPTS, return_hidden_states=True)
    return {
        "rank": rank,
        "pid": os.getpid(),
        "aux": to_host(step.logits_output.hidden_states),
        "tokens": step.next_token_ids.tolist(),
        "fusion": bool(getattr(sa, "enable_flashinfer_allreduce_fusion", False)),
        "backend": _backend(),
        "states": patch_states(),
    }


def _backend() -> str | None:
    import torch.distributed as dist

    try:
        return str(dist.get_backend())
    except (RuntimeError, ValueError):
        return None
