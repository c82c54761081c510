"""draft_chunked_prefix_cache: the draft's model runner leaves the chunked-prefix-cache switch the MLA target set."""

from __future__ import annotations

import pytest
from support.releases import requires_patch

from eagle3_patches.diagnostic import ERROR, INFO
from eagle3_patches.doctor import doctor
from eagle3_patches.selftest import PASSED


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: the real runners' own adjustment on their shared ServerArgs, stock then patched."""
    return run_check("draft_chunked_prefix_cache")


@pytest.mark.sglang
@pytest.mark.stock
@requires_patch("draft_chunked_prefix_cache")
def test_stock_draft_turns_off_the_targets_chunked_prefix_cache(check):
    assert check.observations["stock"] == ("ok", {"target": False, "draft": True})
    assert check.bug == "present"


@pytest.mark.sglang
@requires_patch("draft_chunked_prefix_cache")
def test_patched_draft_leaves_the_switch_as_the_target_set_it(check):
    assert check.status == PASSED, check.reason
    assert check.observations["patched"] == ("ok", {"target": False, "draft": False})


EAGLE3 = "--speculative-algorithm EAGLE3"
CODE = "draft-chunked-prefix-cache"


@pytest.mark.parametrize("backend, severity", [("fa3", ERROR), ("flashmla", ERROR), (None, INFO)])
def test_the_doctor_flags_an_mla_target_with_a_llama_draft(tiny, backend, severity):
    launch = EAGLE3 + (f" --attention-backend {backend}" if backend else "")
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9", launch=launch)
    assert CODE in r.codes(severity), r.format()
    assert "upgrade to sglang >= 0.5.16" in r.format() and "--disable-chunked-prefix-cache" in r.format()


#: every backend whose MLA kernels read the chunked prefix cache, spelt as ``--attention-backend`` takes it (written
#: out, not read from the patch: a name the doctor's table forgets or spells another way must fail here)
READ_THE_PREFIX_CACHE = (
    "flashinfer",
    "fa3",
    "fa4",
    "flashmla",
    "cutedsl_mla",
    "cutlass_mla",
    "trtllm_mla",
    "tokenspeed_mla",
)


@pytest.mark.parametrize("backend", READ_THE_PREFIX_CACHE)
def test_the_doctor_flags_each_backend_that_reads_the_chunked_prefix_cache(tiny, backend):
    r = doctor(
        tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.15", launch=f"{EAGLE3} --attention-backend {backend}"
    )
    assert CODE in r.codes(ERROR), r.format()
    assert f"--attention-backend {backend}" in r.format()


