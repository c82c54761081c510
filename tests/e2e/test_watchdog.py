"""The accept-length watchdog in the real CPU server (sglang 0.5.9 under ``eagle3-patches run --cpu-profile``).

Two servers, each started once, both with ``--enable-metrics`` and a window of 16 verify steps after 4 of
warm-up (``e2e_servers.WATCHDOG_ENV``; the interval keeps its default, 600 s):

* ``eagle_unguarded`` (shared with test_server.py): ``--speculative-algorithm EAGLE`` with the EAGLE-3 draft
  and both guards disabled, the field's symptom (accept length 1.00 a decode step): one WARNING, however many
  windows are bad, then the probe's diagnosis naming the first wrong hop; the verdict and the patch states
  on ``/metrics``;
* ``eagle3`` (shared): the correct EAGLE3 server, greedy: silent;
* ``eagle3_sampled`` (shared): the same server's answers to held-out prompts at temperature 1.0 (top-k 4, one
  batch), after the greedy ones: silent (its ``/metrics`` page counts both).  The watchdog holds the offline
  figure, measured greedily and stated at temperature 0, to the greedy windows only, and says once that the sampled
  windows are not compared with it.

The lowest window mean of the healthy server is the false-alarm margin docs/troubleshooting.md states.
"""

from __future__ import annotations

import re

import pytest
from e2e_servers import WATCHDOG_ENV
from support.releases import patch_applies

from eagle3_patches import settings
from eagle3_patches.testing.server import mean_accept_length

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

SYMPTOM = "eagle3-patches watchdog: speculative decoding accepts essentially no draft tokens"
NOT_COMPARED = "is not compared with windows whose verify steps were served at other temperatures"
WINDOW = int(WATCHDOG_ENV[settings.WATCHDOG_WINDOW])
WARMUP = int(WATCHDOG_ENV[settings.WATCHDOG_WARMUP])
THRESHOLD = settings.Settings().watchdog_threshold
#: sglang's log format on the scheduler: ``[2026-01-01 12:00:00] message`` (``[... TP0]`` with TP > 1), as its own
#: ``Decode batch`` lines
SGLANG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( TP\d+)?\] ")


def gauges(page: str, name: str) -> dict[tuple, float]:
    """``{sorted non-sglang labels: value}`` of one metric on a ``/metrics`` page."""
    from prometheus_client.parser import text_string_to_metric_families

    sglang_labels = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "pid"}
    out = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name:
                assert sample.labels.get("tp_rank") == "0", sample  # sglang's labels, as on its own gauges
                out[tuple(sorted((k, v) for k, v in sample.labels.items() if k not in sglang_labels))] = sample.value
    return out


def one(page: str, name: str) -> float:
    (value,) = gauges(page, name).values()
    return value


def _watchdog_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "eagle3-patches watchdog" in line]


def test_the_servers_run_this_checkout_with_the_watchdog_applied(eagle_unguarded, eagle3):
    for out in (eagle_unguarded, eagle3):
        page = out["metrics"]
        assert (
            gauges(page, "eagle3_patches:patch_state")[
                (("kind", "instrument"), ("patch", "accept_watchdog"), ("state", "applied"))
            ]
            == 1.0
        )


# --------------------------------------------------------------------------- the misconfigured server
def test_misconfigured_server_warns_once_with_the_symptom_window_and_causes(eagle_unguarded, figure):
    log = eagle_unguarded["log"]
    accept = mean_accept_length(eagle_unguarded["responses"])
    page = eagle_unguarded["metrics"]
    windows_min = one(page, "eagle3_patches:watchdog_accept_length_min")
    figure(
        f"watchdog, EAGLE with the EAGLE-3 draft (guards off): requests' accept length {accept:.2f}, "
        f"lowest {WINDOW}-step window {windows_min:.2f} (threshold {THRESHOLD})"
    )
    warnings = [line for line in log.splitlines() if SYMPTOM in line]
    assert len(warnings) == 1, _watchdog_lines(log)  # several bad windows, one interval: one report
    assert SGLANG_LINE.match(warnings[0]), warnings[0]
    block = log[log.index(SYMPTOM) :]
    assert f"mean accept length 1.000 over the last {WINDOW} verify steps" in block
    assert f"below the threshold {THRESHOLD:g}" in block
    assert "--speculative-algorithm EAGLE (or NEXTN) with an EAGLE-3 draft" in block
    assert "algorithm-eagle-with-eagle3-draft" in block
    assert windows_min == 1.0 and one(page, "eagle3_patches:watchdog_degraded") == 1.0
    assert one(page, "eagle3_patches:watchdog_reports") == 1.0


