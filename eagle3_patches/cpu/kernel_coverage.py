"""How the CPU profile serves each accelerator-only name sglang's speculative path can reach on CPU, per release.

The names, and where each release reaches them, are data read from the releases' own source
(``tests/data/kernel_symbols.json``, written by ``python tools/kernel_symbols.py --write``; its docstring says what
counts as a name and as a site).  A site is *live* (CPU may reach it) or *silent* (inside a function whose platform
branches include none CPU takes: CPU skips the work without a word); a site where CPU takes another branch needs no
entry.  This module says, for every live and silent site of every release, one of:

* :class:`Served`: an op of this profile serves it there (``op``, ``"<module of eagle3_patches.cpu>.<function>"``;
  the patch of that module puts it where the release looks for it);
* :class:`NotReached`: CPU does not get there, and why (:data:`WHY`: a branch sglang takes only with a feature the
  profile does not run);
* :class:`StandIn`: the site only imports the package: the profile's import-only stand-in answers it.

Each entry holds for the releases of its ``releases`` (a ``SpecifierSet``; a post release counts as its base
release) and covers the sites ``at`` names (a module, ``module:function`` or ``module:Class``, as the data writes
them, ``sglang.`` left off).  ``tests/cpu/test_kernel_coverage.py`` holds each release of the data against it: a
site no entry covers (a new release reaching a kernel somewhere new), an entry that covers nothing, an op that is
not this profile's own callable: each fails.  A static check: it cannot say that an op is right or is in place;
the ops' unit tests and the release matrix do.

Data only; ops are named, never imported here (the test resolves them).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..sglang_version import base_release


@dataclass(frozen=True)
class Served:
    releases: str
    op: str
    at: tuple[str, ...]


@dataclass(frozen=True)
class NotReached:
    releases: str
    why: str  # a key of WHY
    at: tuple[str, ...]


@dataclass(frozen=True)
class StandIn:
    releases: str
    why: str
    at: tuple[str, ...]


Entry = Served | NotReached | StandIn

#: why CPU does not reach a site: the branch or feature it belongs to, which the CPU profile does not run
WHY = {
    "sampler-flashinfer": "the sampler's 'flashinfer' backend; sglang picks 'pytorch' where flashinfer is not "
    "available (is_flashinfer_available() is false on CPU)",
    "sampler-ascend": "the sampler's 'ascend' backend (NPU)",
    "ngram": "NGRAM speculation (--speculative-algorithm NGRAM); the profile runs EAGLE and EAGLE3",
    "dflash": "DFlash speculation (--speculative-algorithm DFLASH); the profile runs EAGLE and EAGLE3",
    "uno": "UNO speculation; the profile runs EAGLE and EAGLE3",
    "lilicorr": "Lilicorr speculation (its candidates through the DFlash model's top-k); the profile runs EAGLE and "
    "EAGLE3",
    "multi-layer-eagle": "multi-layer EAGLE (--enable-multi-layer-eagle, MTP drafts); the profile runs one-layer "
    "EAGLE3 drafts",
    "cuda-graphs": "CUDA graph capture of the EAGLE draft (flashinfer autotuning in capture_one_shape); the "
    "profile runs with CUDA graphs off",
    "v2-worker-before-0.5.13": "the v2 EAGLE worker before 0.5.13 (SGLANG_ENABLE_SPEC_V2); the profile runs the v1 "
    "worker up to 0.5.12. No CPU op: its assign_extend_cache_locs_func has no CPU branch there",
    "deterministic-sampling": "sampling with per-request seeds (--enable-deterministic-inference: "
    "multinomial_with_seed -> murmur_hash32); the profile does not enable it. No CPU op: there it would call "
    "torch.ops.sgl_kernel.murmur_hash32_cpu, absent without sgl_kernel's CPU build",
    "no-caller": "a kernel-registry wrapper (get_kernel) that nothing in the path calls: the verify imports "
    "sgl_kernel's / flashinfer's renorm itself",
}

_SAMPLER = "srt.layers.sampler:Sampler._sample_from_probs"
_ASCEND = "srt.layers.sampler:top_k_top_p_min_p_sampling_from_logits_ascend"
_V2_SAMPLE = "srt.speculative.eagle_info_v2:EagleVerifyInputV2Mixin.sample"
_EAGLE_SAMPLE = "srt.speculative.eagle_utils:eagle_sample"
_NGRAM_INFO = "srt.speculative.ngram_info"
_AUTOTUNE = ("srt.model_executor.runner.flashinfer_autotune",)


def _sampling(op: str, in_sampler: bool = True) -> tuple[Entry, ...]:
    """The entries of a renorm / tree-sampling name: the EAGLE verify's sampling path, served by spec_sampling (the
    v2 verify up to 0.5.13, ``eagle_sample`` from 0.5.14); the sampler's flashinfer backend, NGRAM's verify and
    DFlash's are not reached."""
    return (
        Served(">=0.5.9,<0.5.14", f"spec_sampling.{op}", (_V2_SAMPLE,)),
        Served(">=0.5.14", f"spec_sampling.{op}", (_EAGLE_SAMPLE,)),
        *([NotReached(">=0.5.9", "sampler-flashinfer", (_SAMPLER,))] if in_sampler else []),
        NotReached(">=0.5.9,<0.5.14", "ngram", (_NGRAM_INFO,)),
        NotReached(">=0.5.11", "dflash", ("srt.speculative.dflash_utils",)),
    )


