"""The accept-length watchdog's logic without a server: windows, firing, silence, the interval, the probe hand-off.

The clock is injected (no test waits), the probe is a stand-in that hands back the records the real probe wrote
in a misconfigured run (``--speculative-algorithm EAGLE`` with the EAGLE-3 draft, guards off); the analysis is
the real ``probe_diagnosis.analyse``.  The real sglang scheduler, the real probe and sglang's Prometheus collector
are exercised in tests/probe/test_watchdog_on_sglang.py and tests/e2e/test_watchdog.py.
"""

from __future__ import annotations

import logging

import pytest

from eagle3_patches import settings
from eagle3_patches.instruments.accept_counts import Window
from eagle3_patches.instruments.accept_watchdog import PROBE_WAIT_BATCHES, Watchdog, accept_counts

H = 64
#: what the probe records in the misconfigured server's decode step (fields probe_diagnosis reads)
EAGLE_RECORDS = [
    {
        "probe": 1,
        "hop": "draft_input",
        "mode": "decode",
        "pid": 7,
        "tp_rank": 0,
        "algorithm": "EAGLE",
        "width": H,
        "hidden_size": H,
        "fc_in_features": 3 * H,
        "fc_out_features": H,
        "embed_width": H,
        "fc_applied": False,
        "fc_observed": "observed",
        "tokens": 1,
        "dtype": "float32",
    },
    {
        "probe": 1,
        "hop": "target_output",
        "mode": "target_verify",
        "pid": 7,
        "tp_rank": 0,
        "algorithm": "EAGLE",
        "model": "KimiK25ForConditionalGeneration",
        "hidden_size": H,
        "capture_aux_hidden_states": False,
        "layers_to_capture": [],
        "width": H,
        "expected_width": 3 * H,
        "captured_states": 0,
        "tokens": 4,
        "dtype": "float32",
    },
    {
        "probe": 1,
        "hop": "draft_input",
        "mode": "draft_extend",
        "pid": 7,
        "tp_rank": 0,
        "algorithm": "EAGLE",
        "width": H,
        "hidden_size": H,
        "fc_in_features": 3 * H,
        "fc_out_features": H,
        "embed_width": H,
        "fc_applied": False,
        "fc_observed": "observed",
        "tokens": 2,
        "dtype": "float32",
    },
]


class FakeProbe:
    def __init__(self, records=(), refuse: str | None = None):
        self.armed = self.disarmed = 0
        self._records = list(records)
        self.refuse = refuse
        self.live = False

    def arm(self):
        if self.refuse:
            return self.refuse
        self.armed += 1
        self.live = True
        return None

    def records(self):
        return self._records if self.live else []

    def disarm(self):
        self.disarmed += 1
        self.live = False


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _dog(probe=None, clock=None, **kw) -> Watchdog:
    params = dict(window=8, threshold=1.05, warmup=4, interval=600.0)
    params.update(kw)
    return Watchdog(**params, clock=clock or Clock(), probe=probe or FakeProbe(EAGLE_RECORDS), where="test")


def _feed(dog: Watchdog, batches: int, *, bs: int = 1, accepted: int = 0) -> None:
    """``batches`` decode batches of ``bs`` verify steps, ``accepted`` draft tokens accepted in each."""
    for _ in range(batches):
        dog.add(*accept_counts((bs, accepted), {}))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eagle3_patches" and r.levelno >= logging.WARNING]


# ---------------------------------------------------------------------- the window
def test_window_ignores_the_warm_up_and_returns_each_window_mean_once():
    w = Window(4, warmup=3)
    assert [w.add(1, 1) for _ in range(3)] == [None] * 3  # warm-up
    assert [w.add(1, t) for t in (3, 3, 2)] == [None] * 3
    assert w.add(1, 4) == pytest.approx(3.0)  # (3 + 3 + 2 + 4) / 4
    assert w.add(2, 2) is None and w.add(2, 6) == pytest.approx(2.0)  # tumbling: starts afresh


