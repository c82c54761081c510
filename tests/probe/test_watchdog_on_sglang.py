"""accept_watchdog on the installed sglang's real scheduler classes, in an isolated process.

It lands on ``sglang.srt.managers.scheduler``, wraps the release's own ``update_spec_metrics`` (0.5.9: the
``SchedulerMetricsMixin``; 0.5.13 +: ``SchedulerMetricsReporter``) and ``SchedulerMetricsCollector.__init__``;
sglang's counters keep counting through the wrapper; accept length 1.0 fires it, the real probe is applied,
records nothing (no forward runs here) and is reverted after the bounded wait; the gauges are read the way
sglang's ``/metrics`` reads them (``MultiProcessCollector`` over ``PROMETHEUS_MULTIPROC_DIR``); revert puts
sglang's functions back.  The same run with the watchdog switched off leaves sglang's functions alone.
The full path (a real server, the probe's records, ``/metrics`` over HTTP) is tests/e2e/test_watchdog.py.
"""

from __future__ import annotations

import pytest

from eagle3_patches import settings
from eagle3_patches.testing.isolation import run_isolated

BATCHES = 8 + 16  # one window of 8 verify steps at accept length 1.0, then the probe's bounded wait


def _drive(target: str, batches: int) -> dict:
    import inspect

    import wrapt

    from eagle3_patches.testing.sglang_harness import eagle3_log

    log = eagle3_log()
    import sglang.srt.managers.scheduler as scheduler_module
    from sglang.srt.model_executor.model_runner import ModelRunner

    import eagle3_patches
    from eagle3_patches.instruments import accept_watchdog as aw

    owner = aw._spec_metrics_owner(scheduler_module)
    collector_cls = aw._collector_class(owner, scheduler_module)
    out = {
        "state": eagle3_patches.status()["accept_watchdog"].state.value,
        "owner": f"{owner.__module__}.{owner.__qualname__}",
        "wrapped": isinstance(vars(owner)["update_spec_metrics"], wrapt.FunctionWrapper),
        "collector_wrapped": isinstance(vars(collector_cls)["__init__"], wrapt.FunctionWrapper),
    }
    if not out["wrapped"]:
        return out

    from eagle3_patches.testing import sglang_harness as h

    sa = h.launcher_server_args(h.server_args, target, enable_metrics=True)  # resolved as the launcher does
    try:  # sglang >= 0.5.23: the scheduler process publishes its configuration before it builds the collector
        from sglang.srt.runtime_context import SpawnRanks, publish

        publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    except ImportError:
        pass
    collector_cls(
        labels={"model_name": "tiny", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0},
        server_args=sa,
    )

    class Counters(owner):
        """The release's class with only the counters its update_spec_metrics adds to (0 until set)."""

        is_stats_logging_rank = True

        def __init__(self):
            pass

        def __getattr__(self, name):
            return 0

    stub = Counters()
    params = inspect.signature(vars(owner)["update_spec_metrics"].__wrapped__).parameters
    forward = vars(ModelRunner)["forward"]
    for i in range(batches):
        kwargs = {"num_accept_tokens": 2} if "num_accept_tokens" in params else {}
        stub.update_spec_metrics(2, 0, **kwargs)  # two verify steps, no draft token accepted
        if i == 4:  # the window (8 steps) completed at batch 3: the probe is on now
            out["probe_state_while_armed"] = eagle3_patches.status()["eagle3_probe"].state.value
    out["sglang_counted_steps"] = stub.spec_num_forward_ct
    # per-position acceptance: the release's own per-request histogram method, called as sglang calls it
    found = aw._req_histogram(scheduler_module)
    out["histogram_method"] = None if found is None else found[1]
    if found is not None:
        req_cls, name = found
        out["histogram_wrapped"] = isinstance(vars(req_cls)[name], wrapt.FunctionWrapper)
        req = req_cls.__new__(req_cls)  # a request without the constructor's tokenizer and sampling set-up
        hist = name.replace("update_", "")
        setattr(req, hist, [])
        from sglang.srt.sampling.sampling_params import SamplingParams

        before = list(aw._state.watchdog.positions.counts)
        aw._state.watchdog.served.take()
        for accepted, temperature in ((2, 0.6), (0, 0.6), (2, 0.0)):
            # the request's sampling as the release rewrites it (temperature 0: top_k 1)
            req.sampling_params = SamplingParams(temperature=temperature)
            getattr(req, name)(accepted)
        out["sglang_histogram"] = getattr(req, hist)
        out["positions_added"] = [a - b for a, b in zip(aw._state.watchdog.positions.counts, before)][:4]
        out["served"] = aw._state.watchdog.served.take()  # the temperature each verify step's request was served at
    out["probe_state_after"] = eagle3_patches.status()["eagle3_probe"].state.value
    out["forward_restored"] = vars(ModelRunner)["forward"] is forward
    out["lines"] = [r.getMessage() for r in log if "watchdog" in r.getMessage()]

    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # what sglang's /metrics serves
    out["samples"] = sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in registry.collect()
        for s in fam.samples
        if s.name.startswith("eagle3_patches:")
    )

    original = vars(owner)["update_spec_metrics"].__wrapped__
    eagle3_patches.revert(["accept_watchdog"])
    out["reverted"] = vars(owner)["update_spec_metrics"] is original
    return out


