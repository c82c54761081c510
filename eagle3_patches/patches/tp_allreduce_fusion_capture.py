"""tp_allreduce_fusion_capture

Bug: with TP > 1 and EAGLE-3 aux capture, flashinfer all-reduce fusion defers each layer's
MLP/MoE all-reduce into the next layer, so the captured ``hidden_states + residual`` are per-rank partial sums.
Releases: sglang >=0.5.8,<0.5.14 (0.5.14 captures inside the decoder layer, after the all-reduce).
Upstream probe: ``models/deepseek_v2.py`` (read as text, not imported) passes
``captured_last_layer_outputs`` to its decoder layers, as 0.5.14 does.

Symptom: sglang auto-enables ``enable_flashinfer_allreduce_fusion`` for DeepSeek-V3 and
Kimi-K2.5 (and GptOss, Glm4Moe, Qwen3Moe) on sm90/sm100, single node, no dp-attention
(``ServerArgs._handle_model_specific_adjustments``; 0.5.9 has no flag to turn it off).
With ``--tp-size`` > 1 the draft then gets aux states that differ per rank and from the
real layer outputs: lower accept length, no error.

The patch wraps ``ServerArgs._handle_model_specific_adjustments``: after sglang's own
adjustment, when the speculative algorithm is EAGLE3, ``tp_size`` > 1 and the fusion is on,
it turns the fusion off and logs a warning (logger ``eagle3_patches``) saying why.  An
explicit ``--enable-flashinfer-allreduce-fusion`` is overridden too (correct aux states
matter more than the fused kernel's latency), and the warning says the flag was overridden;
``EAGLE3_PATCHES_DISABLE=tp_allreduce_fusion_capture`` keeps the fusion.  EAGLE (EAGLE-2),
NEXTN, no speculation and TP = 1 are left alone: nothing is captured mid-model there, or
there is no all-reduce to defer.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

from packaging.specifiers import SpecifierSet

from .. import settings
from ..diagnostic import ERROR, Diagnostics
from ..registry import NotApplicable, Patch, Saver, expect_attr, expect_source, read_source_file

logger = logging.getLogger("eagle3_patches")

NAME = "tp_allreduce_fusion_capture"
FLAG = "enable_flashinfer_allreduce_fusion"
UPSTREAM_MARKER = "captured_last_layer_outputs"
#: the architectures for which sglang turns the fusion on by itself (``ServerArgs._handle_model_specific_adjustments``),
#: by the release that added them to its list (read from each release's source, 0.5.9 - 0.5.13.post1; 0.5.8, not
#: read, is given 0.5.9's list)
AUTO_FUSION_ARCHS_ADDED = (
    ("0.5.8", ("DeepseekV3ForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
               "Qwen3MoeForCausalLM", "KimiK25ForConditionalGeneration")),
    ("0.5.10", ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")),
    ("0.5.11", ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "Qwen3NextForCausalLM")),
    ("0.5.12", ("InternS2PreviewForConditionalGeneration",)),
    ("0.5.13", ("MistralLarge3ForCausalLM",)),
)


def auto_fusion_archs(version) -> frozenset[str]:
    """The architectures sglang ``version`` turns the fusion on for by itself (sm90/sm100, single node, ...)."""
    from packaging.version import Version

    release = Version(str(version)).release
    return frozenset(arch for first, archs in AUTO_FUSION_ARCHS_ADDED if release >= Version(first).release
                     for arch in archs)


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
    order = 40
    summary = "TP > 1 + EAGLE3: flashinfer all-reduce fusion is turned off so aux states are full sums"
    module = "sglang.srt.server_args"
    applies_to = SpecifierSet(">=0.5.8,<0.5.14")

    def preflight(self, setup) -> Diagnostics:
        out = Diagnostics()
        la, tv = setup.launch, setup.target
        if setup.checkpoint_only or not setup.eagle3 or setup.tp <= 1 or not self.covers(setup.version):
            return out
        explicit = la.enable_flashinfer_allreduce_fusion
        auto = (tv is not None and tv.arch in auto_fusion_archs(setup.version) and not la.enable_dp_attention and la.nnodes == 1
                and (la.moe_a2a_backend or "none") == "none")
        if not (explicit or auto):
            return out
        how = ("--enable-flashinfer-allreduce-fusion" if explicit else f"sglang turns it on by itself for {tv.arch} on "
               "sm90/sm100 GPUs (H100/H200/B200), single node, without dp-attention or an a2a MoE backend")
        out.add(
            ERROR,
            "tp-allreduce-fusion",
            f"tp {setup.tp} with flashinfer all-reduce fusion on sglang {setup.version}: the captured hidden_states + residual "
            "is a per-rank partial sum, so the draft gets garbage (no error)" + setup.once_eagle3,
            where="--enable-flashinfer-allreduce-fusion" if explicit else "--tp-size",
            found=how,
            expected="captured states after the all-reduce",
            fix="launch under `eagle3-patches run` (tp_allreduce_fusion_capture), or upgrade to sglang >= 0.5.14"
            + ("; or drop --enable-flashinfer-allreduce-fusion" if explicit else " (0.5.9 has no flag to turn the automatic fusion off)"),
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
        expect_source(adjust, f"self.{FLAG} = True")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ServerArgs, "_handle_model_specific_adjustments", _adjust_then_check)


PATCH = TpAllreduceFusionCapture()