def test_window_counts_verify_steps_not_batches():
    w = Window(200)
    assert w.add(64, 64) is None and w.add(64, 64) is None and w.add(64, 64) is None
    assert w.add(64, 64) == pytest.approx(1.0)  # 256 steps >= 200: one window


def test_window_rejects_nonsense():
    with pytest.raises(ValueError):
        Window(0)
    with pytest.raises(ValueError):
        Window(8, warmup=-1)


@pytest.mark.parametrize(
    "args, kwargs, expected",
    [
        ((4, 6), {}, (4, 10)),  # 0.5.9: (bs, num_accepted_tokens); 0.5.12/0.5.13: (bs, num_correct_drafts)
        ((4,), {"num_correct_drafts": 6}, (4, 10)),
        ((4,), {"num_accepted_drafts": 6}, (4, 10)),  # 0.5.11's name
        ((4,), {"num_accepted_tokens": 6}, (4, 10)),
        ((4, 6), {"num_accept_tokens": 10, "num_block_accept_tokens": 0}, (4, 10)),  # 0.5.23 passes the tokens itself
        ((4, 6, 10), {}, (4, 10)),
    ],
)
def test_accept_counts_read_every_release_signature(args, kwargs, expected):
    assert accept_counts(args, kwargs) == expected


# ---------------------------------------------------------------------- fires
def test_fires_once_with_the_symptom_window_and_causes_then_names_the_first_wrong_hop(caplog):
    probe = FakeProbe(EAGLE_RECORDS)
    dog = _dog(probe)
    with caplog.at_level(logging.INFO, logger="eagle3_patches"):
        _feed(dog, 4 + 7)  # warm-up, then one step short of a window
        assert _warnings(caplog) == [] and probe.armed == 0
        _feed(dog, 1)  # the window completes: accept length 1.0
        assert dog.degraded and dog.last_mean == 1.0 and dog.reports == 1 and probe.armed == 1
        (warning,) = _warnings(caplog)
        assert warning.startswith("eagle3-patches watchdog: speculative decoding accepts essentially no draft tokens")
        assert "mean accept length 1.000 over the last 8 verify steps" in warning and "threshold 1.05" in warning
        assert "--speculative-algorithm EAGLE (or NEXTN) with an EAGLE-3 draft" in warning
        assert "algorithm-eagle-with-eagle3-draft" in warning  # the doctor finding that checks the usual cause
        _feed(dog, 1)  # the next decode batch: the probe has recorded
    diagnosis = _warnings(caplog)[1]
    assert "FIRST WRONG HOP: target_output in target_verify" in diagnosis
    assert "target not capturing: --speculative-algorithm EAGLE" in diagnosis
    assert "launch with --speculative-algorithm EAGLE3" in diagnosis
    assert probe.disarmed == 1 and dog.diagnosis.code == "probe-width"
    assert dog.diagnosis.context["hop"] == "target_output"


@pytest.mark.parametrize("mode", ["decode", "prefill", None])
def test_a_decode_server_of_a_pair_points_at_the_prefill_side(caplog, mode):
    dog = _dog(warmup=0, window=200)
    dog.disaggregation_mode = mode
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 1, bs=256, accepted=3)
    (warning,) = _warnings(caplog)
    assert ("doctor --prefill CMD --decode CMD" in warning) == (mode == "decode")


def test_fires_for_a_big_batch_that_fills_the_window_at_once(caplog):
    dog = _dog(warmup=0, window=200)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 1, bs=256, accepted=3)  # 259 tokens from 256 verify steps: 1.01
    assert dog.reports == 1 and "mean accept length 1.012 over the last 200 verify steps" in _warnings(caplog)[0]


def test_a_probe_that_finds_every_hop_right_points_at_the_content(caplog):
    ok = [
        dict(
            r,
            width=3 * H,
            fc_applied=r["mode"] != "decode",
            capture_aux_hidden_states=True,
            layers_to_capture=[2, 3, 4],
        )
        for r in EAGLE_RECORDS
    ]
    ok[0]["width"] = H  # the draft's own states in decode
    dog = _dog(FakeProbe(ok))
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 4 + 8 + 1)
    assert dog.diagnosis == "ok"
    assert "OK: every hop has the width" in _warnings(caplog)[1] and "eagle3-patches doctor" in _warnings(caplog)[1]


