# long module: the sglang objects the scenarios build, in the order a server builds them (eras: sglang_eras.py)
"""Drive real sglang ``ModelRunner`` / ``TpModelWorker`` / ``EAGLEWorker`` objects on CPU.

Every function here runs *inside* an isolated process (see :mod:`.isolation`):
sglang 0.5.9 keeps process-global state (model-parallel groups, eplb metadata),
so one target model per process.  Batches are built the way
``sglang.bench_one_batch`` builds them.  What differs between sglang releases is
delegated to the adapter of the installed release's API era (:mod:`.sglang_eras`),
chosen once per process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from . import cpu_pools
from .sglang_eras import current as era
from .tiny_vl_models import lacks_its_processor


def server_args(model_path: str, **overrides: Any):
    from sglang.srt.server_args import ServerArgs

    kwargs = dict(
        model_path=str(model_path),
        device="cpu",
        attention_backend="torch_native",
        disable_cuda_graph=True,
        skip_tokenizer_init=True,
        max_total_tokens=cpu_pools.RUNNER_MAX_TOTAL_TOKENS,  # given, not profiled from free memory (cpu_pools)
        mem_fraction_static=cpu_pools.MEM_FRACTION_STATIC,
        trust_remote_code=True,
        random_seed=0,
        disable_overlap_schedule=True,
        grammar_backend="none",
    )
    kwargs.update(overrides)
    if "cuda_graph_bs" in kwargs and not hasattr(ServerArgs, "cuda_graph_bs"):
        # sglang 0.5.15 folded --cuda-graph-bs into per-phase flags; the decode phase's is the graph runners' list
        kwargs["cuda_graph_bs_decode"] = kwargs.pop("cuda_graph_bs")
    if kwargs.get("speculative_algorithm"):
        # EAGLE has no torch_native draft backend; triton runs under TRITON_INTERPRET=1
        # and bf16 under the interpreter gives NaN garbage (docs/cpu-profile.md)
        kwargs.setdefault("dtype", "float32")
        if kwargs["attention_backend"] == "torch_native":
            kwargs["attention_backend"] = "triton"
    return ServerArgs(**kwargs)


def launcher_server_args(build, *args: Any, **kwargs: Any):
    """``build(*args, **kwargs)`` resolved as the launcher resolves it before it starts any rank
    (``ServerArgs.__post_init__``; plus ``resolve_once()`` from sglang 0.5.19, whose constructor
    resolves nothing).  Resolved server args are read-only there: set fields on ``build``'s result.  A multimodal
    target without its processor (the first argument) is resolved with image input off unless ``enable_multimodal``
    is given."""
    if args and lacks_its_processor(args[0]):
        # as the servers of these targets run (testing.server.Server's text_only): no processor, no image input
        kwargs.setdefault("enable_multimodal", False)
    sa = build(*args, **kwargs)
    era().resolve_server_args(sa)
    return sa


def eagle3_server_args(target: str, draft: str, algorithm: str = "EAGLE3", **overrides: Any):
    """A speculative server's args; image input off unless ``enable_multimodal`` is given: the batches here are text,
    and with image input on the patch set refuses EAGLE3 on the releases whose draft reads wrong rows for images
    (``eagle3_image_draft_rows``), which is not what these scenarios look at."""
    overrides.setdefault("enable_multimodal", False)
    return server_args(
        target,
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(draft),
        speculative_num_steps=overrides.pop("speculative_num_steps", 3),
        speculative_eagle_topk=overrides.pop("speculative_eagle_topk", 1),
        speculative_num_draft_tokens=overrides.pop("speculative_num_draft_tokens", 4),
        **overrides,
    )


def model_runner(
    sa,
    *,
    tp_rank: int = 0,
    nccl_port: int | None = None,
    is_draft: bool = False,
    model_path: str | None = None,
    **kw: Any,
):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import PortArgs

    model_path = model_path or (sa.speculative_draft_model_path if is_draft else sa.model_path)
    if is_draft and "memory_pool_config" not in kw and _LAST_TARGET:
        kw.update(era().draft_runner_kwargs(_LAST_TARGET[-1]))
    nccl_port = nccl_port or PortArgs.init_new(sa).nccl_port
    if not is_draft:
        publish_process_config(sa, tp_rank=tp_rank, nccl_port=nccl_port)
    model_config = ModelConfig.from_server_args(sa, model_path=model_path, is_draft_model=is_draft)
    if not is_draft:
        init_layer_runtime(model_config)
    runner = era().construct(
        ModelRunner,
        model_config=model_config,
        mem_fraction_static=sa.mem_fraction_static,
        gpu_id=0,
        tp_rank=tp_rank,
        tp_size=sa.tp_size,
        moe_ep_rank=0,
        moe_ep_size=1,
        pp_rank=0,
        pp_size=1,
        nccl_port=nccl_port,
        server_args=sa,
        is_draft_worker=is_draft,
        **kw,
    )
    era().finish_runner_init(runner, is_draft)
    if not is_draft:
        _LAST_TARGET[:] = [runner]  # a draft runner built next shares its memory-pool config (0.5.10+)
    return runner


def draft_runner(sa, target_runner, **kw: Any):
    """The draft's ModelRunner, sharing the target runner's request and KV-slot pools as sglang's EAGLE worker
    builds it (``kw``: ``model_path`` and the like, as :func:`model_runner` takes them)."""
    return model_runner(
        sa,
        is_draft=True,
        req_to_token_pool=target_runner.req_to_token_pool,
        token_to_kv_pool_allocator=target_runner.token_to_kv_pool_allocator,
        **kw,
    )


_LAST_TARGET: list = []
_PUBLISHED: list = []


def publish_process_config(sa, *, tp_rank: int = 0, nccl_port: int) -> bool:
    """sglang >= 0.5.21: what the scheduler process entry does before it builds a worker.

    ``run_scheduler_process`` / ``bench_one_batch`` resolve the ``ServerArgs``, ``publish`` them for the
    ``scheduler`` role with the process placement, set the process-global GEMM / MoE configs and start
    the parallel runtime (process groups).  Earlier releases do all of it inside ``ModelRunner``; there
    this is a no-op (returns False).  Once per process and record (draft runners reuse the target's).
    """
    if any(p is sa for p in _PUBLISHED):
        return True
    if not era().publish_process_config(sa, tp_rank=tp_rank, nccl_port=nccl_port):
        return False
    _PUBLISHED[:] = [sa]
    return True


def init_layer_runtime(model_config) -> None:
    """sglang >= 0.5.21: ``bootstrap.init_layer_runtime`` for the target model (as the scheduler)."""
    era().init_layer_runtime(model_config)


class _TreeCache(SimpleNamespace):
    """What ``ScheduleBatch`` needs of a tree cache when nothing is cached (as bench_one_batch)."""

    def supports_swa(self) -> bool:
        return False

    def supports_mamba(self) -> bool:
        return False

    def is_chunk_cache(self) -> bool:
        return False

    def is_tree_cache(self) -> bool:
        return True

    def supports_prefix_sharing(self) -> bool:  # sglang >= 0.5.22
        return True

    def evict(self, params: Any = None) -> None:
        pass

    def maybe_hand_to_session(self, req: Any) -> None:  # sglang >= 0.5.22
        pass


def make_reqs(prompts: Sequence[Sequence[int]], max_new_tokens: int = 8, vocab_size: int | None = None):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i, ids in enumerate(prompts):
        req = Req(
            rid=str(i),
            origin_input_text="",
            origin_input_ids=list(ids),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new_tokens),
        )
        req.sampling_params.normalize(None)  # what the scheduler does on arrival
        req.vocab_size = vocab_size  # needed by check_finished in decode/verify steps
        req.logprob_start_len = -1
        era().init_req(req)
        reqs.append(req)
    return reqs


def schedule_batch(reqs, runner, spec_algorithm=None):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return ScheduleBatch.init_new(
        reqs=reqs,
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        tree_cache=_TreeCache(
            page_size=runner.server_args.page_size or runner.page_size or 1,  # 0.5.23: resolved on the runner
            device=runner.device,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        ),
        model_config=runner.model_config,
        enable_overlap=False,
        spec_algorithm=spec_algorithm or SpeculativeAlgorithm.NONE,
    )


def worker_batch(batch):
    """What ``ForwardBatch.init_new`` takes: a ``ModelWorkerBatch`` (<= 0.5.12), the ``ScheduleBatch`` itself
    (0.5.13+).
    """
    return era().worker_batch(batch)


def forward_batch(batch, runner):
    """``ForwardBatch.init_new`` (sglang >= 0.5.16 requires ``return_hidden_states_before_norm``, which
    bench_one_batch passes as False)."""
    return era().forward_batch(batch, runner)


@dataclass
class Step:
    logits_output: Any
    next_token_ids: Any
    batch: Any


def prefill(runner, prompts: Sequence[Sequence[int]], *, return_hidden_states: bool = False) -> Step:
    import torch

    batch = schedule_batch(make_reqs(prompts, vocab_size=runner.model_config.vocab_size), runner)
    era().set_return_hidden_states(batch, return_hidden_states)
    batch.prepare_for_extend()
    fb = forward_batch(worker_batch(batch), runner)
    with torch.no_grad():
        out = runner.forward(fb).logits_output
        nxt = runner.sample(out, fb)
    return Step(out, nxt, batch)


def decode(runner, step: Step) -> Step:
    import torch

    batch = step.batch
    batch.output_ids = step.next_token_ids
    era().set_decode_inputs(batch, step.next_token_ids)
    batch.prepare_for_decode()
    fb = forward_batch(worker_batch(batch), runner)
    with torch.no_grad():
        out = runner.forward(fb).logits_output
        nxt = runner.sample(out, fb)
    return Step(out, nxt, batch)


def eagle_workers(sa, *, spec_v2: bool = False):
    """The real target ``TpModelWorker`` and ``EAGLEWorker`` as the scheduler builds them.

    ``spec_v2``: ``EAGLEWorkerV2`` (sglang's overlap-scheduler worker, the only one from 0.5.13 on) also
    on the releases that still have the v1 worker, which the CPU path (no overlap) uses otherwise."""
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.server_args import PortArgs

    eagle_worker_class = era().eagle_worker_class(spec_v2)
    port = PortArgs.init_new(sa).nccl_port
    if publish_process_config(sa, tp_rank=0, nccl_port=port):  # sglang >= 0.5.21, as Scheduler.__init__
        from sglang.srt.configs.model_config import ModelConfig

        init_layer_runtime(ModelConfig.from_server_args(sa))
    common = dict(gpu_id=0, tp_rank=0, moe_ep_rank=0, attn_cp_rank=0, moe_dp_rank=0, nccl_port=port, dp_rank=None)
    target = era().construct(TpModelWorker, server_args=sa, pp_rank=0, **common)
    draft = era().construct(eagle_worker_class, server_args=sa, target_worker=target, **common)
    era().finish_workers_init(target, draft)
    return target, draft


class UnsupportedHere(Exception):
    """What a harness function cannot recreate on this sglang release (a test skips with the message)."""


def capture_draft_extend_graphs_eagerly(eagle_worker):
    """sglang's real ``EAGLEDraftExtendCudaGraphRunner`` for an EAGLE worker, with only the CUDA graph
    calls replaced: every batch size of ``--cuda-graph-bs`` is "captured" by running sglang's own
    ``capture_one_batch_size`` (its static buffers, ``ForwardBatch`` and the draft's forward) eagerly,
    inside the runner's own ``__init__`` (``model_capture_mode`` and its error handling included).
    The v1 worker captures ``DRAFT_EXTEND``; ``EAGLEWorkerV2``'s draft worker ``DRAFT_EXTEND_V2``."""
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner,
    )

    seams = ("_create_graph", "_capture_init", "_capture_graph", "capture_one_batch_size")
    if not all(hasattr(EAGLEDraftExtendCudaGraphRunner, name) for name in seams):
        raise UnsupportedHere(
            "this sglang's draft-extend graph runner was rewritten (no capture_one_batch_size / _capture_graph to run "
            "eagerly); the CPU recreation drives the older runner (capture_one_batch_size), as sglang 0.5.9 - 0.5.15 "
            "have it"
        )

    class _Graph:
        def pool(self) -> None:
            return None

    class DraftExtendGraphRunnerOnCpu(EAGLEDraftExtendCudaGraphRunner):
        def _create_graph(self):
            return _Graph()

        def _capture_init(self, run_once_fn):
            run_once_fn()  # the warm-up run, without device synchronisation

        def _capture_graph(self, graph, pool, stream, run_once_fn):
            return run_once_fn()

        def capture(self) -> None:  # CudaGraphRunner.capture without graph_capture()'s CUDA stream
            self.stream = None
            for bs in reversed(self.capture_bs):
                self.graphs[bs], self.output_buffers[bs] = self.capture_one_batch_size(
                    bs, self.model_runner.model.forward
                )

    worker = eagle_worker.draft_worker if is_spec_v2(eagle_worker) else eagle_worker
    return DraftExtendGraphRunnerOnCpu(worker)


def draft_extend_buffer_width(runner) -> int:
    """The width of a draft-extend graph runner's static hidden-state buffer (0.5.13 keeps it in ``runner.buffers``)."""
    return getattr(runner, "buffers", runner).hidden_states.shape[-1]


def eagle_prefill_batch(target, prompts: Sequence[Sequence[int]], max_new_tokens: int = 8):
    """A speculative prefill ``ScheduleBatch`` of ``prompts``, prepared for extend (not run yet)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = target.model_runner
    algorithm = SpeculativeAlgorithm.from_string(runner.server_args.speculative_algorithm)
    reqs = make_reqs(prompts, max_new_tokens=max_new_tokens, vocab_size=runner.model_config.vocab_size)
    batch = schedule_batch(reqs, runner, algorithm)
    batch.prepare_for_extend()
    return batch


def eagle_prefill(target, draft, prompts: Sequence[Sequence[int]]):
    """One prefill batch through ``EAGLEWorker.forward_batch_generation`` (target extend + draft extend)."""
    import torch

    batch = eagle_prefill_batch(target, prompts)
    era().resolve_prefill_inputs(batch)
    with torch.no_grad():
        return draft.forward_batch_generation(batch), batch


def has_spec_v1_worker() -> bool:
    """The release still has the v1 ``EAGLEWorker`` (removed in sglang 0.5.13)."""
    return era().has_spec_v1_worker


def is_spec_v2(eagle_worker) -> bool:
    """The worker is sglang's ``EAGLEWorkerV2`` (the only EAGLE worker from sglang 0.5.13 on; the
    CPU path, without overlap, uses v1 up to 0.5.12)."""
    return type(eagle_worker).__name__ == "EAGLEWorkerV2"


def eagle_step(eagle_worker, batch):
    """One ``forward_batch_generation`` of a prefill (EXTEND) or decode batch, followed by the
    bookkeeping sglang's non-overlap scheduler does before the next step, so that the next
    ``batch.prepare_for_decode()`` sees what it would see in a server.  Every request's new tokens
    land in ``req.output_ids``.  Returns the worker's ``GenerationBatchResult``.

    * v1 ``EAGLEWorker`` (sglang <= 0.5.12): the worker keeps its draft input on the batch and its
      verify appends the accepted tokens to ``req.output_ids``; the scheduler appends the prefill's
      token and hands ``next_token_ids`` on as ``batch.output_ids``.
    * ``EAGLEWorkerV2`` (sglang >= 0.5.13): the worker's edits of the batch are transient; the
      scheduler runs it inside ``Scheduler._forward_isolation`` (fields restored afterwards,
      ``sampling_info`` replaced by ``copy_for_forward()``), then carries ``next_draft_input`` into
      ``batch.spec_info`` and ``new_seq_lens`` into ``batch.seq_lens``, clears ``input_ids``, and its
      result processor commits the accepted run (``_resolve_spec_v2_tokens`` advances
      ``kv_committed_len``, which the next step's KV allocation reads) and extends ``output_ids``.
      That is ``Scheduler.run_batch`` + ``process_batch_result_{prefill,decode}`` of 0.5.13 - 0.5.23.
    """
    import dataclasses

    import torch

    is_prefill = batch.forward_mode.is_extend()
    if not is_spec_v2(eagle_worker):
        with torch.no_grad():
            result = eagle_worker.forward_batch_generation(batch)
        if is_prefill:
            for req, tok in zip(batch.reqs, result.next_token_ids.tolist()):
                req.output_ids.append(tok)
        batch.output_ids = result.next_token_ids
        return result

    era().resolve_prefill_inputs(batch)  # resolve_forward_inputs (prefill)
    snapshot = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    if batch.sampling_info is not None:
        batch.sampling_info = batch.sampling_info.copy_for_forward()
    try:
        with torch.no_grad():
            result = eagle_worker.forward_batch_generation(batch)
    finally:
        for name, value in snapshot.items():
            setattr(batch, name, value)
    batch.spec_info = result.next_draft_input
    new_seq_lens = result.new_seq_lens  # a GenerationBatchResult field from 0.5.13, where this bookkeeping starts
    if new_seq_lens is not None and new_seq_lens is not batch.seq_lens:
        batch.seq_lens = new_seq_lens
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = new_seq_lens.to("cpu")
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    batch.input_ids = None  # rebuilt next step from the draft tokens
    if is_prefill:  # process_batch_result_prefill
        for req, tok in zip(batch.reqs, result.next_token_ids.tolist()):
            req.output_ids.append(tok)
    else:  # process_batch_result_decode
        for req, tokens in zip(batch.reqs, _resolve_spec_v2_tokens(eagle_worker, result, batch)):
            req.output_ids.extend(tokens)
    return result


class _NoMetrics:
    """The scheduler's metrics reporter, as far as ``_resolve_spec_v2_tokens`` uses it (0.5.23)."""

    def snapshot_spec_decode_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass


def _resolve_spec_v2_tokens(eagle_worker, result, batch) -> list[list[int]]:
    """The release's own ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens`` (sglang >= 0.5.13):
    the accepted run of each request, committed to ``req.kv_committed_len`` (0.5.13: ``+= accepted - 1``,
    0.5.15: ``+= accepted``, 0.5.23: ``req.kv.kv_committed_len``) and the spec counters.  It is called
    with a stand-in for the processor that holds the real worker; the processor's other methods it uses
    (``advance_grammar_fsm``, grammar helpers) are the real ones, bound to that stand-in."""
    import types

    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )

    class _Processor:
        model_worker = eagle_worker
        metrics_reporter = _NoMetrics()

        def __getattr__(self, name: str) -> Any:
            return types.MethodType(getattr(SchedulerBatchResultProcessor, name), self)

    return SchedulerBatchResultProcessor._resolve_spec_v2_tokens(_Processor(), result, batch)


def verify_entry_point(eagle_worker=None) -> tuple[Any, str]:
    """``(owner, attribute)`` of the function the EAGLE worker verifies a draft tree with, called as
    ``f(verify_input, batch, logits_output, ...)``.  Tests replace it to force the target to agree
    with the draft.  Where it lives follows the worker (``eagle_worker``; without one, the worker the
    CPU path builds: v1 where ``eagle_worker`` exists, else v2):

    * v1 ``EAGLEWorker`` (sglang <= 0.5.12 on CPU, overlap off): ``EagleVerifyInput.verify``;
    * ``EAGLEWorkerV2`` up to 0.5.13: ``verify_input.sample(batch, logits_output, vocab_mask)``, a method
      of ``EagleVerifyInputV2Mixin`` (``eagle_info_v2``); ``EagleVerifyInput.verify`` still exists in
      0.5.13 but only the v1 worker called it;
    * ``EAGLEWorkerV2`` 0.5.14 - 0.5.15: ``eagle_worker_v2.verify`` calls ``eagle_sample``, imported by
      name from ``eagle_utils`` into ``eagle_worker_v2``;
    * 0.5.16 on: ``eagle_worker_common`` calls ``eagle_sample`` (imported by name there).

    The release part is the era's (:meth:`.sglang_eras.V1Worker.v2_verify_entry_point`).
    """
    v2 = not has_spec_v1_worker() if eagle_worker is None else is_spec_v2(eagle_worker)
    if v2:
        return era().v2_verify_entry_point()
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    return EagleVerifyInput, "verify"


def accept_lengths(result) -> list[int]:
    """Accepted draft tokens per request of one EAGLE decode step's ``GenerationBatchResult``."""
    # 0.5.9 - 0.5.10: accept_length_per_req_cpu; 0.5.11: num_accepted_drafts_per_req_cpu; 0.5.12:
    # num_correct_drafts_per_req_cpu
    for name in ("accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu", "num_correct_drafts_per_req_cpu"):
        value = getattr(result, name, None)
        if value is not None:
            return [int(x) for x in value]
    return [int(x) - 1 for x in result.accept_lens.tolist()]  # v2 workers: accept_lens includes the bonus token


def record_fc_inputs(draft_worker) -> list[tuple[int, ...]]:
    """Forward hook on the draft's ``fc``: returns the list that collects its input shapes."""
    shapes: list[tuple[int, ...]] = []
    # EAGLEWorkerV2 -> EagleDraftWorker.draft_runner; the v1 EAGLEWorker's own draft_model_runner
    runner = draft_worker.draft_worker.draft_runner if is_spec_v2(draft_worker) else draft_worker.draft_model_runner
    fc = runner.model.model.fc
    fc.register_forward_hook(lambda mod, inp, out: shapes.append(tuple(inp[0].shape)))
    return shapes


def quiet() -> None:
    os.environ.setdefault("SGLANG_LOGGING_LEVEL", "WARNING")
    logging.getLogger("sglang").setLevel(logging.WARNING)


class LogSink(logging.Handler):
    """A logging handler that hands each record to ``sink`` (a list's ``append``, or a filter of the caller's)."""

    def __init__(self, sink: Callable[[logging.LogRecord], object], level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink(record)


def eagle3_log(level: int = logging.INFO) -> list[logging.LogRecord]:
    """The records the ``eagle3_patches`` logger emits at ``level`` or above from now on in this process, in a
    list that fills as they come (the logger's own level lowered to ``level``: sglang's server sets the root
    logger to INFO, a test's process does not)."""
    records: list[logging.LogRecord] = []
    handler = LogSink(records.append, level)
    log = logging.getLogger("eagle3_patches")
    log.addHandler(handler)
    log.setLevel(min(log.getEffectiveLevel(), level))
    return records


def set_server_arg(sa, name: str, value: Any) -> None:
    """Change a server argument for what this process runs next (a test switching drafts in one process).
    From sglang 0.5.16 resolved ``ServerArgs`` can refuse the write; there the resolved config is
    overridden instead, as sglang itself does (``get_context().override(source, ...)``), and patches read
    it with :func:`eagle3_patches.sglang_runtime.server_arg`."""
    era().set_server_arg(sa, name, value)


def load_drafts(target: str, drafts: Sequence[str | tuple[str, dict]], **overrides: Any) -> list[dict]:
    """Load each draft checkpoint into a real draft ``ModelRunner`` (pools shared with one target).
    A draft given as ``(path, {server arg: value})`` is loaded with those server arguments changed
    (e.g. ``speculative_draft_model_quantization``), as a server launched with them would load it.

    Returns, per draft, ``{"ok": True, "params": {name: tensor}, "loaded": {...}, "hot_token_id": ...}`` or
    ``{"ok": False, "type": exception class name, "message": str, "loaded": {...} or None}``.  ``params``
    are the parameters of the finished runner; ``loaded`` the parameters as ``load_weights`` left them
    (before the quantization method's ``process_weights_after_loading``), also when a later stage fails;
    ``loaders`` the weight loader each parameter carries after ``load_weights`` (its qualified name; None:
    sglang calls its ``default_weight_loader``), or None; ``log`` the eagle3_patches log messages of the load.
    """
    import sglang.srt.models.llama_eagle3 as llama_eagle3

    loaded: list[dict] = []
    klass = llama_eagle3.LlamaForCausalLMEagle3
    load_weights = klass.__dict__["load_weights"]  # the patched one when a patch is active
    log = eagle3_log()

    def loader_name(param) -> str | None:
        loader = getattr(param, "weight_loader", None)
        return None if loader is None else getattr(loader, "__qualname__", type(loader).__qualname__)

    def snapshot_after_load(self, weights):
        out = load_weights.__get__(self, type(self))(weights)
        loaded.append(
            {
                "params": {n: p.detach().clone() for n, p in self.named_parameters()},
                "loaders": {n: loader_name(p) for n, p in self.named_parameters()},
            }
        )
        return out

    klass.load_weights = snapshot_after_load
    pairs: list[tuple[Any, dict]] = [(d, {}) if isinstance(d, (str, os.PathLike)) else d for d in drafts]
    sa = eagle3_server_args(target, pairs[0][0], **overrides)
    tr = model_runner(sa)
    results = []
    for path, extra in pairs:
        args = {"speculative_draft_model_path": str(path), **extra}
        previous = {name: getattr(sa, name) for name in args}
        for name, value in args.items():
            set_server_arg(sa, name, value)
        loaded.clear()
        log.clear()

        def after_load() -> dict:
            return {
                "loaded": loaded[0]["params"] if loaded else None,
                "loaders": loaded[0]["loaders"] if loaded else None,
                "log": [r.getMessage() for r in log],
            }

        try:
            dr = draft_runner(sa, tr, model_path=str(path))
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results.append({"ok": False, "type": type(exc).__name__, "message": str(exc), **after_load()})
            continue
        finally:
            for name, value in previous.items():
                if name != "speculative_draft_model_path":
                    set_server_arg(sa, name, value)
        params = {n: p.detach().clone() for n, p in dr.model.named_parameters()}
        hot = dr.model.hot_token_id
        results.append(
            {"ok": True, "params": params, **after_load(), "hot_token_id": None if hot is None else hot.clone()}
        )
    klass.load_weights = load_weights
    return results


# --------------------------------------------------------------------------- prefill/decode disaggregation
class _Receiver:
    """The decode side's KV receiver once its transfer succeeded: ``_commit_transfer_to_req`` only clears it."""

    def clear(self) -> None:
        pass


def pd_commit(
    prefill_sa,
    decode_sa,
    *,
    stamped: bool = True,
    health_check: bool = False,
    first_token: int = 7,
    room: int = 4242,
    index: int = 1,
    polls: list | None = None,
) -> tuple:
    """One request's metadata row through sglang's real disaggregation buffers: the prefill side's
    ``MetadataBuffers.set_buf`` (``prefill_sa`` being the ServerArgs of its process: the patch's
    ``current_server_args`` answers them, as a prefill scheduler's process does), every buffer's row copied into
    the decode side's buffers as the transfer engine copies them (nothing with the ``fake`` backend), then the
    decode side's ``DecodeTransferQueue._commit_transfer_to_req`` (``decode_sa`` its scheduler's).
    ``stamped=False``: the row's columns past sglang's own zeroed after ``set_buf``, as a prefill process without
    eagle3-patches leaves them.  ``health_check``: the decode request is one of sglang's own (its health check or
    warm-up: the fake bootstrap host), for which nothing is transferred.  ``polls``: a slow transfer: the decode side
    commits once before the row's bytes arrive (its scheduler polls while the transfer is under way), and again after
    unless that first poll took the request off the queue; each commit's return value is appended to ``polls``.
    Returns the committed first token, the abort message (None when the request was committed) and the row's
    ``output_ids`` columns as sent."""
    import ctypes
    import inspect

    import torch
    from sglang.srt.disaggregation.decode import DecodeRequest, DecodeTransferQueue, MetadataBuffers
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from eagle3_patches.patches import disaggregation_fingerprint as fingerprint

    hidden = 64  # the tiny draft's hidden size (the row's hidden state)

    def request() -> Any:
        req = Req("pd", "", [1, 2, 3], SamplingParams(max_new_tokens=4), bootstrap_room=room)
        req.vocab_size = 1024  # the tiny target's (0.5.23's fake backend draws its first token from it)
        return req

    def algorithm(sa) -> Any:
        return SpeculativeAlgorithm.from_string(sa.speculative_algorithm)

    def buffers(sa) -> Any:
        # 0.5.23 sizes a sampling-mask buffer from the server's flag (``max_sampling_mask_tokens``)
        kw = {}
        if "max_sampling_mask_tokens" in inspect.signature(MetadataBuffers.__init__).parameters:
            kw["max_sampling_mask_tokens"] = int(getattr(sa, "sampling_mask_max_tokens", 0) or 0)
        return MetadataBuffers(4, hidden, torch.float32, **kw)

    sent = buffers(prefill_sa)
    req = request()
    req.output_ids, req.metadata_buffer_index = [first_token], index
    if not algorithm(prefill_sa).is_none():
        req.hidden_states_tensor = torch.full((hidden,), 0.5)
        req.output_topk_p, req.output_topk_index = torch.tensor([0.9]), torch.tensor([first_token])
    own = fingerprint.current_server_args
    fingerprint.current_server_args = lambda: prefill_sa
    try:
        sent.set_buf(req)
    finally:
        fingerprint.current_server_args = own
    if not stamped:
        sent.output_ids[index, 1:] = 0
    received = buffers(decode_sa)

    def transfer() -> None:
        # what the transfer engine does: each buffer's row, byte for byte, at the addresses sglang registers
        src, _, item_lens = sent.get_buf_infos()[:3]
        dst = received.get_buf_infos()[0]
        for s, d, n in zip(src, dst, item_lens, strict=True):
            ctypes.memmove(d + index * n, s + index * n, n)

    transferred = decode_sa.disaggregation_transfer_backend != "fake" and not health_check
    if transferred and polls is None:
        transfer()
    era().publish_server_args(decode_sa)  # the decode scheduler's process config (0.5.19+ reads it from there)
    queue = DecodeTransferQueue.__new__(DecodeTransferQueue)
    queue.metadata_buffers = received
    # the scheduler's parts the commit reads: its flags, no KV checksum, the reasoning-token count of 0.5.23 (none
    # here: the tiny target has no reasoning parser)
    queue.scheduler = SimpleNamespace(
        server_args=decode_sa,
        kv_checksum_computer=None,
        batch_result_processor=SimpleNamespace(_maybe_update_reasoning_tokens=lambda req, token: None),
    )
    queue.spec_algorithm = algorithm(decode_sa)
    decode_req = DecodeRequest(req=request(), kv_receiver=_Receiver(), metadata_buffer_index=index)
    if health_check:
        from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

        decode_req.req.bootstrap_host = FAKE_BOOTSTRAP_HOST
    if polls is not None:
        polls.append(queue._commit_transfer_to_req(decode_req))  # the row not there yet
        if transferred:
            transfer()
    if polls is None or polls[0] is False:
        result = queue._commit_transfer_to_req(decode_req)
        if polls is not None:
            polls.append(result)
    r = decode_req.req
    reason = r.finished_reason
    message = getattr(reason, "message", None) if reason else None
    return r.output_ids[-1] if r.output_ids else None, message, sent.output_ids[index].tolist()
