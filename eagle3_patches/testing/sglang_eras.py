"""sglang's API eras, as the test harness (:mod:`.sglang_harness`) meets them: one adapter per era.

Each era is a class that subclasses the era before it and overrides only what changed.  The era of
the installed sglang is chosen once per process (:func:`current`): the newest era whose ``probe()``
finds the API that opened it.  Probes look at sglang's own API (a module, a method, a field, a
constructor parameter), never at its version number; ``first`` (the first release of the era) is
documentation, and what the test of the choice compares the probe with
(``tests/sglang/test_sglang_eras.py``).

The boundaries were read in the released wheels of 0.5.9 - 0.5.23 (post releases included: each
is in its base release's era).  Which releases the harness's tests run on is the release matrix's
(``tools/matrix.py``, docs/compat.md), not recorded here.

====================  ===============  ===============================================================
era                   releases         what differs from the era before
====================  ===============  ===============================================================
``V1Worker``          0.5.9            (the first) the v1 ``EAGLEWorker`` (``EAGLEWorkerV2`` on
                                       request); ``ForwardBatch.init_new`` takes
                                       ``get_model_worker_batch()``; ``req.fill_ids``;
                                       ``ModelRunner.__init__`` builds everything; ``EAGLEWorkerV2``
                                       verifies via ``EagleVerifyInputV2Mixin.sample``
``DraftPoolConfig``   0.5.10 - 0.5.12  a draft ``ModelRunner`` takes the target's
                                       ``memory_pool_config``
``SpecV2Only``        0.5.13           only ``EAGLEWorkerV2``; ``init_new`` takes the
                                       ``ScheduleBatch``, whose prefill ids wait in
                                       ``prefill_input_ids_cpu`` and whose decode ids the caller
                                       sets; ``full_untruncated_fill_ids`` and ``fill_len``
``StagedInit``        0.5.14           ``ModelRunner`` / ``TpModelWorker`` / EAGLE worker built in
                                       stages (``alloc_memory_pool``, ``init_attention_backends``,
                                       ``init_cuda_graphs``); verify via
                                       ``eagle_worker_v2.eagle_sample``
``ExtendRange``       0.5.15           ``req.set_extend_range`` (``fill_len`` gone)
``ContextRanks``      0.5.16           the constructors take the ranks as one ``ps`` (``ParallelState``,
                                       built by the scheduler); ``init_new``
                                       needs ``return_hidden_states_before_norm``; verify via
                                       ``eagle_worker_common.eagle_sample``; ``ServerArgs`` can
                                       refuse a write (always from 0.5.17): ``get_context().override``
``HiddenStatesMode``  0.5.17 - 0.5.18  ``ScheduleBatch.return_hidden_states_mode``; the scheduler
                                       process ``publish``-es its ``ServerArgs`` (``runtime_context``)
``ResolveOnce``       0.5.19 - 0.5.20  ``ServerArgs.resolve_once()`` resolves (the launcher calls it);
                                       ``ModelRunner`` publishes nothing
``PublishedRuntime``  0.5.21           the scheduler process ``publish``-es its config and starts
                                       the parallel and layer runtimes itself; no ``ps`` (the
                                       constructors read the published runtime)
``ExtendEnd``         0.5.22 - 0.5.23  ``req.extend_end`` (``set_extend_range`` gone)
====================  ===============  ===============================================================

Detected by (each era's ``probe``): ``DraftPoolConfig`` a ``memory_pool_config`` parameter of
``ModelRunner.__init__``; ``SpecV2Only`` no ``ScheduleBatch.get_model_worker_batch``; ``StagedInit``
``ModelRunner.alloc_memory_pool``; ``ExtendRange`` ``Req.set_extend_range``; ``ContextRanks`` the
module ``speculative.eagle_worker_common``; ``HiddenStatesMode`` the ``ScheduleBatch`` field;
``ResolveOnce`` ``ServerArgs.resolve_once``; ``PublishedRuntime``
``distributed.bootstrap.init_parallel_runtime`` (the module exists from 0.5.16, the function from
0.5.21); ``ExtendEnd`` ``Req.extend_len``.

Nothing here imports sglang at module level; probes and methods import what they use.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any


def _has(module: str, owner: str | None, attribute: str) -> bool:
    """sglang's ``module.owner`` (or the module itself) has ``attribute``; False where the module is missing."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    return hasattr(getattr(found, owner) if owner else found, attribute)


_SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner"


def _untruncated_fill_ids(req) -> None:
    from array import array

    req.full_untruncated_fill_ids = array("q", req.origin_input_ids)


class V1Worker:
    """sglang 0.5.9: the v1 ``EAGLEWorker`` and ``ModelWorkerBatch`` era."""

    first = "0.5.9"

    @staticmethod
    def probe() -> bool:
        return True

    # -- workers and runners -------------------------------------------------------------------
    has_spec_v1_worker = True

    def construct(self, cls, **kwargs: Any):
        """``cls(**kwargs)`` for ``ModelRunner`` / ``TpModelWorker`` / the EAGLE workers."""
        return cls(**kwargs)

    def draft_runner_kwargs(self, target_runner) -> dict:
        """What a draft ``ModelRunner`` takes from the target runner built before it."""
        return {}

    def finish_runner_init(self, runner, is_draft: bool) -> None:
        """What the caller of ``ModelRunner(...)`` does before the runner can run (nothing here)."""

    def finish_workers_init(self, target, draft) -> None:
        """What the scheduler does after it constructs the target and EAGLE workers (nothing here)."""

    def eagle_worker_class(self, spec_v2: bool):
        if spec_v2:
            from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

            return EAGLEWorkerV2
        from sglang.srt.speculative.eagle_worker import EAGLEWorker

        return EAGLEWorker

    def v2_verify_entry_point(self) -> tuple[Any, str]:
        """Where ``EAGLEWorkerV2`` samples a verified draft tree."""
        from sglang.srt.speculative.eagle_info_v2 import EagleVerifyInputV2Mixin

        return EagleVerifyInputV2Mixin, "sample"

    # -- server args and process config --------------------------------------------------------
    def resolve_server_args(self, sa) -> None:
        """What the launcher does to ``ServerArgs`` before it starts a rank (``__post_init__`` did it)."""

    def set_server_arg(self, sa, name: str, value: Any) -> None:
        setattr(sa, name, value)

    def resolved(self, sa) -> Any:
        """What resolved ``ServerArgs`` hold, field by field (the record itself: resolution wrote its fields)."""
        return sa

    def publish_process_config(self, sa, *, tp_rank: int, nccl_port: int) -> bool:
        """What the scheduler process does before it builds a worker; False: ``ModelRunner`` does it."""
        return False

    def init_layer_runtime(self, model_config) -> None:
        """The scheduler's per-model layer set-up; inside ``ModelRunner`` here."""

    def publish_server_args(self, sa) -> None:
        """The ``ServerArgs`` as a scheduler process publishes them, without its parallel runtime (what code that
        reads the published config needs, e.g. the disaggregation queues); nothing to publish here."""

    # -- batches -------------------------------------------------------------------------------
    def init_req(self, req) -> None:
        """A new ``Req``'s extend range, as the release's one-batch benchmark sets it (nothing cached)."""
        req.fill_ids = req.origin_input_ids
        req.set_extend_input_len(len(req.origin_input_ids) - len(req.prefix_indices))

    def set_return_hidden_states(self, batch, on: bool) -> None:
        batch.return_hidden_states = on

    def resolve_prefill_inputs(self, batch) -> None:
        """The prefill's ``input_ids`` on the device, where the scheduler moves them late (not here)."""

    def set_decode_inputs(self, batch, next_token_ids) -> None:
        """The decode step's ``input_ids``: ``prepare_for_decode`` takes them from ``output_ids`` here."""

    def worker_batch(self, batch):
        """What ``ForwardBatch.init_new`` takes."""
        return batch.get_model_worker_batch()

    def forward_batch(self, batch, runner):
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        return ForwardBatch.init_new(batch, runner)


class DraftPoolConfig(V1Worker):
    """sglang 0.5.10 - 0.5.12: a draft ``ModelRunner`` takes the target's ``memory_pool_config``."""

    first = "0.5.10"

    @staticmethod
    def probe() -> bool:
        import inspect

        from sglang.srt.model_executor.model_runner import ModelRunner

        return "memory_pool_config" in inspect.signature(ModelRunner.__init__).parameters

    def draft_runner_kwargs(self, target_runner) -> dict:
        return {"memory_pool_config": target_runner.memory_pool_config}