def _value(samples, name, **labels):
    found = [v for n, lab, v in samples if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, [s for s in samples if s[0] == name])
    return found[0]


@pytest.mark.sglang
def test_watchdog_fires_on_the_real_scheduler_classes_and_exports_through_sglangs_multiprocess_metrics(tiny, tmp_path):
    out = run_isolated(
        _drive,
        str(tiny["kimi_k25"]),
        BATCHES,
        patches="all",
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), settings.WATCHDOG_WINDOW: "8", settings.WATCHDOG_WARMUP: "0"},
    )
    assert out["state"] == "applied" and out["wrapped"] and out["collector_wrapped"], out
    assert out["owner"].endswith(("SchedulerMetricsMixin", "SchedulerMetricsReporter"))
    assert out["sglang_counted_steps"] == 2 * BATCHES  # sglang's own statistics still count
    # per-position acceptance rides on the release's own per-request histogram, which still counts
    assert out["histogram_method"] in ("update_spec_acceptance_histogram", "update_spec_correct_drafts_histogram")
    assert out["histogram_wrapped"] and out["sglang_histogram"] == [1, 0, 2]
    assert out["positions_added"] == [1, 0, 2, 0]
    assert out["served"] == {0.6: 2, 0.0: 1}  # read from the request's own sampling params, greedy as 0
    symptom, nothing = out["lines"]
    assert "accepts essentially no draft tokens" in symptom and "over the last 8 verify steps" in symptom
    assert "the probe recorded nothing in 16 decode batches" in nothing
    assert out["probe_state_while_armed"] == "applied"  # the real probe, applied on demand ...
    assert out["probe_state_after"] == "not-selected" and out["forward_restored"]  # ... and reverted after
    s = out["samples"]
    assert _value(s, "eagle3_patches:watchdog_degraded", model_name="tiny", tp_rank="0") == 1.0
    assert _value(s, "eagle3_patches:watchdog_accept_length_min") == 1.0
    assert _value(s, "eagle3_patches:watchdog_reports") == 1.0
    assert _value(s, "eagle3_patches:patch_state", patch="accept_watchdog", state="applied") == 1.0
    assert _value(s, "eagle3_patches:patch_state", patch="eagle3_algorithm_guard", kind="patch") == 1.0
    assert out["reverted"]


@pytest.mark.sglang
def test_watchdog_switched_off_leaves_sglang_alone(tiny, tmp_path):
    out = run_isolated(
        _drive,
        str(tiny["kimi_k25"]),
        0,
        patches="all",
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), settings.WATCHDOG: "0"},
    )
    assert out["state"] == "not-selected" and not out["wrapped"] and not out["collector_wrapped"]
