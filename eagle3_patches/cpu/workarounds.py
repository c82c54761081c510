"""CPU-only behaviour fixes that let real sglang 0.5.9 model code run without a GPU.

They are not part of the EAGLE-3 patch set: they live in their own registry,
applied only by :func:`eagle3_patches.cpu.activate`.  Each is the smallest change
that lets the CPU path run; facts in ``docs/cpu-profile.md``.
"""

from __future__ import annotations

import contextlib
import os
from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..registry import NotApplicable, Patch, Registry, Saver, expect_attr, expect_source
from ..sglang_runtime import server_arg


class TorchNativeMlaDispatch(Patch):
    name = "cpu_torch_native_mla_dispatch"
    summary = "register torch_native -> MLA in DeepSeek's attention dispatch (0.5.9 falls back to triton's MHA)"
    module = "sglang.srt.models.deepseek_common.attention_backend_handler"
    applies_to = SpecifierSet(">=0.5.9")

    def upstream(self, module: ModuleType) -> str | None:
        if "torch_native" in module.AttentionBackendRegistry._handlers:
            return "a torch_native handler is registered already"
        return None

    def check(self, module: ModuleType) -> None:
        expect_attr(module.AttentionBackendRegistry, "_handlers")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
            AttnForwardMethod,
        )

        handlers = dict(module.AttentionBackendRegistry._handlers)
        handlers["torch_native"] = lambda attn, forward_batch: AttnForwardMethod.MLA
        saver.set(module.AttentionBackendRegistry, "_handlers", handlers)


class SkipTritonKvCopyWarmup(Patch):
    name = "cpu_skip_kv_copy_warmup"
    summary = "skip MHATokenToKVPool's Triton KV-copy warm-up (no GPU driver; nothing to warm up)"
    module = "sglang.srt.mem_cache.memory_pool"
    applies_to = SpecifierSet(">=0.5.9")

    def check(self, module: ModuleType) -> None:
        expect_attr(module.MHATokenToKVPool, "_init_kv_copy_and_warmup")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        def no_warmup(wrapped, instance, args, kwargs):
            instance._kv_copy_config = None

        saver.wrap(module.MHATokenToKVPool, "_init_kv_copy_and_warmup", no_warmup)


@contextlib.contextmanager
def _cuda_sync_noop():
    import torch

    original = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *a, **k: None
    try:
        yield
    finally:
        torch.cuda.synchronize = original


def _without_cuda_sync(wrapped, instance, args, kwargs):
    with _cuda_sync_noop():
        return wrapped(*args, **kwargs)


class NoCudaSyncInSetEmbed(Patch):
    """A draft class's ``set_embed`` / ``set_embed_and_head`` end in ``torch.cuda.synchronize()``: a no-op on CPU.
    The Llama draft's (``LlamaForCausalLM``'s, every release) and the MLA draft's (``Eagle3DeepseekV2ForCausalLM``,
    0.5.12+)."""

    def __init__(self, name: str, module: str, cls: str, applies_to: str) -> None:
        self.name, self.module, self.cls, self.applies_to = name, module, cls, SpecifierSet(applies_to)
        self.summary = f"{cls}.set_embed / set_embed_and_head end in torch.cuda.synchronize(); a no-op on CPU"

    def check(self, module: ModuleType) -> None:
        for attr in ("set_embed", "set_embed_and_head"):
            expect_source(expect_attr(getattr(module, self.cls), attr), "torch.cuda.synchronize()")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        for attr in ("set_embed", "set_embed_and_head"):
            saver.wrap(getattr(module, self.cls), attr, _without_cuda_sync)