def test_a_probe_that_cannot_run_is_said_in_the_warning(caplog):
    probe = FakeProbe(refuse="the probe is disabled (listed in EAGLE3_PATCHES_DISABLE)")
    dog = _dog(probe)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 4 + 8 + 3)
    (warning,) = _warnings(caplog)
    assert "probe:    not run: the probe is disabled" in warning and "eagle3-patches run --probe DIR" in warning
    assert dog.waiting is None and probe.disarmed == 0


def test_a_probe_that_records_nothing_is_given_up_after_a_bounded_wait(caplog):
    probe = FakeProbe(records=())
    dog = _dog(probe)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 4 + 8 + PROBE_WAIT_BATCHES - 1)
        assert dog.waiting == PROBE_WAIT_BATCHES - 1 and len(_warnings(caplog)) == 1
        _feed(dog, 1)
    assert dog.waiting is None and probe.disarmed == 1
    assert f"the probe recorded nothing in {PROBE_WAIT_BATCHES} decode batches" in _warnings(caplog)[1]


# ---------------------------------------------------------------------- stays silent
@pytest.mark.parametrize("accepted_per_step", [1, 2, 3])  # accept length 2, 3, 4
def test_silent_with_a_working_draft(caplog, accepted_per_step):
    probe = FakeProbe(EAGLE_RECORDS)
    dog = _dog(probe)
    with caplog.at_level(logging.INFO, logger="eagle3_patches"):
        _feed(dog, 4 + 8 * 20, accepted=accepted_per_step)
    assert _warnings(caplog) == [] and probe.armed == 0 and not dog.degraded
    assert dog.min_mean == dog.last_mean == 1 + accepted_per_step


def test_silent_just_above_the_threshold_and_during_the_warm_up(caplog):
    dog = _dog(window=100, warmup=1000, threshold=1.05)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 1000)  # accept length 1.0, but all of it warm-up
        assert dog.last_mean is None
        for _ in range(5):  # 6 accepted drafts per 100 verify steps: 1.06
            _feed(dog, 94)
            _feed(dog, 6, accepted=1)
    assert _warnings(caplog) == [] and dog.min_mean == pytest.approx(1.06) and not dog.degraded


def test_a_window_at_the_threshold_is_not_below_it():
    dog = _dog(threshold=1.25)
    _feed(dog, 4)  # the warm-up
    _feed(dog, 6)
    _feed(dog, 2, accepted=1)
    assert dog.last_mean == 1.25 and not dog.degraded


def test_recovery_clears_the_degraded_flag():
    dog = _dog()
    _feed(dog, 4 + 8)
    assert dog.degraded
    _feed(dog, 1)  # the probe's batch, the first step of the next window
    _feed(dog, 7, accepted=2)
    assert not dog.degraded and dog.last_mean == (1 + 7 * 3) / 8 and dog.min_mean == 1.0


# ---------------------------------------------------------------------- the interval
def test_at_most_one_report_per_interval(caplog):
    clock = Clock()
    probe = FakeProbe(EAGLE_RECORDS)
    dog = _dog(probe, clock, interval=600.0)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed(dog, 4 + 8)  # report 1 at t = 1000
        for _ in range(30):  # 30 more bad windows, 10 s apart: 300 s < 600 s
            clock.now += 10
            _feed(dog, 8)
        assert dog.reports == 1 and probe.armed == 1
        clock.now = 1000 + 599.9
        _feed(dog, 8)
        assert dog.reports == 1
        clock.now = 1000 + 600
        _feed(dog, 8)
        assert dog.reports == 2 and probe.armed == 2
    symptom = [w for w in _warnings(caplog) if "accepts essentially no draft tokens" in w]
    assert len(symptom) == 2 and all("at most one report every 600 s" in w for w in symptom)