COVERAGE: dict[str, tuple[Entry, ...]] = {
    # -- the EAGLE draft tree and its greedy verify (spec_kernels) -----------------------------------------------
    "sgl_kernel.build_tree_kernel_efficient": (
        Served(">=0.5.9,<0.5.16", "spec_kernels.build_tree_kernel_efficient", ("srt.speculative.eagle_utils",)),
    ),
    "sgl_kernel.build_tree_kernel_efficient_cpu": (
        Served(
            ">=0.5.16",
            "spec_kernels.build_tree_kernel_efficient",
            ("srt.speculative.eagle_utils", "kernels.ops.speculative.spec_tree"),
        ),
    ),
    "sgl_kernel.verify_tree_greedy": (  # silent: verify_tree_greedy_func has no CPU branch before 0.5.16
        Served(
            ">=0.5.9,<0.5.16",
            "spec_kernels.verify_tree_greedy",
            ("srt.speculative.eagle_utils:verify_tree_greedy_func",),
        ),
        NotReached(">=0.5.9,<0.5.14", "ngram", (_NGRAM_INFO,)),
    ),
    "sgl_kernel_npu.sample.verify_tree_greedy.verify_tree_greedy": (
        Served(
            ">=0.5.9,<0.5.16",
            "spec_kernels.verify_tree_greedy",
            ("srt.speculative.eagle_utils:verify_tree_greedy_func",),
        ),
    ),
    "sgl_kernel.verify_tree_greedy_cpu": (
        Served(
            ">=0.5.16",
            "spec_kernels.verify_tree_greedy",
            ("srt.speculative.eagle_utils", "kernels.ops.speculative.spec_tree"),
        ),
    ),
    # -- the KV-slot ops of the decode loop (cache_loc_ops) ------------------------------------------------------
    "sgl_kernel.assign_req_to_token_pool_cpu": (
        Served(">=0.5.16", "cache_loc_ops.assign_req_to_token_pool_cpu", ("srt.mem_cache.allocation",)),
    ),
    "sgl_kernel.assign_extend_cache_locs_cpu": (
        Served(
            ">=0.5.16",
            "cache_loc_ops.assign_extend_cache_locs_cpu",
            ("kernels.ops.speculative.cache_locs", "srt.speculative.spec_utils"),
        ),
    ),
    "sgl_kernel.assign_draft_cache_locs_contiguous_cpu": (
        Served(
            ">=0.5.16",
            "cache_loc_ops.assign_draft_cache_locs_contiguous_cpu",
            ("srt.speculative.eagle_worker_common", "kernels.ops.speculative.cache_locs"),
        ),
    ),
    "sgl_kernel.fill_bonus_tokens_cpu": (
        Served(">=0.5.16", "cache_loc_ops.fill_bonus_tokens_cpu", ("kernels.ops.speculative.eagle",)),
    ),
    "sgl_kernel.fill_accept_out_cache_loc_cpu": (
        Served(">=0.5.16", "cache_loc_ops.fill_accept_out_cache_loc_cpu", ("kernels.ops.speculative.eagle",)),
    ),
    "torch.ops.npu.cache_loc_update": (  # the NPU branch of a function with no CPU branch
        NotReached(
            ">=0.5.9,<0.5.13",
            "v2-worker-before-0.5.13",
            ("srt.speculative.eagle_info_v2:assign_extend_cache_locs_func",),
        ),
        Served(
            ">=0.5.13,<0.5.16",
            "cache_loc_ops.assign_extend_cache_locs_func",
            ("srt.speculative.triton_ops.cache_locs:assign_extend_cache_locs_func",),
        ),
    ),
    # -- sampling at temperature > 0 (spec_sampling) -------------------------------------------------------------
    "sgl_kernel.top_k_renorm_prob": _sampling("top_k_renorm_prob"),
    "sgl_kernel.top_p_renorm_prob": _sampling("top_p_renorm_prob"),
    "sgl_kernel.tree_speculative_sampling_target_only": _sampling("tree_speculative_sampling_target_only", False),
    # 0.5.21 on, flashinfer's names of the same ops (CUDA's binding; on CPU sglang binds None)
    "flashinfer.sampling.top_k_renorm_probs": (
        Served(">=0.5.23", "spec_sampling.top_k_renorm_prob", (_EAGLE_SAMPLE,)),
        NotReached(">=0.5.21", "dflash", ("srt.speculative.dflash_utils",)),
    ),
    "flashinfer.sampling.top_p_renorm_probs": (
        Served(">=0.5.23", "spec_sampling.top_p_renorm_prob", (_EAGLE_SAMPLE,)),
        NotReached(">=0.5.21", "dflash", ("srt.speculative.dflash_utils",)),
    ),
    # 0.5.23: the JIT op CUDA binds for the tree sampling (None on CPU)
    "sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only": (
        Served(">=0.5.23", "spec_sampling.tree_speculative_sampling_target_only", (_EAGLE_SAMPLE,)),
        NotReached(">=0.5.23", "dflash", ("srt.speculative.dflash_utils",)),
    ),
    "sgl_kernel.sampling.top_k_renorm_probs": (
        NotReached(">=0.5.16", "no-caller", ("kernels.ops.sampling:top_k_renorm_probs",)),
    ),
    "sgl_kernel.sampling.top_p_renorm_probs": (
        NotReached(">=0.5.16", "no-caller", ("kernels.ops.sampling:top_p_renorm_probs",)),
    ),
    # -- the sampler's other backends ----------------------------------------------------------------------------
    "sgl_kernel.min_p_sampling_from_probs": (NotReached(">=0.5.9", "sampler-flashinfer", (_SAMPLER,)),),
    "sgl_kernel.top_k_top_p_sampling_from_probs": (NotReached(">=0.5.9", "sampler-flashinfer", (_SAMPLER,)),),
    "flashinfer.sampling.min_p_sampling_from_probs": (NotReached(">=0.5.10", "sampler-flashinfer", (_SAMPLER,)),),
    "flashinfer.sampling.top_k_top_p_sampling_from_probs": (NotReached(">=0.5.10", "sampler-flashinfer", (_SAMPLER,)),),
    "torch_npu": (NotReached(">=0.5.9", "sampler-ascend", (_ASCEND,)),),
    "torch_npu.npu_top_k_top_p": (NotReached(">=0.5.9", "sampler-ascend", (_ASCEND,)),),
    "torch.ops.sgl_kernel.murmur_hash32_cpu": (
        NotReached(">=0.5.20", "deterministic-sampling", ("kernels.ops.sampling.murmur_hash:murmur_hash32",)),
    ),
    "sgl_kernel": (
        NotReached(">=0.5.20", "deterministic-sampling", ("kernels.ops.sampling.murmur_hash:murmur_hash32",)),
        StandIn(
            ">=0.5.18",
            "cpu_has_amx_support() imports sgl_kernel and asks torch.ops.sgl_kernel for an op: the stand-in imports, "
            "and the answer is no",
            ("srt.utils.common:_is_intel_amx_backend_available",),
        ),
    ),
    # -- other speculative algorithms, and what the profile does not run -----------------------------------------
    "sgl_kernel.speculative.reconstruct_indices_from_tree_mask": (
        NotReached(">=0.5.9", "ngram", ("srt.speculative.ngram_worker", "kernels.ops.speculative.reconstruct_tree")),
    ),
    "sgl_kernel.rotate_input_ids_cpu": (
        NotReached(">=0.5.16", "multi-layer-eagle", ("kernels.ops.speculative.multi_layer_eagle",)),
    ),
    "flashinfer.top_k": (
        NotReached(
            ">=0.5.20",
            "uno",
            ("srt.speculative.uno_tree", "srt.speculative.uno_utils", "kernels.ops.speculative.uno_tree"),
        ),
        NotReached(">=0.5.21", "lilicorr", ("srt.models.dflash:_radix_topk",)),
    ),
    "flashinfer": (NotReached(">=0.5.15", "cuda-graphs", _AUTOTUNE),),
    "flashinfer.autotune_v2": (NotReached(">=0.5.23", "cuda-graphs", _AUTOTUNE),),
    "flashinfer.autotuner.AutoTuner": (NotReached(">=0.5.21", "cuda-graphs", _AUTOTUNE),),
    "flashinfer.autotuner._collect_metadata": (NotReached(">=0.5.19", "cuda-graphs", _AUTOTUNE),),
    "flashinfer.autotuner.autotune": (NotReached(">=0.5.15", "cuda-graphs", _AUTOTUNE),),
    "flashinfer.autotuner.get_autotune_process_group": (NotReached(">=0.5.19", "cuda-graphs", _AUTOTUNE),),
    "flashinfer.autotuner.set_autotune_process_group": (NotReached(">=0.5.19", "cuda-graphs", _AUTOTUNE),),
}


def covers(at: str, site: str) -> bool:
    """``at`` (a module, ``module:function``, ``module:Class``) covers the data's ``site`` (its tags left off)."""
    loc = site.split(" [", 1)[0]
    return loc == at or loc.startswith(at + (":" if ":" not in at else "."))


def entries(name: str, release: str | Version) -> list[Entry]:
    """The entries of ``name`` that hold for sglang ``release``."""
    base = base_release(Version(str(release)))
    return [e for e in COVERAGE.get(name, ()) if base in SpecifierSet(e.releases)]


def covering(name: str, release: str | Version, site: str) -> list[Entry]:
    """The entries of ``name`` for ``release`` that cover ``site``."""
    return [e for e in entries(name, release) if any(covers(at, site) for at in e.at)]


def describe(entry: Entry) -> str:
    if isinstance(entry, Served):
        return entry.op
    if isinstance(entry, StandIn):
        return "the stand-in (an import)"
    return f"not reached on CPU ({entry.why})"
