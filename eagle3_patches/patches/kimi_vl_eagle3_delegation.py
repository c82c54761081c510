"""kimi_vl_eagle3_delegation

Bug: sglang's ``KimiVLForConditionalGeneration`` wraps a ``DeepseekV2ForCausalLM`` language model and
returns its output unchanged (``general_mm_embed_routine(language_model=self.language_model)``, aux
states included), but does not delegate ``set_eagle3_layers_to_capture`` / ``get_embed_and_head`` /
``set_embed_and_head`` to it: EAGLE-3 on Kimi-VL dies at start with an AttributeError.
Releases: every release through 0.5.23 (docs/targets.md); delegation is all it needs.
Upstream probe: the class defines ``set_eagle3_layers_to_capture`` itself.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

from .kimi_k25_eagle3_delegation import DelegatingWrapperPatch


class KimiVlEagle3Delegation(DelegatingWrapperPatch):
    name = "kimi_vl_eagle3_delegation"
    order = 12
    summary = "KimiVLForConditionalGeneration delegates the EAGLE-3 hooks to its language_model"
    module = "sglang.srt.models.kimi_vl"
    applies_to = SpecifierSet(">=0.5.8")
    targets = ("KimiVLForConditionalGeneration",)
    class_name = "KimiVLForConditionalGeneration"
    in_fork_series = False  # runtime only for now: no fork-path diff written for it


PATCH = KimiVlEagle3Delegation()
