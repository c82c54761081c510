"""kimi_k25_eagle3_delegation

Bug: sglang 0.5.9's ``KimiK25ForConditionalGeneration`` wraps a DeepSeek-V3 language model but does not delegate
``set_eagle3_layers_to_capture``, ``get_embed_and_head`` or ``set_embed_and_head`` to it (and a hand-rolled fix
that forgets one silently captures nothing).

What users see: ``--speculative-algorithm EAGLE3`` on Kimi-K2.5 dies at start with
``AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'set_eagle3_layers_to_capture'``
(and ``EAGLEWorker.__init__`` needs ``get_embed_and_head`` right after).

What the patch changes: adds the three methods to the class, each delegating to ``self.language_model``; if the
language model lacks the method it raises ``Eagle3TargetError`` naming the language model's class (the
``SupportsEagle3`` idea: fail at start, say why).  Methods the class already has are never replaced.  The
mechanism, ``DelegatingWrapperPatch``, is defined here and shared by ``kimi_vl_eagle3_delegation``.

Releases: 0.5.9 only (``kimi_k25.py`` first appeared in 0.5.9; 0.5.10 added the delegation).

Upstream probe: the class defines ``set_eagle3_layers_to_capture`` itself.

Tests: ``tests/patches/test_kimi_k25_eagle3_delegation.py``, ``tests/sglang/test_stock_0_5_9.py``: the real
``TpModelWorker`` + ``EAGLEWorker.forward_batch_generation`` on the tiny Kimi-K2.5 target: patched, the target
captures the outputs of layers 1, 2, 3 and a forward hook on the draft's ``fc`` sees ``[8, 192]`` = 3 x hidden;
with the patches applied then reverted, the same run fails at start with the stock AttributeError; stock 0.5.9
fails the same way (pinned: it tells us the day a release fixes it); a language model that cannot capture gives
the clear error.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, Diagnostics
from ..errors import Eagle3TargetError
from ..registry import Patch, Saver, defines

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

DELEGATED = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")


def _delegate(method: str, attr: str, class_name: str):
    def delegated(self, *args, **kwargs):
        lm = getattr(self, attr, None)
        target = getattr(lm, method, None)
        if target is None:
            raise Eagle3TargetError(
                f"the {class_name} target cannot do EAGLE-3: its language model has no {method}()",
                where=f"{type(self).__name__}.{attr} ({type(lm).__name__})",
                found=f"no {method} on the language model",
                expected="a language model that supports aux hidden-state capture (e.g. DeepseekV3ForCausalLM)",
                fix="serve this target without --speculative-algorithm EAGLE3, or use an sglang release whose language "
                "model supports EAGLE-3 capture",
            )
        return target(*args, **kwargs)

    delegated.__name__ = method
    delegated.__qualname__ = f"{class_name}.{method}"
    delegated.__doc__ = f"Delegates to ``self.{attr}.{method}`` (added by eagle3-patches)."
    return delegated


class DelegatingWrapperPatch(Patch):
    """The one mechanism for a multimodal wrapper whose ``forward`` returns its language model's own output (aux
    states included, e.g. through ``general_mm_embed_routine(language_model=...)``) but lacks the EAGLE-3 hooks:
    each hook is delegated to the language model (``language_model_attr``).  A wrapper patch is a subclass naming
    its module, class and releases, plus a test with a tiny model of the class through the real EAGLE worker."""

    class_name: str = ""
    language_model_attr: str = "language_model"

    def upstream(self, module: ModuleType) -> str | None:
        if defines(getattr(module, self.class_name), "set_eagle3_layers_to_capture"):
            fixed = next((str(s.version) for s in self.applies_to if s.operator == "<"), None)
            return f"{self.class_name} defines set_eagle3_layers_to_capture itself" + (
                f" (sglang >= {fixed})" if fixed else ""
            )
        return None

    def patch(self, module: ModuleType, saver: Saver) -> None:
        cls = getattr(module, self.class_name)
        for method in DELEGATED:
            if method not in vars(cls):  # never replace one the class already has
                saver.set(cls, method, _delegate(method, self.language_model_attr, self.class_name))


class KimiK25Eagle3Delegation(DelegatingWrapperPatch):
    name = "kimi_k25_eagle3_delegation"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 10
    summary = "KimiK25ForConditionalGeneration delegates the EAGLE-3 hooks to its language_model"
    module = "sglang.srt.models.kimi_k25"
    applies_to = SpecifierSet(">=0.5.9,<0.5.10")
    targets = ("KimiK25ForConditionalGeneration",)
    class_name = "KimiK25ForConditionalGeneration"

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        tv = setup.target
        if (
            setup.checkpoint_only
            or tv is None
            or not tv.is_kimi_k25
            or setup.algorithm not in ("EAGLE", "EAGLE3", "NEXTN")
            or not setup.rf.has_kimi_k25
            or not self.covers(setup.version)
        ):
            return out
        out.add(
            ERROR,
            "kimi-k25-delegation",
            f"sglang {setup.version}'s KimiK25ForConditionalGeneration has no set_eagle3_layers_to_capture / "
            "get_embed_and_head / set_embed_and_head: the server fails at start (AttributeError)",
            where=setup.tcfg("architectures", top=True),
            found=f"{tv.arch} on sglang {setup.version}",
            expected="sglang >= 0.5.10, or eagle3-patches",
            fix="launch under `eagle3-patches run -- python -m sglang.launch_server ...` "
            "(kimi_k25_eagle3_delegation), or upgrade sglang to >= 0.5.10",
        )
        return out


PATCH = KimiK25Eagle3Delegation()
