"""draft_chunked_prefix_cache

Bug: ``ModelRunner.model_specific_adjustment`` runs for the draft's model runner too, on the ``ServerArgs`` the
target's runner shares.  An EAGLE-3 draft of the Llama class is not an MLA model, so it sets
``disable_chunked_prefix_cache = True`` after the MLA target (DeepSeek-V3, Kimi-K2.5) built its attention with the
chunked prefix cache on: the target's MLA backend (FA3) then meets a switch that says off on a path it took because
it was on, and asserts on long-context requests once prefixes are cached (sglang issues #22682, #22780, both
Kimi-K2.5).  sglang 0.5.16 returns early for the draft runner (``maybe_disable_chunked_prefix_cache``).

What users see: Kimi-K2.5 with an EAGLE-3 draft on an MLA backend that supports the chunked prefix cache (fa3,
flashinfer, flashmla, cutlass_mla, trtllm_mla, fa4; from 0.5.12 tokenspeed_mla, from 0.5.13 cutedsl_mla) serves
short prompts and fails with an ``AssertionError`` in the attention backend on long contexts.

What the patch changes: on a draft runner, ``model_specific_adjustment`` leaves ``disable_chunked_prefix_cache`` as
the target set it (the value is put back after the call); the target's runner is untouched.

Releases: 0.5.8 - 0.5.15 (read: 0.5.9, 0.5.10, 0.5.12 - 0.5.15 flip it; 0.5.16 guards it).  Its check requires that
``model_specific_adjustment`` still sets the switch itself, else ``not-applicable``.

Upstream probe: none needed: from 0.5.16 the switch is set outside ``model_specific_adjustment``, which the check
finds (``not-applicable``).

Tests: ``tests/patches/test_draft_chunked_prefix_cache.py``: the real target and draft model runners of 0.5.9 (the
tiny DeepSeek-V3, Kimi-K2.5's text model, and the Llama draft), their own ``model_specific_adjustment`` run on their
shared ``ServerArgs`` with the fa3 backend named and the switch on (scenario ``chunked_prefix_switch``): stock, the
target leaves it on and the draft turns it off; patched, it stays on; the doctor's ``draft-chunked-prefix-cache``.

Not verified on CPU: the FA3 MLA backend's assertion itself (CUDA).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, INFO, Diagnostics
from ..registry import Patch, Saver, expect_attr, expect_source

# pragma: no mutate core/AddNot: only mypy reads PatchSetup here; importing preflight at run time as well changes
# nothing a test or an operator sees
if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

NAME = "draft_chunked_prefix_cache"
SWITCH = "disable_chunked_prefix_cache"
FIXED_IN = "0.5.16"
#: the attention backends whose MLA kernels read the chunked prefix cache, as ``--attention-backend`` names them
#: (``CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS`` of model_runner.py: 0.5.9's six, ``tokenspeed_mla`` from
#: 0.5.12, ``cutedsl_mla`` from 0.5.13; a release without one refuses the flag value before the doctor's rule matters)
CHUNKED_PREFIX_BACKENDS = (
    "flashinfer",
    "fa3",
    "fa4",
    "flashmla",
    "cutedsl_mla",
    "cutlass_mla",
    "trtllm_mla",
    "tokenspeed_mla",
)
#: the EAGLE-3 draft classes that are MLA models, whose own adjustment leaves the switch alone
MLA_DRAFTS = ("Eagle3DeepseekV2ForCausalLM",)


def _draft_leaves_the_switch(wrapped, instance, args, kwargs):
    # pragma: no mutate core/ReplaceFalseWithTrue: ModelRunner.__init__ sets is_draft_worker before it calls
    # model_specific_adjustment (the check requires the attribute), so the default is never read
    if not getattr(instance, "is_draft_worker", False):
        return wrapped(*args, **kwargs)
    server_args = instance.server_args
    targets = getattr(server_args, SWITCH)
    try:
        return wrapped(*args, **kwargs)
    finally:
        setattr(server_args, SWITCH, targets)


class DraftChunkedPrefixCache(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 35
    summary = "the draft's model runner leaves the target's chunked-prefix-cache switch as the target set it"
    module = "sglang.srt.model_executor.model_runner"
    applies_to = SpecifierSet(f">=0.5.8,<{FIXED_IN}")

    def check(self, module: ModuleType) -> None:
        runner = expect_attr(module, "ModelRunner")
        expect_source(runner.model_specific_adjustment, f"server_args.{SWITCH} = True")
        expect_source(runner.__init__, "self.is_draft_worker")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ModelRunner, "model_specific_adjustment", _draft_leaves_the_switch)

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        la, tv, dv = setup.launch, setup.target, setup.draft
        if (
            setup.checkpoint_only
            or not setup.eagle3
            or tv is None
            or not tv.deepseek_family
            or dv is None
            or any(a in MLA_DRAFTS for a in dv.architectures)
            or not self.covers(setup.version)
        ):
            return out
        backend = la.attention_backend
        if backend is not None and backend not in CHUNKED_PREFIX_BACKENDS:
            return out
        named = backend is not None
        out.add(
            ERROR if named else INFO,
            "draft-chunked-prefix-cache",
            f"an MLA target with a non-MLA EAGLE-3 draft on sglang {setup.version}: the draft's model runner turns "
            "off the target's chunked prefix cache after the target's attention was built with it on, and the MLA "
            "backend asserts on long-context requests"
            + ("" if named else " where sglang picks a backend that reads it (fa3 on Hopper)")
            + setup.once_eagle3,
            where=f"--attention-backend {backend}" if named else "--attention-backend (sglang's choice)",
            found=f"{tv.arch} with {', '.join(dv.architectures) or 'a non-MLA draft'}",
            expected="the target's switch left as the target set it",
            fix=f"launch under `eagle3-patches run` ({NAME}), upgrade to sglang >= {FIXED_IN}, or pass "
            "--disable-chunked-prefix-cache (slower long-context prefill)",
        )
        return out


PATCH = DraftChunkedPrefixCache()