def test_interval_zero_reports_every_bad_window_once_the_probe_has_answered():
    dog = _dog(interval=0)
    _feed(dog, 4 + 8)  # report 1, probe armed
    _feed(dog, 7)  # the probe answered at the first of these
    _feed(dog, 1)
    assert dog.reports == 2


# ---------------------------------------------------------------------- settings
def test_settings_defaults_and_values():
    s = settings.reload({})
    assert (s.watchdog, s.watchdog_window, s.watchdog_threshold, s.watchdog_warmup, s.watchdog_interval) == (
        True,
        200,
        1.05,
        100,
        600.0,
    )
    s = settings.reload(
        {
            settings.WATCHDOG: "0",
            settings.WATCHDOG_WINDOW: "8",
            settings.WATCHDOG_THRESHOLD: "1.2",
            settings.WATCHDOG_WARMUP: "0",
            settings.WATCHDOG_INTERVAL: "30",
        }
    )
    assert (s.watchdog, s.watchdog_window, s.watchdog_threshold, s.watchdog_warmup, s.watchdog_interval) == (
        False,
        8,
        1.2,
        0,
        30.0,
    )
    dog = Watchdog.from_settings(s)
    assert (dog.window.size, dog.threshold, dog.window.warmup, dog.interval) == (8, 1.2, 0, 30.0)


@pytest.mark.parametrize(
    "var, raw",
    [
        (settings.WATCHDOG_WINDOW, "0"),
        (settings.WATCHDOG_WINDOW, "1.5"),
        (settings.WATCHDOG_THRESHOLD, "1.0"),
        (settings.WATCHDOG_THRESHOLD, "nan"),
        (settings.WATCHDOG_WARMUP, "-1"),
        (settings.WATCHDOG_INTERVAL, "soon"),
        (settings.WATCHDOG, "maybe"),
    ],
)
def test_a_watchdog_setting_not_understood_is_reported(var, raw):
    s = settings.reload({var: raw})
    assert len(s.problems) == 1 and var in s.problems[0]
    defaults = settings.Settings()
    assert (s.watchdog_window, s.watchdog_threshold, s.watchdog_warmup, s.watchdog_interval) == (
        defaults.watchdog_window,
        defaults.watchdog_threshold,
        defaults.watchdog_warmup,
        defaults.watchdog_interval,
    )


def test_the_watchdog_is_on_by_default_and_off_with_one_variable():
    import eagle3_patches

    dog = eagle3_patches.get_patch("accept_watchdog")
    assert dog.enabled_by(settings.reload({})) and dog.default_enabled and not dog.in_fork_series
    assert not dog.enabled_by(settings.reload({settings.WATCHDOG: "off"}))
    assert dog.enabled_by(settings.reload({settings.WATCHDOG: "off", settings.ENABLE: "accept_watchdog"}))


# ---------------------------------------------------------------------- against the expected figure
BELOW = "eagle3-patches watchdog: drafts are accepted far less often than this draft is expected to be"


def _expecting(expected: float = 3.0, fraction: float = 0.5, **kw) -> Watchdog:
    from eagle3_patches.checkpoint.expected_accept import ExpectedAccept

    dog = _dog(FakeProbe(EAGLE_RECORDS), **kw)
    dog.fraction = fraction
    dog.set_expected(ExpectedAccept(expected, 3, 1, 4, source="draft/config.json: expected_accept_length"), (3, 1, 4))
    return dog


def _feed_steps(dog: Watchdog, accepted: list[int]) -> None:
    """One decode batch per verify step, each accepting ``accepted[i]`` drafts, counted per position as sglang's
    per-request histogram does."""
    for a in accepted:
        dog.positions.add(a)
        dog.add(1, a + 1)


