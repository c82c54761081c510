"""sglang's own plugin entry point in the real server (sglang >= 0.5.11): a plain
``python -m sglang.launch_server ...`` with eagle3-patches installed, no ``eagle3-patches run``.

On this CPU-only machine the CPU profile still comes in through its bootstrap (``PYTHONPATH``,
``EAGLE3_PATCHES_CPU_PROFILE=1``, no ``EAGLE3_PATCHES_APPLY``: ``Server(wrapper=False)``), which never applies
a patch; on a GPU host nothing but the installed package is needed.  So every patch and instrument below
came in through ``sglang.srt.plugins.load_plugins()``, which sglang calls in the launcher, in each scheduler
(each TP rank) and, from 0.5.23, in the detokenizer.
"""

from __future__ import annotations

import re

import pytest
from e2e_servers import MAX_NEW_TOKENS, PROMPTS, SAMPLED_TOKENS, SAMPLING, SAMPLING_PROMPT, probe_records, serve_or_fail
from support.releases import only_release

from eagle3_patches import settings
from eagle3_patches.testing import tiny_models
from eagle3_patches.testing.server import mean_accept_length, speculative_flags

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(900),
    only_release(">=0.5.11", "sglang.srt.plugins arrived in 0.5.11 (0.5.9 / 0.5.10: `eagle3-patches run`)"),
]

PLUGIN_LINE = re.compile(r"eagle3-patches: active in pid (\d+) through the sglang plugin entry point: (.*)")
#: aux_capture_validation's line, on the releases it applies to
RANK_LINE = re.compile(r"eagle3-patches: tp rank \d+/\d+ pid (\d+): .*?; (\S+=.*)$", re.M)


@pytest.fixture(scope="module")
def plain(models, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("plugin")
    out = serve_or_fail(
        "plain-launch-server",
        models["target"],
        speculative_flags(models["draft"]),
        tmp,
        PROMPTS[:2],
        wrapper=False,
        env={settings.PROBE: str(tmp / "probe")},
        # a few sampled requests: sglang's sampling verify runs on this release (tests/e2e/test_sampling.py compares
        # the distributions, on CI's pinned release and in the matrix on every release)
        then=[(name, [SAMPLING_PROMPT] * 8, params) for name, params in SAMPLING.items()],
    )
    assert settings.APPLY not in out["env"] and "eagle3_patches run" not in " ".join(out["command"])
    out["said"] = {int(pid): _states(states) for pid, states in PLUGIN_LINE.findall(out["log"])}
    out["probe"] = probe_records(tmp / "probe")
    return out


def _states(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.strip().split(", "))


def test_the_launcher_and_every_scheduler_say_they_run_the_patch_set(plain):
    said = plain["said"]
    schedulers = {r["pid"] for r in plain["probe"]}
    assert plain["pid"] in said, f"the launcher (pid {plain['pid']}) said nothing: {sorted(said)}"
    assert schedulers and schedulers <= set(said), f"schedulers {sorted(schedulers)}, plugin lines {sorted(said)}"
    for pid, states in said.items():
        assert "disabled" not in states.values() and states["eagle3_fc_guard"] in ("pending", "applied"), (pid, states)
        assert states["eagle3_probe"] in ("pending", "applied"), (pid, states)  # the instrument follows its setting


def test_the_scheduler_feeds_the_draft_fc_3h_through_the_plugins_patches(plain):
    extend = [r for r in plain["probe"] if r.get("hop") == "draft_input" and r.get("fc_applied")]
    assert extend and {r["width"] for r in extend} == {3 * tiny_models.HIDDEN}, plain["probe"][:5]
    for pid, states in RANK_LINE.findall(plain["log"]):  # where aux_capture_validation applies (< 0.5.13)
        assert _states(states)["eagle3_fc_guard"] == "applied" and int(pid) in plain["said"]


def test_speculation_through_the_plugin_keeps_the_trained_accept_length(plain, figure):
    accept = mean_accept_length(plain["responses"])
    figure(f"plain launch_server, patches from the sglang plugin: mean accept length {accept:.2f}")
    assert all(len(o) == MAX_NEW_TOKENS for o in plain["outputs"])
    assert accept >= 2.0


def test_sampled_requests_are_verified_with_draft_tokens_accepted(plain):
    for name in SAMPLING:
        assert all(len(o) == SAMPLED_TOKENS for o in plain[name]["outputs"]), name
        assert mean_accept_length(plain[name]["responses"]) > 1.3, name
