"""eagle3_algorithm_guard: EAGLE (or NEXTN) with an EAGLE-3 draft is refused at start with the flag."""

from __future__ import annotations

import pytest
from support.releases import is_pinned, sglang_version

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.scenarios import launcher_outcomes
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.tiny_models import HIDDEN

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: EAGLE and EAGLE3 with the EAGLE-3 draft resolved as the launcher resolves them, stock
    and then with the patch set applied in the same process."""
    return run_check("eagle3_algorithm_guard")


@pytest.mark.stock
def test_stock_accepts_eagle_with_an_eagle3_draft(check):
    assert check.observations["stock"]["EAGLE"] == ("ok", "EAGLE")  # the silent misconfiguration
    assert check.bug == "present"


def test_guard_refuses_eagle_and_stays_silent_for_eagle3(check):
    assert check.status == PASSED, check.reason
    kind, message = check.observations["patched"]["EAGLE"]
    assert kind == "Eagle3ConfigError"
    assert "--speculative-algorithm EAGLE3" in message and "LlamaForCausalLMEagle3" in message
    assert check.observations["patched"]["EAGLE3"] == ("ok", "EAGLE3")


def test_guard_refuses_nextn_with_an_eagle3_draft_naming_the_flag(tiny):
    """NEXTN, sglang's other name for its EAGLE path, with an EAGLE-3 draft is the same silent misconfiguration."""
    cases = {"NEXTN": (str(tiny["kimi_k25"]), str(tiny["draft"]), "NEXTN")}
    kind, message = run_isolated(launcher_outcomes, cases, patches=["eagle3_algorithm_guard"])["NEXTN"]
    assert kind == "Eagle3ConfigError"
    assert (
        "--speculative-algorithm NEXTN with an EAGLE-3 draft" in message and "--speculative-algorithm EAGLE3" in message
    )


def _eagle1_format_draft(tiny, path, states: int):
    """The tiny draft saved in the EAGLE-1 format (``LlamaForCausalLMEagle``, no eagle_config), its fc taking
    ``states`` x hidden: 2 is a real EAGLE-1/2 draft (the token's embedding and one state), 3 an EAGLE-3 one."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny["draft"], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle"]
    del cfg["eagle_config"]
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(path / "model.safetensors"))
    tensors["fc.weight"] = torch.zeros(cfg["hidden_size"], states * cfg["hidden_size"])
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def test_guard_lets_an_eagle1_draft_run_with_eagle_and_refuses_an_eagle3_one(tiny, tmp_path):
    cases = {
        states: (str(tiny["kimi_k25"]), _eagle1_format_draft(tiny, tmp_path / f"fc-{states}", states), "EAGLE")
        for states in (2, 3)
    }
    out = run_isolated(launcher_outcomes, cases, patches=["eagle3_algorithm_guard"])
    assert out[2] == ("ok", "EAGLE"), out[2]
    kind, message = out[3]
    assert kind == "Eagle3ConfigError" and f"fc.weight takes {3 * HIDDEN} = 3 x hidden ({HIDDEN}) inputs" in message, (
        out[3]
    )


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN"])
def test_doctor_names_eagle_and_nextn_with_an_eagle3_draft(tiny, algorithm):
    from eagle3_patches.doctor import doctor

    launch = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tiny["kimi_k25"]),
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(tiny["draft"]),
    ]
    report = doctor(launch=launch, sglang_version="0.5.9")
    assert "algorithm-eagle-with-eagle3-draft" in report.codes("error")
    eagle3 = doctor(launch=[*launch[:-3], "EAGLE3", *launch[-2:]], sglang_version="0.5.9")
    assert "algorithm-eagle-with-eagle3-draft" not in eagle3.codes()


@pytest.mark.parametrize("upgrade", ["0", "1"])
def test_doctor_for_a_patched_server_says_refused_or_upgraded(tiny, monkeypatch, upgrade):
    """Where the server runs the patches, the doctor says what the guard will do: refuse at start, or (opted in)
    upgrade to EAGLE3 with a warning."""
    from eagle3_patches import settings
    from eagle3_patches.doctor import doctor

    monkeypatch.setenv(settings.UPGRADE_ALGORITHM, upgrade)
    settings.reload()
    launch = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tiny["kimi_k25"]),
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-draft-model-path",
        str(tiny["draft"]),
    ]
    report = doctor(launch=launch, sglang_version="0.5.9", with_patches=True)
    (finding,) = [f for f in report.findings if f.code == "algorithm-eagle-with-eagle3-draft"]
    if upgrade == "1":
        assert finding.severity == "warning" and "upgrades it to EAGLE3 with a warning" in finding.what
    else:
        assert finding.severity == "error" and "refuses this at start" in finding.what
        assert "upgrades" not in finding.what


def _outcomes_and_warnings(cases: dict) -> tuple[dict, list[str]]:
    import logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    keep = Keep()
    logging.getLogger("eagle3_patches").addHandler(keep)
    return launcher_outcomes(cases), keep.messages


@pytest.mark.runtime_only  # the fork diff's copy writes its warning to stderr, not through the eagle3_patches logger
def test_guard_upgrades_when_opted_in_and_says_so(tiny):
    cases = {"EAGLE": (str(tiny["kimi_k25"]), str(tiny["draft"]), "EAGLE")}
    out, warnings = run_isolated(
        _outcomes_and_warnings, cases, patches=["eagle3_algorithm_guard"], env={"EAGLE3_PATCHES_UPGRADE_ALGORITHM": "1"}
    )
    assert out["EAGLE"] == ("ok", "EAGLE3")
    assert [
        w
        for w in warnings
        if "--speculative-algorithm EAGLE with an EAGLE-3 draft" in w
        and "upgraded to EAGLE3 because EAGLE3_PATCHES_UPGRADE_ALGORITHM is set" in w
    ]


# --------------------------------------------------------------------------- EAGLE3 without a draft (sglang issue
# 36528)
def _without_draft(target: str, algorithm: str = "EAGLE3"):
    from eagle3_patches.testing import sglang_harness as h

    try:
        sa = h.launcher_server_args(
            h.server_args,
            target,
            speculative_algorithm=algorithm,
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
        )
    except Exception as exc:  # noqa: BLE001
        return (type(exc).__name__, str(exc))
    return ("ok", sa.speculative_draft_model_path)


@pytest.mark.stock
def test_stock_takes_the_target_itself_as_the_eagle3_draft(tiny):
    """DeepSeek-V3 family: sglang's MTP default fills the draft path with the target's own path."""
    kind, draft = run_isolated(_without_draft, str(tiny["deepseek_v3"]), patches=None)
    if kind == "ok" and draft is None and not is_pinned():  # observed on 0.5.23: the default no longer fills the path
        pytest.skip(f"sglang {sglang_version()} leaves the draft path empty: the stock behaviour is not observed here")
    assert kind == "ok" and draft == str(tiny["deepseek_v3"])


def test_guard_refuses_eagle3_without_a_draft_naming_the_flag(tiny):
    kind, message = run_isolated(_without_draft, str(tiny["deepseek_v3"]), patches=["eagle3_algorithm_guard"])
    assert kind == "Eagle3ConfigError"
    assert "--speculative-draft-model-path" in message and "NEXTN" in message and "36528" in message


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_guard_lets_mtp_without_a_draft_through(tiny, algorithm):
    """NEXTN (or EAGLE) without a draft path: a DeepSeek-V3-family target speculating with its own MTP layers, which
    sglang's default takes as the draft; nothing for the guard to refuse."""
    stock = run_isolated(_without_draft, str(tiny["deepseek_v3"]), algorithm, patches=None)
    patched = run_isolated(_without_draft, str(tiny["deepseek_v3"]), algorithm, patches=["eagle3_algorithm_guard"])
    assert patched == stock and patched[0] == "ok", (stock, patched)