def test_below_the_expected_gain_fires_once_naming_both_figures_and_positions(caplog):
    dog = _expecting(3.0)  # gain 2.0; reported below a gain of 1.0
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed_steps(dog, [0] * 4)  # warm-up
        _feed_steps(dog, [1, 0, 1, 1, 0, 1, 1, 0])  # 13 tokens / 8 steps = 1.625: gain 0.625 < 1.0
    (warning,) = _warnings(caplog)
    assert warning.startswith(BELOW) and dog.below_expected and not dog.degraded
    assert "mean accept length 1.625 over the last 8 verify steps" in warning
    assert "31% of the expected 2.000" in warning  # 0.625 / 2.0
    assert "accept length 3 at --speculative-num-steps 3, --speculative-eagle-topk 1" in warning
    assert "(draft/config.json: expected_accept_length)" in warning  # where the figure came from
    assert "draft token k accepted in k=1: 62%" in warning  # 5 of 8 steps accepted the first draft token
    assert "reported below 0.5 of its gain" in warning
    assert dog.finding(1.625).code == "accept-length-below-expected"
    assert "quantization" in warning and "draft-quantization-inherited" in warning  # the quieter causes' findings
    assert dog.last_positions == [5 / 8]
    assert dog.probe.armed == 1  # the probe runs as for the other symptom


def test_at_the_expected_fraction_and_above_it_stays_silent(caplog):
    dog = _expecting(3.0)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed_steps(dog, [0] * 4)
        _feed_steps(dog, [1] * 8)  # 2.0: a gain of exactly half the expected one
        assert not dog.below_expected
        _feed_steps(dog, [2, 2, 3, 1, 2, 2, 3, 1])  # 3.0
    assert _warnings(caplog) == [] and dog.reports == 0 and dog.probe.armed == 0
    assert dog.last_positions == [1.0, 6 / 8, 2 / 8]


def test_the_fraction_is_the_setting(caplog):
    dog = _expecting(3.0, fraction=0.25)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed_steps(dog, [0] * 4 + [1, 0, 1, 1, 0, 1, 1, 0])  # gain 0.625 > 0.25 x 2.0
    assert _warnings(caplog) == [] and not dog.below_expected
    assert Watchdog.from_settings(settings.read({settings.WATCHDOG_EXPECTED_FRACTION: "0.3"})).fraction == 0.3


def test_near_one_is_still_the_loud_symptom_with_an_expected_figure(caplog):
    dog = _expecting(3.0)
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed_steps(dog, [0] * 12)
    (warning,) = _warnings(caplog)[:1]
    assert warning.startswith("eagle3-patches watchdog: speculative decoding accepts essentially no draft tokens")
    assert dog.degraded and not dog.below_expected


def test_without_an_expected_figure_a_low_gain_is_not_reported(caplog):
    dog = _dog()
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _feed_steps(dog, [0] * 4 + [1, 0, 1, 1, 0, 1, 1, 0])
    assert _warnings(caplog) == [] and not dog.below_expected


def test_a_figure_measured_at_other_flags_is_not_compared(caplog):
    from eagle3_patches.checkpoint.expected_accept import ExpectedAccept

    dog = _dog()
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        dog.set_expected(ExpectedAccept(3.0, 3, 1, 4, source="x"), (5, 1, 6))
        _feed_steps(dog, [0] * 4 + [1, 0, 1, 1, 0, 1, 1, 0])
    (warning,) = _warnings(caplog)
    assert "is not compared with this server's: measured at --speculative-num-steps 3, served with 5" in warning
    assert dog.expected is None and not dog.below_expected
    dog.set_expected(ExpectedAccept(3.0, 3, 1, 4, source="x"), (3, 1, 4))
    assert dog.expected is not None


def test_positions_count_each_verify_step_once_and_start_again_each_window():
    from eagle3_patches.instruments.accept_counts import MAX_POSITIONS, Positions

    p = Positions()
    assert p.take() == []
    for a in (0, 3, 1, 1):
        p.add(a)
    assert p.take() == [3 / 4, 1 / 4, 1 / 4]
    assert p.take() == []  # started again
    p.add(1)
    assert p.take() == [1.0, 0.0, 0.0]  # a position no step reached this time is 0, not left out
    p.add(MAX_POSITIONS + 5)
    p.add(-1)
    rates = p.take()
    assert len(rates) == MAX_POSITIONS and rates[:2] == [0.5, 0.5]  # bounded; a nonsense count is no position