class SpecV2Only(DraftPoolConfig):
    """sglang 0.5.13: only ``EAGLEWorkerV2``; the ``ScheduleBatch`` goes to ``ForwardBatch.init_new``."""

    first = "0.5.13"

    @staticmethod
    def probe() -> bool:
        return not _has(_SCHEDULE_BATCH, "ScheduleBatch", "get_model_worker_batch")

    has_spec_v1_worker = False

    def eagle_worker_class(self, spec_v2: bool):
        return super().eagle_worker_class(spec_v2=True)

    def init_req(self, req) -> None:
        _untruncated_fill_ids(req)
        req.fill_len = len(req.origin_input_ids)
        super().init_req(req)

    def resolve_prefill_inputs(self, batch) -> None:  # the scheduler's resolve_forward_inputs
        if batch.input_ids is None and batch.prefill_input_ids_cpu is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
            batch.prefill_input_ids_cpu = None

    def set_decode_inputs(self, batch, next_token_ids) -> None:  # as bench_one_batch.decode
        import torch

        batch.input_ids = next_token_ids.to(torch.int64)

    def worker_batch(self, batch):
        self.resolve_prefill_inputs(batch)
        return batch


class StagedInit(SpecV2Only):
    """sglang 0.5.14: runners and workers built in stages; ``eagle_sample`` in ``eagle_worker_v2``."""

    first = "0.5.14"

    @staticmethod
    def probe() -> bool:
        return _has(_MODEL_RUNNER, "ModelRunner", "alloc_memory_pool")

    def finish_runner_init(self, runner, is_draft: bool) -> None:
        """The constructor loads the weights; the caller (scheduler, bench_one_batch) allocates the
        pools, the attention backends (which also set the EAGLE-3 capture layers) and the graphs."""
        runner.alloc_memory_pool(runner.memory_pool_config)
        runner.init_attention_backends()
        if is_draft:
            runner.init_cuda_graphs(capture_decode_cuda_graph=False)  # as base_spec_worker.init_cuda_graphs
        else:
            runner.init_cuda_graphs()

    def finish_workers_init(self, target, draft) -> None:  # as Scheduler.init_model_worker
        mr = target.model_runner
        if mr.memory_pool_config is None or mr.req_to_token_pool is None or mr.token_to_kv_pool_allocator is None:
            target.alloc_memory_pool()
        pool, allocator = target.get_memory_pool()
        draft.alloc_memory_pool(
            memory_pool_config=mr.memory_pool_config, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator
        )
        target.init_attention_backends()
        draft.init_attention_backends()
        target.init_cuda_graphs()
        draft.init_cuda_graphs()

    def v2_verify_entry_point(self) -> tuple[Any, str]:  # eagle_worker_v2.verify calls it by name
        return importlib.import_module("sglang.srt.speculative.eagle_worker_v2"), "eagle_sample"


class ExtendRange(StagedInit):
    """sglang 0.5.15: ``req.set_extend_range``."""

    first = "0.5.15"

    @staticmethod
    def probe() -> bool:
        return _has(_SCHEDULE_BATCH, "Req", "set_extend_range")

    def init_req(self, req) -> None:  # as its benchmark/one_batch.py
        _untruncated_fill_ids(req)
        req.set_extend_range(len(req.prefix_indices), len(req.origin_input_ids))


#: constructor arguments that sglang 0.5.16 folded into ``ps`` and 0.5.21 dropped (the runtime context has them)
RANK_ARGUMENTS = frozenset(
    {"tp_rank", "tp_size", "pp_rank", "pp_size", "moe_ep_rank", "moe_ep_size", "attn_cp_rank", "moe_dp_rank", "dp_rank"}
)