def split_cpus(cpus: list[int], ranks: int) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``ranks`` TP ranks over ``cpus``: contiguous groups, "0|1" for 2 on 2."""
    cpus = sorted(cpus)
    if ranks <= len(cpus):
        size = len(cpus) // ranks
        groups = [cpus[r * size : (r + 1) * size] for r in range(ranks)]
    else:  # more ranks than cores: share them round-robin
        groups = [[cpus[r % len(cpus)]] for r in range(ranks)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def _bind_threads_per_rank(wrapped, instance, args, kwargs):
    if not os.environ.get("SGLANG_CPU_OMP_THREADS_BIND") and instance.tp_size > 1:
        os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = split_cpus(list(os.sched_getaffinity(0)), instance.tp_size)
    return wrapped(*args, **kwargs)


class TpThreadBinding(Patch):
    name = "cpu_tp_thread_binding"
    summary = "TP > 1 on CPU: bind each rank to its share of the cores (sglang asserts tp_size <= NUMA nodes)"
    module = "sglang.srt.model_executor.model_runner"
    applies_to = SpecifierSet(">=0.5.9")

    def check(self, module: ModuleType) -> None:
        expect_source(expect_attr(module.ModelRunner, "init_threads_binding"), "SGLANG_CPU_OMP_THREADS_BIND")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ModelRunner, "init_threads_binding", _bind_threads_per_rank)


def _attention_backends() -> set[str] | None:
    """The attention backends the server was configured with (for both phases, prefill, decode); None
    where this process has no server arguments to read (a worker built outside a server)."""
    try:
        names = {server_arg(a) for a in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")}
    except (AttributeError, LookupError, RuntimeError, ValueError):  # nothing published in this process
        return None
    return {n for n in names if n} or None


class TreeMaskModeForBackend(Patch):
    """From 0.5.16 sglang builds the target-verify tree mask on CPU as QLEN_ONLY (``n x n`` a request),
    the layout of its ``intel_amx`` verify kernel (``eagle_utils.default_tree_mask_mode``).  The
    ``triton`` backend (the CPU profile's, run by Triton's interpreter) reads FULL_MASK, ``seq_len + n``
    columns a row (``triton_backend``'s ``mask_indptr``): handed the short mask, verify attends through
    the wrong bits, and greedy EAGLE3 outputs differ from the server without speculation with no error.
    Here the mode is FULL_MASK unless ``intel_amx`` is one of the configured attention backends (or no
    server arguments can be read: sglang's choice is kept).  The workers bind the function by name when
    they import ``eagle_utils``, after this patch (``imported_by`` covers one imported before)."""

    name = "cpu_tree_mask_mode"
    summary = "verify tree mask in the layout of the attention backend in use (0.5.16+ on CPU assumes intel_amx)"
    module = "sglang.srt.speculative.eagle_utils"
    applies_to = SpecifierSet(">=0.5.16")

    def check(self, module: ModuleType) -> None:
        expect_source(expect_attr(module, "default_tree_mask_mode"), "QLEN_ONLY if _is_cpu")
        if not getattr(module, "_is_cpu", False):
            raise NotApplicable("eagle_utils does not take its CPU branch (SGLANG_USE_CPU_ENGINE is not 1)")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        original, modes = module.default_tree_mask_mode, module.TreeMaskMode

        def default_tree_mask_mode():
            mode = original()
            backends = _attention_backends()
            if mode == modes.QLEN_ONLY and backends is not None and "intel_amx" not in backends:
                return modes.FULL_MASK
            return mode

        default_tree_mask_mode.__doc__ = (
            f"{original.__module__}.default_tree_mask_mode, FULL_MASK unless intel_amx serves verify"
            " (eagle3-patches CPU profile)."
        )
        saver.set(module, "default_tree_mask_mode", default_tree_mask_mode, imported_by="sglang.")


class MooncakeHostTensorIndices(Patch):
    """A prefill server's mooncake sender (``supports_host_tensor_indices``, newer releases) stages the request's KV
    indices in pinned host memory and records a ``torch.cuda.Event`` for them (``disaggregation/prefill.py``):
    ``pin_memory=True`` raises on a machine without an accelerator.  With the flag off the prefill takes its
    other branch, the indices as a NumPy array on the host, which mooncake's TCP transport sends as well."""

    name = "cpu_mooncake_host_tensor_indices"
    summary = "the mooncake prefill sender's KV indices as a host array (pinned memory needs an accelerator)"
    module = "sglang.srt.disaggregation.mooncake.conn"
    applies_to = SpecifierSet(">=0.5.9")

    def check(self, module: ModuleType) -> None:
        expect_attr(expect_attr(module, "MooncakeKVSender"), "supports_host_tensor_indices")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.set(module.MooncakeKVSender, "supports_host_tensor_indices", False)


class TritonInterpreterLanguageOnce(Patch):
    """Triton's interpreter (the CPU profile runs every Triton kernel in it) re-applies its patch of
    ``triton.language`` at every kernel launch and at every call of a device function inside a program
    (``_patch_lang``: an ``inspect.getmembers`` scan of four modules).  What it patches is decided by the function's
    module alone (which of the global ``tl`` and ``tl.core`` modules its globals name), always with the one
    interpreter builder, and nothing restores it: every call after the first for a module changes nothing.
    py-spy on the scheduler of the tiny Kimi-K2.5's EAGLE3 server verifying a 48-sequence batch put about a third
    of its time in those repeats; here they run once a module of kernels."""

    name = "cpu_triton_interpreter_patch_lang_once"
    summary = "Triton's interpreter patches triton.language once a kernel module, not at every launch and device call"
    module = "triton.runtime.interpreter"
    applies_to = SpecifierSet(">=0.5.9")

    def check(self, module: ModuleType) -> None:
        # what the skip rests on: the modules patched are read from the function's globals, the builder is global
        expect_source(expect_attr(module, "_patch_lang"), "fn.__globals__", "value in [tl, tl.core]")
        expect_attr(module, "interpreter_builder")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        original = module._patch_lang
        done: dict[int, dict] = {}  # id -> the globals themselves, held so that an id is never reused

        def _patch_lang(fn):
            key = id(fn.__globals__)
            if key not in done:
                original(fn)
                done[key] = fn.__globals__

        saver.set(module, "_patch_lang", _patch_lang)


def build_registry() -> Registry:
    from .cache_loc_ops import build_patches as cache_loc_ops
    from .spec_kernels import CpuSpecKernels
    from .spec_sampling import CpuSpecSampling

    return Registry(
        "cpu-profile",
        [
            TorchNativeMlaDispatch(),
            SkipTritonKvCopyWarmup(),
            NoCudaSyncInSetEmbed(
                "cpu_no_cuda_sync_in_set_embed", "sglang.srt.models.llama", "LlamaForCausalLM", ">=0.5.9"
            ),
            NoCudaSyncInSetEmbed(
                "cpu_no_cuda_sync_in_mla_draft_set_embed",
                "sglang.srt.models.kimi_k25_eagle3",
                "Eagle3DeepseekV2ForCausalLM",
                ">=0.5.12",
            ),
            TpThreadBinding(),
            CpuSpecKernels(),
            CpuSpecSampling(),
            TreeMaskModeForBackend(),
            MooncakeHostTensorIndices(),
            TritonInterpreterLanguageOnce(),
            # KV-slot ops of the EAGLE decode loop: 0.5.13 - 0.5.15's assign_extend_cache_locs_func has no CPU
            # branch (returns None); 0.5.16 on calls sgl_kernel CPU-build ops the stand-ins cannot serve
            *cache_loc_ops(),
        ],
    )


__all__ = ["build_registry", "NotApplicable"]