def test_the_expected_figure_comes_from_the_setting_first_then_the_draft_config(tmp_path, monkeypatch, caplog):
    import json

    from eagle3_patches.instruments import accept_watchdog as aw

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"expected_accept_length": {"accept_length": 2.5}}))
    monkeypatch.setattr(aw, "server_arg", lambda name: str(draft))
    try:
        settings.reload({settings.EXPECTED_ACCEPT_LENGTH: "3.25"})
        got = aw.expected_figure()
        assert got is not None and got.accept_length == 3.25 and got.source == settings.EXPECTED_ACCEPT_LENGTH
        settings.reload({})
        got = aw.expected_figure()
        assert (
            got is not None and got.accept_length == 2.5 and got.source.endswith("config.json: expected_accept_length")
        )
        (draft / "config.json").write_text(json.dumps({"expected_accept_length": 0.5}))
        with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
            assert aw.expected_figure() is None
        assert "the draft's expected accept length is not used" in _warnings(caplog)[0]
        assert "accept_length 0.5" in _warnings(caplog)[0]
        caplog.clear()

        def no_server_args(name):
            raise RuntimeError("Global server args is not set yet!")

        monkeypatch.setattr(aw, "server_arg", no_server_args)
        with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
            assert aw.expected_figure() is None
        assert _warnings(caplog) == []  # no server: no figure, nothing to say
    finally:
        settings.reload()


def _through_sglangs_call(
    monkeypatch, adaptive: bool | None, batches: list[tuple[int, int]], **server_args: object
) -> Watchdog:
    """The watchdog as sglang's ``update_spec_metrics(bs, accepted_drafts)`` reaches it, on a server whose
    ``--speculative-adaptive`` is ``adaptive`` (None: a release without the flag), fed ``batches``; the figure the
    draft states is 3.0 at fixed steps."""
    from eagle3_patches.checkpoint.expected_accept import ExpectedAccept
    from eagle3_patches.instruments import accept_watchdog as aw

    dog = _dog()
    monkeypatch.setattr(aw, "_state", aw._State())
    aw._state.watchdog = dog
    flags = {"speculative_algorithm": "EAGLE3", **server_args}
    if adaptive is not None:
        flags["speculative_adaptive"] = adaptive
    monkeypatch.setattr(aw, "server_arg", lambda name, default=None: flags.get(name, default))
    monkeypatch.setattr(aw, "expected_figure", lambda: ExpectedAccept(3.0, source="draft/config.json"))

    class Scheduler:
        is_stats_logging_rank = True

    for bs, accepted in batches:
        aw._counted_spec_metrics(lambda *a: None, Scheduler(), (bs, accepted), {})
    return dog


# the steps sglang's adaptive speculation runs change from batch to batch: 3 steps accepting 2 drafts a request,
# then at a large batch 0 steps (no drafting: accept length 1.0), then 1 step accepting a little
ADAPTIVE_BATCHES = [(1, 2)] * 4 + [(16, 0)] * 2 + [(1, 0), (1, 1)] * 8


