"""qwen3_vl_eagle3_capture

Bug: sglang's Qwen3-VL wrapper (``Qwen3VLForConditionalGeneration``; ``Qwen3VLMoeForConditionalGeneration``
subclasses it) has no ``set_eagle3_layers_to_capture`` / ``get_embed_and_head``, and its ``forward`` hands the
language model's ``(hidden, aux)`` output to the logits processor as if it were one tensor.  Delegation is not
enough here: the wrapper's language model is a bare ``Qwen3LLMModel`` (no hooks of its own) and the forward must
carry the aux states.

What users see: ``--speculative-algorithm EAGLE3`` on Qwen3-VL dies at start with an AttributeError (sglang issue
17935); with the hooks added by hand, it dies at the first forward.

What the patch changes: adds the two hooks as sglang 0.5.11 has them (ids + 1 captured on ``self.model``, the
defaults ``[2, n // 2, n - 3]`` without ids; the embedding of ``self.model`` and ``self.lm_head``) and wraps
``forward``: while the capture is on, the logits processor receives the ``(hidden, aux)`` pair unpacked, the aux
states as its ``aux_hidden_states``, for that one call (sglang's ``LogitsProcessor`` class is not changed).  Its
``targets`` lists both classes, which the launcher's capability guard and docs/targets.md read.  Its check refuses
(not-applicable, sglang left untouched) a release whose ``Qwen3LLMModel`` has no ``forward`` of its own or whose
wrapper ``forward`` no longer runs ``general_mm_embed_routine`` and the logits processor.  Runtime only: no
fork-path diff.

Releases: sglang >=0.5.8,<0.5.11 (0.5.8 - 0.5.10.post1); 0.5.11 added the hooks and the forward change upstream.

Upstream probe: the class defines ``set_eagle3_layers_to_capture`` itself.

Tests: ``tests/patches/test_wrapper_targets.py``, ``tests/e2e/test_qwen3_vl_server.py``: tiny Qwen3-VL targets,
dense and MoE (transformers' own classes, random weights, text prompts), through the real ``TpModelWorker`` + EAGLE
worker: stock fails at start naming ``set_eagle3_layers_to_capture``; patched, the draft's ``fc`` receives
``[5, 3 x 64]`` and the target captures the configured layers ``[2, 3, 4]`` (without ids, the defaults
``[2, n // 2, n - 3]``); with the patch disabled the launcher refuses naming it; the check refuses the two edited
forwards above.  The real server (text only: ``eagle3_patches/testing/text_only_launch.py``, because transformers'
Qwen3-VL video processor needs a real torchvision, a CUDA-only package on this machine): the EAGLE3 server's greedy
outputs equal the server without speculation and the probe shows 3 x 64 at ``fc``.  The draft is random (no
Qwen3-VL draft was trained here), so the accept length stays near 1.0 (1.09 measured): the wiring is proven, not a
Qwen3-VL drafter's quality.  Image inputs go through the same code path (the same ``general_mm_embed_routine``
output) but are not tested (no real processor here).
"""

from __future__ import annotations

from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..registry import Patch, Saver, defines, expect_attr, expect_source

NAME = "qwen3_vl_eagle3_capture"


def set_eagle3_layers_to_capture(self, layer_ids: list[int] | None = None) -> None:
    """Capture the outputs of the given target layers (sglang's ``val + 1`` rule; added by eagle3-patches)."""
    if not self.pp_group.is_last_rank:
        return
    self.capture_aux_hidden_states = True
    if layer_ids is None:
        n = self.config.num_hidden_layers
        self.model.layers_to_capture = [2, n // 2, n - 3]
    else:
        self.model.layers_to_capture = [val + 1 for val in layer_ids]


def get_embed_and_head(self):
    """The embedding and lm_head an EAGLE-3 draft shares (added by eagle3-patches)."""
    return self.model.embed_tokens.weight, self.lm_head.weight


def _forward_carrying_aux(wrapped, instance, args, kwargs):
    # pragma: no mutate core/ReplaceFalseWithTrue: the attribute is missing only until the hook turns the capture on
    # (sglang 0.5.8-0.5.10's `Qwen3VLForConditionalGeneration` never sets it); the mutant then takes the unpacking path,
    # whose `unpacking` passes a tensor `hidden_states` and the given `aux_hidden_states` (none: the wrapper's call has
    # four arguments) to `LogitsProcessor.forward` unchanged, and removes itself after the call: the same call, the same
    # output
    if not getattr(instance, "capture_aux_hidden_states", False):
        return wrapped(*args, **kwargs)
    processor = instance.logits_processor
    forward = type(processor).forward

    def unpacking(input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None, *rest, **kw):
        if isinstance(hidden_states, tuple):
            hidden_states, aux_hidden_states = hidden_states
        return forward(processor, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states, *rest, **kw)

    processor.forward = unpacking  # this call only: sglang's LogitsProcessor itself is not changed
    try:
        return wrapped(*args, **kwargs)
    finally:
        del processor.forward


class Qwen3VlEagle3Capture(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 15
    summary = "Qwen3-VL (and Qwen3-VL-MoE) get the EAGLE-3 hooks and a forward that hands the aux states on"
    module = "sglang.srt.models.qwen3_vl"
    applies_to = SpecifierSet(">=0.5.8,<0.5.11")
    targets = ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration")
    in_fork_series = False  # runtime only for now: no fork-path diff written for it

    def upstream(self, module: ModuleType) -> str | None:
        if defines(module.Qwen3VLForConditionalGeneration, "set_eagle3_layers_to_capture"):
            return "Qwen3VLForConditionalGeneration defines set_eagle3_layers_to_capture itself (sglang >= 0.5.11)"
        return None

    def check(self, module: ModuleType) -> None:
        cls = module.Qwen3VLForConditionalGeneration
        expect_source(expect_attr(cls, "forward"), "general_mm_embed_routine", "self.logits_processor(")
        expect_attr(module.Qwen3LLMModel, "forward")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        cls = module.Qwen3VLForConditionalGeneration
        saver.set(cls, "set_eagle3_layers_to_capture", set_eagle3_layers_to_capture)
        saver.set(cls, "get_embed_and_head", get_embed_and_head)
        saver.wrap(cls, "forward", _forward_carrying_aux)


PATCH = Qwen3VlEagle3Capture()
