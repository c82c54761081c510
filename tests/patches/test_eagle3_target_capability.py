"""eagle3_target_capability: a target that cannot capture is refused once, in the launcher.

The selftest check ``eagle3_target_capability`` resolves the flags stock and then with the patch set applied, for
a config-only GPT-2 target (a real sglang model class without the capture hooks, on every release) and the tiny
Kimi-K2.5 and DeepSeek-V3 targets.
"""

from __future__ import annotations

import pytest
from support.releases import stock_bug

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.scenarios import launcher_outcomes
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def check(run_check):
    return run_check("eagle3_target_capability")


@pytest.fixture(scope="module")
def cases(tiny):
    return {
        "kimi": (str(tiny["kimi_k25"]), str(tiny["draft"]), "EAGLE3"),
        "deepseek": (str(tiny["deepseek_v3"]), str(tiny["draft"]), "EAGLE3"),
    }


@pytest.mark.stock
def test_stock_accepts_a_target_that_cannot_capture(check):
    """Nothing in sglang checks the target class at start: the launcher resolves EAGLE3 for GPT-2."""
    assert check.observations["stock"]["missing"]["no_capture"] == [
        "set_eagle3_layers_to_capture",
        "get_embed_and_head",
    ]
    assert check.observations["stock"]["outcomes"]["no_capture"] == ("ok", "EAGLE3")
    assert check.bug == "present"


def test_a_target_that_cannot_capture_is_refused_and_capable_ones_pass_silently(check):
    assert check.status == PASSED, check.reason
    outcomes = check.observations["patched"]["outcomes"]
    kind, message = outcomes["no_capture"]
    assert kind in ("Eagle3TargetError", "Eagle3ConfigError")  # the second: the fork-path diff's own class
    assert "GPT2LMHeadModel" in message and "it has no set_eagle3_layers_to_capture / get_embed_and_head" in message
    assert outcomes["kimi"] == outcomes["deepseek"] == ("ok", "EAGLE3")


@pytest.mark.runtime_only
@stock_bug("kimi_k25_eagle3_delegation")  # from 0.5.10 the Kimi class has the hooks itself
def test_kimi_without_the_delegation_is_refused_in_the_launcher(cases):
    out = run_isolated(
        launcher_outcomes, cases, patches="all", env={"EAGLE3_PATCHES_DISABLE": "kimi_k25_eagle3_delegation"}
    )
    kind, message = out["kimi"]
    assert kind == "Eagle3TargetError"
    assert "KimiK25ForConditionalGeneration" in message and "set_eagle3_layers_to_capture" in message
    assert "kimi_k25_eagle3_delegation" in message and "or upgrade sglang to >= 0.5.10" in message  # the fix
    assert out["deepseek"] == ("ok", "EAGLE3")


@pytest.mark.stock
@stock_bug("kimi_k25_eagle3_delegation")
def test_stock_accepts_the_kimi_target_and_fails_later_in_each_rank(check):
    """Stock 0.5.9 lets ServerArgs through; the AttributeError comes per rank (tests/sglang, tests/distributed)."""
    assert check.observations["stock"]["outcomes"]["kimi"] == ("ok", "EAGLE3")
    assert check.observations["stock"]["missing"]["kimi"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]


def _check_outcomes(cases: dict) -> dict:
    """The launcher check itself, on resolved server arguments ``(model path, algorithm)``."""
    from types import SimpleNamespace

    from eagle3_patches.patches.eagle3_target_capability import check_target_supports_eagle3
    from eagle3_patches.selftest.scenarios import outcome

    def check(path, algorithm):
        return outcome(check_target_supports_eagle3, SimpleNamespace(model_path=path, speculative_algorithm=algorithm))

    out = {name: check(*case) for name, case in cases.items()}
    # sglang serves an architecture it does not know through its Transformers backend; where that backend did not
    # import (sglang logs "Ignore import error"), resolving the architecture fails: sglang's own error, later
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models.pop("TransformersForCausalLM", None)
    out["unknown_without_backend"] = check(*cases["unknown"])
    return out