class ContextRanks(ExtendRange):
    """sglang 0.5.16: the ranks travel as one ``ps``; ``eagle_worker_common``; ``ServerArgs`` guards writes."""

    first = "0.5.16"

    @staticmethod
    def probe() -> bool:
        return importlib.util.find_spec("sglang.srt.speculative.eagle_worker_common") is not None

    def construct(self, cls, **kwargs: Any):
        """The rank arguments become the ``ps`` (``ParallelState``) the scheduler builds from them and the
        server arguments (``Scheduler.__init__``); ``ModelRunner``, ``TpModelWorker`` and ``EAGLEWorkerV2``
        take it, by that name, up to 0.5.20."""
        ranks = {k: kwargs.pop(k) for k in list(kwargs) if k in RANK_ARGUMENTS}
        return super().construct(
            cls, ps=self._parallel_state(kwargs["server_args"], ranks, kwargs.get("gpu_id", 0)), **kwargs
        )

    @staticmethod
    def _parallel_state(sa, ranks: dict, gpu_id: int):
        """As ``Scheduler.__init__`` builds it; its fields vary (0.5.18 has ``attn_dcp_rank`` / ``attn_dcp_size``
        for 0.5.16's ``dcp_size``): every field of the installed ``ParallelState`` is filled, a new one fails
        loudly here (KeyError naming it)."""
        import dataclasses

        from sglang.srt.distributed.parallel_state_wrapper import ParallelState
        from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

        tp_rank = ranks.get("tp_rank", 0)
        attn_tp_rank, attn_tp_size, attn_dp_rank, attn_dp_size = compute_dp_attention_world_info(
            sa.enable_dp_attention, tp_rank, sa.tp_size, sa.dp_size, sa.attn_cp_size
        )
        values = dict(
            tp_rank=tp_rank,
            tp_size=sa.tp_size,
            pp_rank=ranks.get("pp_rank", 0),
            pp_size=sa.pp_size,
            dp_rank=ranks.get("dp_rank"),
            dp_size=sa.dp_size,
            attn_tp_rank=attn_tp_rank,
            attn_tp_size=attn_tp_size,
            attn_cp_rank=ranks.get("attn_cp_rank", 0),
            attn_cp_size=sa.attn_cp_size,
            attn_dcp_rank=tp_rank % sa.dcp_size,
            attn_dcp_size=sa.dcp_size,
            dcp_size=sa.dcp_size,
            attn_dp_rank=attn_dp_rank,
            attn_dp_size=attn_dp_size,
            moe_ep_rank=ranks.get("moe_ep_rank", 0),
            moe_ep_size=sa.ep_size,
            moe_dp_rank=ranks.get("moe_dp_rank", 0),
            moe_dp_size=sa.moe_dp_size,
            gpu_id=gpu_id,
        )
        return ParallelState(**{f.name: values[f.name] for f in dataclasses.fields(ParallelState)})

    def v2_verify_entry_point(self) -> tuple[Any, str]:  # eagle_worker_common calls it by name
        return importlib.import_module("sglang.srt.speculative.eagle_worker_common"), "eagle_sample"

    def set_server_arg(self, sa, name: str, value: Any) -> None:
        """Resolved ``ServerArgs`` refuse writes (0.5.16 under ``SGLANG_STRICT_CONFIG_MUTATION``, always
        from 0.5.17); the resolved config is overridden instead, as sglang itself does, and patches read it
        with :func:`eagle3_patches.sglang_runtime.server_arg`."""
        try:
            super().set_server_arg(sa, name, value)
        except AttributeError:
            from sglang.srt.runtime_context import get_context

            get_context().override("eagle3_patches.testing", **{name: value})

    def forward_batch(self, batch, runner):  # bench_one_batch passes False
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        return ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)


class HiddenStatesMode(ContextRanks):
    """sglang 0.5.17 - 0.5.18: a hidden-states mode per batch; the scheduler process publishes its config."""

    first = "0.5.17"

    @staticmethod
    def probe() -> bool:
        import dataclasses

        from sglang.srt.managers.schedule_batch import ScheduleBatch

        return "return_hidden_states_mode" in {f.name for f in dataclasses.fields(ScheduleBatch)}

    def set_return_hidden_states(self, batch, on: bool) -> None:
        super().set_return_hidden_states(batch, on)
        if on:
            from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

            batch.return_hidden_states_mode = CaptureHiddenMode.FULL

    def publish_process_config(self, sa, *, tp_rank: int, nccl_port: int) -> bool:
        """``run_scheduler_process`` publishes the ``ServerArgs`` for the ``scheduler`` role (``publish``
        resolves them) before the worker reads its config; from 0.5.19 ``ModelRunner`` no longer
        publishes at all (0.5.16 - 0.5.18 call ``set_global_server_args_for_scheduler`` in its constructor)."""
        from sglang.srt.runtime_context import publish

        publish(sa, role="scheduler")
        return True


