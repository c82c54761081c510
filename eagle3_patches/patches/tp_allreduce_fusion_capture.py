"""tp_allreduce_fusion_capture

Bug: with flashinfer all-reduce fusion, a decoder layer skips the all-reduce of its MLP/MoE output, and the next
layer does it fused with residual-add + RMSNorm (``hidden_states._sglang_needs_allreduce_fusion``).  sglang up to
0.5.13 captures EAGLE-3 aux states in ``DeepseekV2Model.forward`` as ``hidden_states + residual`` *before* layer
``i`` runs, which is before that fused all-reduce.  With TP > 1 each rank therefore captures its own partial sum,
not the layer output.  ``ServerArgs._handle_model_specific_adjustments`` turns the fusion on automatically for
``DeepseekV3ForCausalLM``, ``KimiK25ForConditionalGeneration`` (and GptOss, Glm4Moe, Qwen3Moe; each release adds
some: Qwen3.5 in 0.5.10, DeepSeek-V3.2, GLM-MoE-DSA and Qwen3-Next in 0.5.11, InternS2 in 0.5.12, Mistral-Large-3 in
0.5.13, which the doctor's rule follows: ``auto_fusion_archs``, checked against each release's source by the
matrix) on sm90/sm100 when the run is single-node, without dp-attention, not on H20 and with
``moe_a2a_backend == "none"``.  0.5.9 has no flag to turn it off.

What users see: with TP > 1 on H100/H200/B200, no error.  The draft gets aux states that are wrong (and differ from
rank to rank, and from the real layer outputs), so the accept length is lower than the drafter's published
figures.  With TP = 1, or on GPUs where the fusion is not auto-enabled, the same draft works.

What the patch changes: it wraps ``ServerArgs._handle_model_specific_adjustments``.  After sglang's own adjustment,
if ``speculative_algorithm`` is ``EAGLE3``, ``tp_size > 1`` and ``enable_flashinfer_allreduce_fusion`` is on, the
patch sets the flag to ``False`` and logs a warning (logger ``eagle3_patches``) that explains why.  An explicit
``--enable-flashinfer-allreduce-fusion`` is also overridden, and the warning says so: correct aux states matter
more than the fused kernel's latency.  Set ``EAGLE3_PATCHES_DISABLE=tp_allreduce_fusion_capture`` to keep the
fusion.  These cases are left alone, with no log, as nothing is captured mid-model there or there is no all-reduce
to defer: EAGLE (EAGLE-2, and NEXTN, which becomes EAGLE), which uses only the final, fully reduced state; no
speculation; TP = 1.  The decision does not depend on the model: for any target that captures aux states before the
fused all-reduce, turning the fusion off only costs a little latency.  The flag is set on the ``ServerArgs`` that
is pickled to the scheduler processes, so every rank sees it.

Releases: sglang >=0.5.8,<0.5.14.  0.5.14 moved the capture into the decoder layer, after the all-reduce
(``prepare_attn_and_capture_last_layer_outputs``).

Upstream probe: the patch reads ``models/deepseek_v2.py`` as text, without importing it, and reports ``upstream``
when it contains ``captured_last_layer_outputs`` (0.5.14 passes it to its decoder layers).  The string is present
in 0.5.14 and absent in 0.5.9 and 0.5.13; both were checked.

Tests: ``tests/patches/test_tp_allreduce_fusion_capture.py``.  Real sglang 0.5.9 ``ServerArgs`` objects are built
for the tiny Kimi-K2.5 and DeepSeek-V3 targets with ``tp_size=2``, in one isolated process.  The only stand-ins are
the hardware facts that ``sglang.srt.server_args`` reads: ``is_sm90_supported`` / ``is_sm100_supported`` /
``get_device_name`` report an H200 (or a B200).  Results:

- Without the stand-ins (this CPU machine), the fusion stays off.
- Stock on sm90: fusion on with EAGLE3 and TP 2, for both targets (the bug condition).
- Patched: fusion off and exactly one warning that explains why, for Kimi and DeepSeek on sm90 and for Kimi on
  sm100; an explicit flag is overridden, and the warning says so.
- Patched, fusion left on and nothing logged: TP 1, no speculation, EAGLE (with and without the explicit flag).
- After ``revert()``, the original method is back (identity) and stock behaviour returns.
- Tests with no sglang involved cover the upstream probe (on a stand-in package directory), the decision table and
  the version gate.

Not verified on CPU: a GPU is needed for the fused kernel itself: that with fusion on, TP > 1 and EAGLE-3 the
captured states really are per-rank partial sums, that with this patch they match TP = 1, that the accept length
recovers, and how much decode latency turning the fusion off costs.  Without fusion, CPU TP-2 (gloo) runs have shown
the aux states identical across ranks and equal to TP = 1 (``set_eagle3_layers_to_capture([1, 2, 3])`` on each
rank).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from .. import settings
from ..diagnostic import ERROR, Diagnostics
from ..registry import (
    NotApplicable,
    Patch,
    Saver,
    expect_attr,
    expect_source,
    read_source_file,
)
from ..sglang_version import base_release

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

NAME = "tp_allreduce_fusion_capture"
FLAG = "enable_flashinfer_allreduce_fusion"
UPSTREAM_MARKER = "captured_last_layer_outputs"
#: the architectures for which sglang turns the fusion on by itself (``ServerArgs._handle_model_specific_adjustments``),
#: by the release that added them to its list (read from each release's source, 0.5.9 - 0.5.13.post1; 0.5.8, not
#: read, is given 0.5.9's list)
AUTO_FUSION_ARCHS_ADDED = (
    (
        "0.5.8",
        (
            "DeepseekV3ForCausalLM",
            "GptOssForCausalLM",
            "Glm4MoeForCausalLM",
            "Glm4MoeLiteForCausalLM",
            "Qwen3MoeForCausalLM",
            "KimiK25ForConditionalGeneration",
        ),
    ),
    # pragma: no mutate eagle3/DropLiteralElement: on sglang 0.5.9, where the mutants run, the entries of later releases
    # are not read; on the release that added them
    # `test_tp_allreduce_fusion_capture.py::test_the_doctor_names_the_architectures_sglang_turns_the_fusion_on_for`
    # kills each (the list read from that release's source), as the matrix runs it
    ("0.5.10", ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")),
    # pragma: no mutate eagle3/DropLiteralElement: on sglang 0.5.9, where the mutants run, the entries of later releases
    # are not read; on the release that added them
    # `test_tp_allreduce_fusion_capture.py::test_the_doctor_names_the_architectures_sglang_turns_the_fusion_on_for`
    # kills each (the list read from that release's source), as the matrix runs it
    ("0.5.11", ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "Qwen3NextForCausalLM")),
    ("0.5.12", ("InternS2PreviewForConditionalGeneration",)),
    ("0.5.13", ("MistralLarge3ForCausalLM",)),
)


def auto_fusion_archs(version) -> frozenset[str]:
    """The architectures sglang ``version`` turns the fusion on for by itself (sm90/sm100, single node, ...)."""
    from packaging.version import Version

    release = base_release(Version(str(version)))
    return frozenset(arch for first, archs in AUTO_FUSION_ARCHS_ADDED if release >= Version(first) for arch in archs)


def fusion_breaks_capture(server_args) -> bool:
    """EAGLE-3 aux capture with TP > 1 while flashinfer all-reduce fusion is on."""
    algorithm = str(server_args.speculative_algorithm or "").upper()
    return algorithm == "EAGLE3" and server_args.tp_size > 1 and bool(getattr(server_args, FLAG))


def turn_off_fusion(server_args, *, requested: bool) -> None:
    setattr(server_args, FLAG, False)
    how = (
        "--enable-flashinfer-allreduce-fusion was passed explicitly and is overridden"
        if requested
        else "sglang had enabled it automatically for this model and GPU"
    )
    logger.warning(
        "eagle3-patches: flashinfer all-reduce fusion turned off (%s): with --speculative-algorithm EAGLE3 "
        "and --tp-size %s, this sglang captures the EAGLE-3 aux hidden states before the fused all-reduce, "
        "so the draft would get per-rank partial sums (silently lower accept length; fixed in sglang 0.5.14). "
        "Set %s=%s to keep the fusion anyway.",
        how,
        server_args.tp_size,
        settings.DISABLE,
        NAME,
    )


def _adjust_then_check(wrapped, instance, args, kwargs):
    requested = bool(getattr(instance, FLAG))  # before sglang's own auto-enable (check: a field of every ServerArgs)
    result = wrapped(*args, **kwargs)
    if fusion_breaks_capture(instance):
        turn_off_fusion(instance, requested=requested)
    return result


class TpAllreduceFusionCapture(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 40
    summary = "TP > 1 + EAGLE3: flashinfer all-reduce fusion is turned off so aux states are full sums"
    module = "sglang.srt.server_args"
    applies_to = SpecifierSet(">=0.5.8,<0.5.14")

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        la, arch = setup.launch, setup.target.arch if setup.target is not None else None
        if setup.checkpoint_only or not setup.eagle3 or setup.tp <= 1 or not self.covers(setup.version):
            return out
        explicit = la.enable_flashinfer_allreduce_fusion
        auto = (
            arch is not None
            and arch in auto_fusion_archs(setup.version)
            and not la.enable_dp_attention
            and la.nnodes == 1
            and (la.moe_a2a_backend or "none") == "none"
        )
        if not (explicit or auto):
            return out
        how = (
            "--enable-flashinfer-allreduce-fusion"
            if explicit
            else f"sglang turns it on by itself for {arch} on "
            "sm90/sm100 GPUs (H100/H200/B200), single node, without dp-attention or an a2a MoE backend"
        )
        out.add(
            ERROR,
            "tp-allreduce-fusion",
            f"tp {setup.tp} with flashinfer all-reduce fusion on sglang {setup.version}: the captured hidden_states + "
            "residual "
            "is a per-rank partial sum, so the draft gets garbage (no error)" + setup.once_eagle3,
            where="--enable-flashinfer-allreduce-fusion" if explicit else "--tp-size",
            found=how,
            expected="captured states after the all-reduce",
            fix="launch under `eagle3-patches run` (tp_allreduce_fusion_capture), or upgrade to sglang >= 0.5.14"
            + (
                "; or drop --enable-flashinfer-allreduce-fusion"
                if explicit
                else " (0.5.9 has no flag to turn the automatic fusion off)"
            ),
        )
        return out

    def upstream(self, module: ModuleType) -> str | None:
        path = os.path.join(os.path.dirname(getattr(module, "__file__", "") or ""), "models", "deepseek_v2.py")
        try:
            source = read_source_file(path, "sglang.srt.models.deepseek_v2")
        except OSError:
            return None
        if UPSTREAM_MARKER in source:
            return (
                "deepseek_v2.py captures aux states inside the decoder layer after the all-reduce "
                f"({UPSTREAM_MARKER}, sglang >= 0.5.14)"
            )
        return None

    def check(self, module: ModuleType) -> None:
        if FLAG not in getattr(module.ServerArgs, "__dataclass_fields__", {}):
            raise NotApplicable(f"ServerArgs has no {FLAG} field")
        adjust = expect_attr(module.ServerArgs, "_handle_model_specific_adjustments")
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(adjust, f"self.{FLAG} = True")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ServerArgs, "_handle_model_specific_adjustments", _adjust_then_check)


PATCH = TpAllreduceFusionCapture()