def test_doctor_names_eagle3_without_a_draft_and_stays_silent_with_one(tiny):
    from eagle3_patches.doctor import doctor

    launch = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tiny["deepseek_v3"]),
        "--speculative-algorithm",
        "EAGLE3",
    ]
    assert "algorithm-eagle3-without-draft" in doctor(launch=launch, sglang_version="0.5.9").codes("error")
    with_draft = doctor(launch=[*launch, "--speculative-draft-model-path", str(tiny["draft"])], sglang_version="0.5.9")
    assert "algorithm-eagle3-without-draft" not in with_draft.codes()
    assert (
        "algorithm-eagle3-without-draft" not in doctor(tiny["deepseek_v3"], sglang_version="0.5.9").codes()
    )  # no launch given


# --------------------------------------------------------------------------- the algorithm's spelling
def test_guard_reads_the_algorithm_in_any_case_as_sglang_does(tiny):
    """sglang's ``SpeculativeAlgorithm.from_string`` upper-cases the name, so ``sglang.Engine(
    speculative_algorithm="eagle")`` serves EAGLE; the guard refuses the lowercase spellings as it refuses the
    uppercase ones, and lets ``eagle3`` with its draft through."""
    target, draft = str(tiny["kimi_k25"]), str(tiny["draft"])
    cases = {
        "eagle": (target, draft, "eagle"),
        "nextn": (target, draft, "nextn"),
        "eagle3_without_draft": (target, "", "eagle3"),
        "eagle3": (target, draft, "eagle3"),
    }
    out = run_isolated(launcher_outcomes, cases, patches=["eagle3_algorithm_guard"])
    for name, shown in (("eagle", "EAGLE"), ("nextn", "NEXTN")):
        kind, message = out[name]
        assert kind == "Eagle3ConfigError", (name, out[name])
        assert f"--speculative-algorithm {shown} with an EAGLE-3 draft" in message
        assert f"--speculative-algorithm {name} --speculative-draft-model-path {draft}" in message  # as given
    kind, message = out["eagle3_without_draft"]
    assert kind == "Eagle3ConfigError" and "without --speculative-draft-model-path" in message, out[
        "eagle3_without_draft"
    ]
    assert out["eagle3"] == ("ok", "eagle3")