class ResolveOnce(HiddenStatesMode):
    """sglang 0.5.19 - 0.5.20: ``ServerArgs.resolve_once()`` resolves (the constructor does not)."""

    first = "0.5.19"

    @staticmethod
    def probe() -> bool:
        return _has("sglang.srt.server_args", "ServerArgs", "resolve_once")

    def resolve_server_args(self, sa) -> None:
        sa.resolve_once()

    def resolved(self, sa) -> Any:
        """Resolution declares its decisions next to the fields it leaves as given: read them through sglang's view
        (``srt/arg_groups/overrides.py``: ``resolved_view``)."""
        from sglang.srt.arg_groups.overrides import resolved_view

        return resolved_view(sa)

    def publish_server_args(self, sa) -> None:
        """From 0.5.19 the disaggregation queues read the transfer backend from the published config
        (``disaggregation/utils.py``: ``_is_fake_transfer`` calls ``get_disagg()``; 0.5.17 - 0.5.18 take the
        scheduler's ``server_args``): publish them as ``run_scheduler_process`` does (``publish`` resolves them)."""
        from sglang.srt.runtime_context import publish

        publish(sa, role="scheduler")


class PublishedRuntime(ResolveOnce):
    """sglang 0.5.21: the scheduler process publishes its config and starts the runtimes itself."""

    first = "0.5.21"

    @staticmethod
    def probe() -> bool:  # 0.5.16 - 0.5.20 have the module, without the function
        return _has("sglang.srt.distributed.bootstrap", None, "init_parallel_runtime")

    def construct(self, cls, **kwargs: Any):  # no ``ps``: the constructors read the published runtime
        return V1Worker.construct(self, cls, **{k: v for k, v in kwargs.items() if k not in RANK_ARGUMENTS})

    def publish_process_config(self, sa, *, tp_rank: int, nccl_port: int) -> bool:
        """``run_scheduler_process`` / ``bench_one_batch``: resolve the ``ServerArgs``, ``publish`` them for
        the ``scheduler`` role with the process placement, set the process-global GEMM / MoE configs and
        start the parallel runtime (process groups)."""
        from sglang.srt.distributed import bootstrap
        from sglang.srt.runtime_context import (
            SpawnRanks,
            get_device,
            publish,
            spawn_world_rank,
        )

        self.resolve_server_args(sa)
        publish(
            sa,
            role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(sa, tp_rank=tp_rank, pp_rank=0), gpu_id=0),
        )
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
        from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config

        initialize_moe_config()
        initialize_fp8_gemm_config()
        initialize_bf16_gemm_config()
        initialize_fp4_gemm_config()
        bootstrap.init_parallel_runtime(server_args=sa, device=get_device().device, dist_port=nccl_port)
        return True

    def init_layer_runtime(self, model_config) -> None:
        from sglang.srt.distributed import bootstrap

        bootstrap.init_layer_runtime(model_config=model_config)

    def publish_server_args(self, sa) -> None:
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

        self.resolve_server_args(sa)
        publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=spawn_world_rank(sa, tp_rank=0, pp_rank=0), gpu_id=0))


class ExtendEnd(PublishedRuntime):
    """sglang 0.5.22 - 0.5.23: ``req.extend_end`` replaces ``set_extend_range``."""

    first = "0.5.22"

    @staticmethod
    def probe() -> bool:
        return _has(_SCHEDULE_BATCH, "Req", "extend_len")

    def init_req(self, req) -> None:  # as its benchmark/one_batch.py
        _untruncated_fill_ids(req)
        req.extend_end = len(req.origin_input_ids)


#: every era, oldest first
ERAS: tuple[type[V1Worker], ...] = (
    V1Worker,
    DraftPoolConfig,
    SpecV2Only,
    StagedInit,
    ExtendRange,
    ContextRanks,
    HiddenStatesMode,
    ResolveOnce,
    PublishedRuntime,
    ExtendEnd,
)


def detect() -> type[V1Worker]:
    """The newest era whose probe holds for the installed sglang (imports sglang)."""
    return next(era for era in reversed(ERAS) if era.probe())


@functools.cache
def current() -> V1Worker:
    """The adapter of the installed sglang's era, chosen once per process."""
    return detect()()


__all__ = ["ERAS", "RANK_ARGUMENTS", "current", "detect"] + [era.__name__ for era in ERAS]
