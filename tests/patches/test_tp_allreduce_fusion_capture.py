"""tp_allreduce_fusion_capture: TP > 1 + EAGLE3 turns flashinfer all-reduce fusion off.

The fused kernel needs sm90/sm100 and flashinfer, so what is tested is the decision, on the
real ``ServerArgs`` of sglang 0.5.9 built for the tiny Kimi-K2.5 / DeepSeek-V3 targets.  The
only stand-ins are the hardware facts ``ServerArgs`` reads (``is_sm90_supported`` /
``is_sm100_supported`` / ``get_device_name`` as imported into ``sglang.srt.server_args``),
replaced inside the isolated child process only.
"""

from __future__ import annotations

import pytest
from support.releases import only_release, sglang_version

from eagle3_patches.patches import tp_allreduce_fusion_capture as tafc
from eagle3_patches.selftest import PASSED


@pytest.fixture(scope="module")
def decisions(run_check) -> dict:
    """The selftest check's observations (``fusion_decisions``, an H200 / B200 standing in for this CPU
    machine's hardware facts); skipped where the check is (sglang >= 0.5.14 captures after the all-reduce)."""
    check = run_check("tp_allreduce_fusion_capture")
    assert check.status == PASSED, check.reason
    return check.observations


# --------------------------------------------------------------------------- real ServerArgs, isolated
@pytest.mark.stock
@pytest.mark.sglang
def test_stock_enables_fusion_with_eagle3_and_tp2(decisions):
    assert decisions["machine_stock"]["fusion"] is False  # the sm90 stand-in is what turns it on
    for name in ("kimi", "deepseek"):
        stock = decisions["stock"][name]
        assert stock["algorithm"] == "EAGLE3"
        assert stock["fusion"] is True, name  # the bug condition: fusion on while capturing with TP 2
        assert stock["logs"] == []


@pytest.mark.runtime_only
@pytest.mark.sglang
def test_patched_turns_fusion_off_and_says_why(decisions):
    assert decisions["state"] == "applied", decisions["reason"]
    assert decisions["upstream"] is None
    for case in ("kimi_eagle3_tp2", "deepseek_eagle3_tp2", "kimi_eagle3_tp2_sm100"):
        got = decisions["patched"][case]
        assert got["fusion"] is False, case
        assert len(got["logs"]) == 1, case
        level, message = got["logs"][0]
        assert level == "WARNING"
        assert "all-reduce fusion turned off" in message
        assert "enabled it automatically" in message
        assert "EAGLE3" in message and "--tp-size 2" in message
        assert "partial sums" in message
        assert f"EAGLE3_PATCHES_DISABLE={tafc.NAME}" in message


@pytest.mark.runtime_only
@pytest.mark.sglang
def test_patched_overrides_an_explicit_flag_and_says_so(decisions):
    got = decisions["patched"]["kimi_eagle3_tp2_explicit"]
    assert got["fusion"] is False
    assert len(got["logs"]) == 1
    assert got["logs"][0][0] == "WARNING"
    assert "--enable-flashinfer-allreduce-fusion was passed explicitly and is overridden" in got["logs"][0][1]


@pytest.mark.sglang
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            "kimi_eagle3_tp1", marks=only_release("<0.5.10", "later releases do not enable the fusion at TP 1")
        ),
        "kimi_none_tp2",
        "kimi_eagle_tp2",
        "kimi_eagle_tp2_explicit",
    ],
)
@pytest.mark.runtime_only
def test_patched_stays_silent_where_nothing_is_captured_mid_model(decisions, case):
    """TP 1 (no all-reduce), no speculation, EAGLE-2 (final state only): fusion left on, no log."""
    got = decisions["patched"][case]
    assert got["fusion"] is True
    assert got["logs"] == []


@pytest.mark.runtime_only
@pytest.mark.sglang
def test_revert_restores_the_original(decisions):
    assert decisions["revert_identity"]
    assert decisions["reverted"]["fusion"] is True
    assert decisions["reverted"]["logs"] == []


# --------------------------------------------------------------------------- probe and decision alone
def test_upstream_probe_reads_deepseek_v2_as_text(tmp_path):
    import types

    pkg = tmp_path / "srt"
    (pkg / "models").mkdir(parents=True)
    module = types.ModuleType("fake_server_args")
    module.__file__ = str(pkg / "server_args.py")
    (pkg / "models" / "deepseek_v2.py").write_text("aux_hidden_states.append(hidden_states + residual)\n")
    assert tafc.PATCH.upstream(module) is None
    (pkg / "models" / "deepseek_v2.py").write_text("layer(..., captured_last_layer_outputs=aux)\n")
    assert "0.5.14" in tafc.PATCH.upstream(module)
    (pkg / "models" / "deepseek_v2.py").unlink()
    assert tafc.PATCH.upstream(module) is None


def test_decision_table():
    from types import SimpleNamespace as NS

    assert tafc.fusion_breaks_capture(
        NS(speculative_algorithm="EAGLE3", tp_size=2, enable_flashinfer_allreduce_fusion=True)
    )
    assert tafc.fusion_breaks_capture(
        NS(speculative_algorithm="eagle3", tp_size=8, enable_flashinfer_allreduce_fusion=True)
    )
    assert not tafc.fusion_breaks_capture(
        NS(speculative_algorithm="EAGLE3", tp_size=2, enable_flashinfer_allreduce_fusion=False)
    )
    assert not tafc.fusion_breaks_capture(
        NS(speculative_algorithm="EAGLE3", tp_size=1, enable_flashinfer_allreduce_fusion=True)
    )
    assert not tafc.fusion_breaks_capture(
        NS(speculative_algorithm="EAGLE", tp_size=2, enable_flashinfer_allreduce_fusion=True)
    )
    assert not tafc.fusion_breaks_capture(
        NS(speculative_algorithm=None, tp_size=2, enable_flashinfer_allreduce_fusion=True)
    )


def test_version_gate():
    from packaging.version import Version

    assert Version("0.5.9") in tafc.PATCH.applies_to
    assert Version("0.5.13") in tafc.PATCH.applies_to
    assert Version("0.5.14") not in tafc.PATCH.applies_to


@pytest.mark.sglang
@only_release("<0.5.14", "from 0.5.14 sglang captures after the all-reduce: the patch and its doctor rule stand down")
def test_the_doctor_names_the_architectures_sglang_turns_the_fusion_on_for():
    """The doctor flags a TP > 1 EAGLE3 launch for exactly the targets the installed sglang turns the fusion on
    for by itself: the architectures its ``_handle_model_specific_adjustments`` names in the branch that sets the
    flag (read from sglang's source with ``ast``, not imported)."""
    import ast
    import importlib.util
    from pathlib import Path

    package = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])  # sglang is not imported
    source = (package / "srt" / "server_args.py").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    method = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_handle_model_specific_adjustments"
    )
    named: set[str] = set()
    for node in ast.walk(method):
        sets_flag = isinstance(node, ast.If) and any(
            isinstance(t, ast.Assign)
            and ast.unparse(t.targets[0]) == f"self.{tafc.FLAG}"
            and isinstance(t.value, ast.Constant)
            and t.value.value is True
            for t in node.body
        )
        if sets_flag:
            named |= {
                c.value
                for c in ast.walk(node.test)
                if isinstance(c, ast.Constant)
                and isinstance(c.value, str)
                and c.value.endswith(("ForCausalLM", "ForConditionalGeneration"))
            }
    assert "KimiK25ForConditionalGeneration" in named
    assert named == tafc.auto_fusion_archs(sglang_version())