@pytest.mark.runtime_only  # the fork path carries its own copy of the check (tests/fork)
def test_only_eagle3_with_a_target_class_it_can_name_is_checked(tiny_root, tmp_path):
    """EAGLE3 on a target without the hooks is refused (an unknown architecture too: sglang would serve it through its
    Transformers backend, which has none); other algorithms on the same target, a hub id, an unreadable config.json
    and an architecture sglang cannot resolve at all are let through: sglang reports those itself."""
    import json

    from eagle3_patches.selftest.checkpoints import no_capture_target

    gpt2 = str(no_capture_target(tiny_root / "tiny-gpt2-config-only"))
    (tmp_path / "bad-json").mkdir()
    (tmp_path / "bad-json" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]')
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    cases = {
        "eagle3": (gpt2, "EAGLE3"),
        "eagle": (gpt2, "EAGLE"),
        "standalone": (gpt2, "STANDALONE"),
        "none": (gpt2, None),
        "hub_id": ("some-org/some-model", "EAGLE3"),
        "bad_json": (str(tmp_path / "bad-json"), "EAGLE3"),
        "unknown": (str(tmp_path / "unknown"), "EAGLE3"),
    }
    out = run_isolated(_check_outcomes, cases)
    kind, message = out.pop("eagle3")
    assert kind == "Eagle3TargetError" and "GPT2LMHeadModel cannot serve an EAGLE-3 draft" in message
    kind, message = out.pop("unknown")
    assert kind == "Eagle3TargetError" and "TransformersForCausalLM cannot serve an EAGLE-3 draft" in message
    assert out == {
        name: ("ok", None) for name in [*cases, "unknown_without_backend"] if name not in ("eagle3", "unknown")
    }


def _partial_outcomes(gpt2: str, root: str) -> dict:
    """Targets that have one of the two hooks (real sglang classes: GPT-2 with one hook added), registered in sglang's
    own ModelRegistry, through the launcher check."""
    import json
    import shutil
    from pathlib import Path
    from types import SimpleNamespace

    from sglang.srt.models.gpt2 import GPT2LMHeadModel
    from sglang.srt.models.registry import ModelRegistry

    from eagle3_patches.patches.eagle3_target_capability import check_target_supports_eagle3
    from eagle3_patches.selftest.scenarios import outcome

    class OnlyCaptureHook(GPT2LMHeadModel):
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            pass

    class OnlyEmbedAndHead(GPT2LMHeadModel):
        def get_embed_and_head(self):
            return None, None

    class BothHooks(OnlyCaptureHook, OnlyEmbedAndHead):
        pass

    out = {}
    for cls in (OnlyCaptureHook, OnlyEmbedAndHead, BothHooks):
        ModelRegistry.models[cls.__name__] = cls
        path = Path(root) / cls.__name__
        shutil.copytree(gpt2, path)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "architectures": [cls.__name__]}))
        args = SimpleNamespace(model_path=str(path), speculative_algorithm="EAGLE3")
        out[cls.__name__] = outcome(check_target_supports_eagle3, args)
    return out


@pytest.mark.runtime_only  # the fork path carries its own copy of the check (tests/fork)
def test_a_target_with_one_hook_of_two_is_refused_naming_the_missing_one(tiny_root, tmp_path):
    """A class that can capture but cannot hand over its embedding and head (or the reverse) would pass the launcher
    and kill every TP rank with a bare AttributeError once the target has loaded: it is refused at start like one
    with neither, naming the hook it lacks; with both it passes."""
    from eagle3_patches.selftest.checkpoints import no_capture_target

    gpt2 = str(no_capture_target(tiny_root / "tiny-gpt2-config-only"))
    out = run_isolated(_partial_outcomes, gpt2, str(tmp_path))
    for name, missing, present in [
        ("OnlyCaptureHook", "get_embed_and_head", "set_eagle3_layers_to_capture"),
        ("OnlyEmbedAndHead", "set_eagle3_layers_to_capture", "get_embed_and_head"),
    ]:
        kind, message = out[name]
        assert kind == "Eagle3TargetError", (name, kind, message)
        assert f"{name} cannot serve an EAGLE-3 draft" in message
        assert message.split("it has no ", 1)[1].splitlines()[0] == missing, message
        assert f"without {missing}\n" in message and present not in message.split("found:", 1)[1].splitlines()[0]
    assert out["BothHooks"] == ("ok", None)


@pytest.mark.runtime_only  # the fork path carries its own copy of the check (tests/fork)
def test_a_lowercase_eagle3_on_a_target_that_cannot_capture_is_refused(tiny_root, tiny):
    """sglang upper-cases the algorithm's name (``SpeculativeAlgorithm.from_string``): ``sglang.Engine(
    speculative_algorithm="eagle3")`` serves EAGLE-3, so the launcher check refuses GPT-2 under that spelling too;
    the Kimi-K2.5 target with its delegation passes."""
    from eagle3_patches.selftest.checkpoints import no_capture_target

    gpt2 = str(no_capture_target(tiny_root / "tiny-gpt2-config-only"))
    cases = {
        "gpt2": (gpt2, str(tiny["draft"]), "eagle3"),
        "kimi": (str(tiny["kimi_k25"]), str(tiny["draft"]), "eagle3"),
    }
    out = run_isolated(launcher_outcomes, cases, patches="all")
    kind, message = out["gpt2"]
    assert kind == "Eagle3TargetError", out["gpt2"]
    assert "GPT2LMHeadModel cannot serve an EAGLE-3 draft" in message
    assert out["kimi"] == ("ok", "eagle3")
