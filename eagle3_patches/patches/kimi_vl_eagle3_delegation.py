"""kimi_vl_eagle3_delegation

Bug: sglang's ``KimiVLForConditionalGeneration`` wraps a ``DeepseekV2ForCausalLM`` language model and returns its
output unchanged (``general_mm_embed_routine(language_model=self.language_model)``, aux states included), but does
not delegate ``set_eagle3_layers_to_capture`` / ``get_embed_and_head`` / ``set_embed_and_head`` to it.

What users see: ``--speculative-algorithm EAGLE3`` on Kimi-VL dies at start with an AttributeError.

What the patch changes: delegation is all this wrapper needs: the same mechanism as
``kimi_k25_eagle3_delegation`` (``DelegatingWrapperPatch``: each hook delegated to ``language_model``); this module
is a subclass naming the module, the class and the releases.  Runtime only: no fork-path diff.

Releases: every release checked (docs/targets.md).

Upstream probe: the class defines ``set_eagle3_layers_to_capture`` itself.

Tests: ``tests/patches/test_wrapper_targets.py``: a tiny Kimi-VL (the tiny DeepSeek text model with a plain
``q_proj``, as Kimi-VL has, and a one-block MoonViT) through the real EAGLE worker: stock fails at start, patched
feeds ``[5, 3 x 64]`` to ``fc`` from layers ``[2, 3, 4]``, disabled it is named by the launcher's capability guard.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

from .kimi_k25_eagle3_delegation import DelegatingWrapperPatch


class KimiVlEagle3Delegation(DelegatingWrapperPatch):
    name = "kimi_vl_eagle3_delegation"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 12
    summary = "KimiVLForConditionalGeneration delegates the EAGLE-3 hooks to its language_model"
    module = "sglang.srt.models.kimi_vl"
    applies_to = SpecifierSet(">=0.5.8")
    targets = ("KimiVLForConditionalGeneration",)
    class_name = "KimiVLForConditionalGeneration"
    in_fork_series = False  # runtime only for now: no fork-path diff written for it


PATCH = KimiVlEagle3Delegation()