def test_under_adaptive_steps_nothing_false_is_said_and_the_stand_down_is_said_once(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        dog = _through_sglangs_call(monkeypatch, True, ADAPTIVE_BATCHES)
    (warning,) = _warnings(caplog)
    assert "judges no accept length on this server (served with --speculative-adaptive" in warning
    assert "down to 0, no drafting" in warning and "probe-report" in warning
    assert dog.stood_down and dog.expected is None and not dog.degraded and not dog.below_expected
    assert dog.reports == 0 and dog.probe.armed == 0 and dog.last_mean is not None  # followed, not judged


def test_adaptive_steps_are_recognised_whatever_the_case_of_the_algorithm(monkeypatch):
    dog = _through_sglangs_call(monkeypatch, True, ADAPTIVE_BATCHES, speculative_algorithm="eagle3")  # as given
    assert dog.stood_down and dog.reports == 0


@pytest.mark.parametrize(
    "adaptive, server_args",
    [
        (False, {}),
        (None, {}),  # a release before --speculative-adaptive (0.5.9, 0.5.10)
        # sglang falls back to fixed steps (its adaptive_unsupported_reason): each of its fallbacks, written out
        (True, {"enable_dp_attention": True}),
        (True, {"speculative_eagle_topk": 4}),
        (True, {"speculative_algorithm": "STANDALONE"}),
        (True, {"enable_two_batch_overlap": True}),
        (True, {"enable_multi_layer_eagle": True}),
        (True, {"enable_pdmux": True}),
    ],
)
def test_the_same_batches_at_fixed_steps_are_judged(monkeypatch, caplog, adaptive, server_args):
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        dog = _through_sglangs_call(monkeypatch, adaptive, ADAPTIVE_BATCHES, **server_args)
    assert dog.stood_down is None and dog.expected is not None and dog.reports >= 1
    assert any("speculative decoding accepts essentially no draft tokens" in w for w in _warnings(caplog))


def _release_fallback_flags() -> list[str]:
    """The ``enable_*`` server arguments the installed release's ``adaptive_unsupported_reason`` falls back to fixed
    steps on (read from its source; empty on a release without adaptive steps)."""
    import ast
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return []
    (root,) = spec.submodule_search_locations
    path = Path(root) / "srt" / "speculative" / "adaptive_spec_params.py"
    if not path.is_file():
        return []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == "adaptive_unsupported_reason":
            return sorted(
                {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute) and a.attr.startswith("enable_")}
            )
    return []


def test_every_fixed_steps_fallback_of_this_release_is_judged(monkeypatch, caplog):
    """Each flag on which the installed release's sglang serves fixed steps under --speculative-adaptive: the
    watchdog judges the accept length there (it does not stand down)."""
    flags = _release_fallback_flags()
    if not flags:
        pytest.skip("the installed sglang has no adaptive_unsupported_reason (no --speculative-adaptive)")
    for flag in flags:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
            dog = _through_sglangs_call(monkeypatch, True, ADAPTIVE_BATCHES, **{flag: True})
        assert dog.stood_down is None and dog.expected is not None, f"stood down with {flag} on (fixed steps)"


def test_a_watchdog_that_judges_nothing_exports_no_verdict(monkeypatch):
    import prometheus_client

    from eagle3_patches.instruments.watchdog_metrics import Gauges

    values: dict[tuple[str, tuple], float] = {}

    class Gauge:  # prometheus_client's Gauge, recording what is set instead of registering it
        def __init__(self, name, doc, labelnames, multiprocess_mode):
            self.name = name

        def labels(self, **labels):
            gauge = self

            class Child:
                def set(self, value):
                    values[(gauge.name, tuple(sorted(labels.items())))] = value

            return Child()

    monkeypatch.setattr(prometheus_client, "Gauge", Gauge)
    names = lambda: {name for name, _ in values}  # noqa: E731
    dog = _dog()
    _feed(dog, 12)
    Gauges({"model_name": "m"}).export(dog)
    assert values[("eagle3_patches:watchdog_degraded", (("model_name", "m"),))] == 1
    values.clear()
    dog.stand_down("served with --speculative-adaptive")
    _feed(dog, 8)
    Gauges({"model_name": "m"}).export(dog)
    assert "eagle3_patches:watchdog_accept_length" in names()
    assert not {"eagle3_patches:watchdog_degraded", "eagle3_patches:watchdog_below_expected"} & names()


def test_the_decode_server_of_a_pair_is_known_from_sglangs_flags(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        dog = _through_sglangs_call(monkeypatch, False, ADAPTIVE_BATCHES, disaggregation_mode="decode")
    assert dog.disaggregation_mode == "decode"
    assert any("prefill/decode pair" in w and "--prefill CMD --decode CMD" in w for w in _warnings(caplog))
