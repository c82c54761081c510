"""CPU fallbacks for the sgl_kernel speculative-decoding ops (placeholder, filled in by issue 6)."""

from __future__ import annotations

from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..registry import Patch, Saver


class CpuSpecKernels(Patch):
    name = "cpu_spec_kernels"
    summary = "pure-torch build_tree_kernel_efficient / verify_tree_greedy for the EAGLE decode loop on CPU"
    module = "sglang.srt.speculative.eagle_utils"
    applies_to = SpecifierSet(">=0.5.9")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        pass