def _release_backends() -> list[str]:
    """``CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS`` as the installed release's model_runner.py writes it."""
    import ast
    from importlib.util import find_spec
    from pathlib import Path

    (root,) = find_spec("sglang").submodule_search_locations
    tree = ast.parse((Path(root) / "srt" / "model_executor" / "model_runner.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    pytest.fail("model_runner.py defines no CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS")


@pytest.mark.sglang
@requires_patch("draft_chunked_prefix_cache")
def test_the_doctor_flags_every_backend_this_release_reads_the_chunked_prefix_cache_with(tiny):
    from support.releases import sglang_version

    version = str(sglang_version())
    missed = []
    for backend in _release_backends():
        r = doctor(
            tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=f"{EAGLE3} --attention-backend {backend}"
        )
        if CODE not in r.codes(ERROR):
            missed.append(backend)
    assert not missed, f"sglang {version} reads the chunked prefix cache with {missed}; the doctor says nothing"


def test_the_doctor_notes_the_fix_with_the_patch(tiny):
    r = doctor(
        tiny["kimi_k25"],
        tiny["draft"],
        sglang_version="0.5.15",
        launch=EAGLE3 + " --attention-backend fa3",
        with_patches=True,
    )
    assert CODE in r.codes(INFO) and CODE not in r.codes(ERROR), r.format()
    assert "fixed by eagle3-patches' draft_chunked_prefix_cache" in r.format()


@pytest.mark.parametrize(
    "version, launch",
    [
        ("0.5.16", EAGLE3 + " --attention-backend fa3"),  # the draft runner returns before it sets the switch
        ("0.5.9", EAGLE3 + " --attention-backend triton"),  # a backend that never reads the chunked prefix cache
        ("0.5.9", "--speculative-algorithm STANDALONE --attention-backend fa3"),  # no EAGLE-3 draft
    ],
)
def test_the_doctor_is_silent_where_the_switch_stays(tiny, version, launch):
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=launch)
    assert CODE not in r.codes(), r.format()


def test_the_doctor_is_silent_for_an_mla_draft(tiny, tmp_path):
    """An MLA draft's own adjustment leaves the switch on: nothing to report."""
    import json
    import shutil

    draft = tmp_path / "mla-draft"
    shutil.copytree(tiny["draft"], draft)
    config = json.loads((draft / "config.json").read_text())
    config["architectures"] = ["Eagle3DeepseekV2ForCausalLM"]
    (draft / "config.json").write_text(json.dumps(config))
    r = doctor(tiny["kimi_k25"], str(draft), sglang_version="0.5.9", launch=EAGLE3 + " --attention-backend fa3")
    assert CODE not in r.codes(), r.format()


def test_the_targets_own_decision_to_turn_the_cache_off_stands():
    """Only the draft's runner is held to the target's switch: the target's runner turning it off itself (a backend
    or a model that cannot read the cache) is kept."""
    from types import SimpleNamespace

    from eagle3_patches.patches.draft_chunked_prefix_cache import SWITCH, _draft_leaves_the_switch

    for is_draft, kept in ((False, True), (True, False)):
        args = SimpleNamespace(**{SWITCH: False})
        runner = SimpleNamespace(server_args=args, is_draft_worker=is_draft)
        _draft_leaves_the_switch(lambda a=args: setattr(a, SWITCH, True), runner, (), {})
        assert getattr(args, SWITCH) is kept, ("draft" if is_draft else "target", getattr(args, SWITCH))


def test_the_check_refuses_a_model_runner_that_does_not_know_its_draft_runner():
    """A release whose ModelRunner has no is_draft_worker cannot tell the draft's runner from the target's."""
    from types import SimpleNamespace

    from eagle3_patches.patches.draft_chunked_prefix_cache import PATCH
    from eagle3_patches.registry import NotApplicable

    class ModelRunner:
        def __init__(self):
            self.server_args = None

        def model_specific_adjustment(self):
            server_args = self.server_args
            server_args.disable_chunked_prefix_cache = True

    with pytest.raises(NotApplicable):
        PATCH.check(SimpleNamespace(ModelRunner=ModelRunner))


def test_a_draft_config_that_names_no_architecture_is_a_non_mla_draft(tiny, tmp_path):
    import json
    import shutil

    draft = tmp_path / "no-architectures"
    shutil.copytree(tiny["draft"], draft)
    config = json.loads((draft / "config.json").read_text())
    config["architectures"] = []
    (draft / "config.json").write_text(json.dumps(config))
    r = doctor(tiny["kimi_k25"], draft, sglang_version="0.5.9", launch=EAGLE3 + " --attention-backend fa3")
    (f,) = [f for f in r.findings if f.code == CODE]
    assert f.severity == ERROR and f.found.endswith("with a non-MLA draft"), r.format()


def test_the_check_refuses_an_adjustment_that_no_longer_sets_the_switch():
    """sglang 0.5.16's layout: the switch is set outside model_specific_adjustment, nothing to put back."""
    from types import SimpleNamespace

    from eagle3_patches.patches.draft_chunked_prefix_cache import PATCH
    from eagle3_patches.registry import NotApplicable

    class ModelRunner:
        def __init__(self):
            self.is_draft_worker = False

        def model_specific_adjustment(self):
            return None

    with pytest.raises(NotApplicable):
        PATCH.check(SimpleNamespace(ModelRunner=ModelRunner))


def test_only_a_launch_naming_no_backend_is_told_sglang_picks_one(tiny):
    named = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9", launch=EAGLE3 + " --attention-backend fa3")
    unnamed = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9", launch=EAGLE3)
    picks = "where sglang picks a backend that reads it"
    assert picks in unnamed.format() and picks not in named.format()