def test_misconfigured_server_logs_the_probes_first_wrong_hop(eagle_unguarded):
    log = eagle_unguarded["log"]
    (line,) = [line for line in log.splitlines() if "eagle3-patches watchdog: the probe's diagnosis" in line]
    assert SGLANG_LINE.match(line), line
    diagnosis = log[log.index(line) :]
    assert "FIRST WRONG HOP: target_output in target_verify" in diagnosis
    assert "target not capturing: --speculative-algorithm EAGLE with an EAGLE-3 draft" in diagnosis
    assert "launch with --speculative-algorithm EAGLE3" in diagnosis
    # the probe ran through its own machinery (its WARNING record lines), after the watchdog's warning
    assert log.index(SYMPTOM) < log.index("eagle3-patches probe [pid") < log.index(line)


def test_misconfigured_server_exports_the_verdict_and_the_disabled_guards(eagle_unguarded):
    page = eagle_unguarded["metrics"]
    verdict = gauges(page, "eagle3_patches:watchdog_first_wrong_hop")
    assert verdict == {(("code", "probe-width"), ("hop", "target_output"), ("mode", "target_verify")): 1.0}
    states = gauges(page, "eagle3_patches:patch_state")
    for guard in ("eagle3_algorithm_guard", "eagle3_fc_guard"):
        assert states[(("kind", "patch"), ("patch", guard), ("state", "disabled"))] == 1.0
    assert states[(("kind", "instrument"), ("patch", "eagle3_probe"), ("state", "not-selected"))] == 1.0  # reverted
    # a patch the guards' removal leaves alone: its state as on this release (applied where it declares it)
    if patch_applies("aux_capture_validation"):
        assert states[(("kind", "patch"), ("patch", "aux_capture_validation"), ("state", "applied"))] == 1.0
    assert states[(("kind", "patch"), ("patch", "eagle3_draft_strict_loading"), ("state", "applied"))] == 1.0
    assert one(page, "eagle3_patches:watchdog_threshold") == THRESHOLD


# --------------------------------------------------------------------------- healthy servers stay silent
@pytest.mark.parametrize("server", ["eagle3", "eagle3_sampled"])
def test_a_working_draft_stays_silent(server, request, figure):
    out = request.getfixturevalue(server)
    page = out["metrics"]
    accept = mean_accept_length(out["responses"])
    windows_min = one(page, "eagle3_patches:watchdog_accept_length_min")
    lowest_request = min(r["meta_info"]["spec_accept_length"] for r in out["responses"])
    decode_steps = sum(r["meta_info"]["spec_verify_ct"] - 1 for r in out["responses"])  # the prefill counts as one
    figure(
        f"watchdog, {server} ({'temperature 1.0' if server.endswith('sampled') else 'greedy'}): accept length "
        f"{accept:.2f} (lowest request {lowest_request:.2f}), lowest of {(decode_steps - WARMUP) // WINDOW} "
        f"{WINDOW}-step "
        f"windows {windows_min:.2f} (threshold {THRESHOLD}: margin x{windows_min / THRESHOLD:.2f})"
    )
    lines = _watchdog_lines(out["log"])  # the server's whole log: greedy, then sampled
    not_compared = [line for line in lines if NOT_COMPARED in line]
    assert lines == not_compared, lines
    assert one(page, "eagle3_patches:watchdog_degraded") == 0.0 and one(page, "eagle3_patches:watchdog_reports") == 0
    expected = gauges(page, "eagle3_patches:expected_accept_length")
    # the greedy figure is not held to the sampled windows, and the watchdog says so once
    assert len(not_compared) == (1 if expected else 0), lines
    if expected:
        assert one(page, "eagle3_patches:watchdog_below_expected") == 0.0
    if expected and server == "eagle3":  # the greedy windows: the margin against the fraction of the expected gain
        (e,) = expected.values()
        fraction = settings.Settings().watchdog_expected_fraction
        figure(
            f"watchdog, {server}: lowest window's gain {(windows_min - 1) / (e - 1):.0%} of the expected "
            f"{e:.2f}'s (reported below {fraction:.0%})"
        )
        assert windows_min - 1 >= fraction * (e - 1)
    assert windows_min > THRESHOLD
    assert gauges(page, "eagle3_patches:watchdog_first_wrong_hop") == {}
    states = gauges(page, "eagle3_patches:patch_state")
    assert states[(("kind", "patch"), ("patch", "eagle3_algorithm_guard"), ("state", "applied"))] == 1.0
