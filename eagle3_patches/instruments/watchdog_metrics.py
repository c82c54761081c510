"""The accept-length watchdog's Prometheus gauges (with sglang's ``--enable-metrics``): its verdicts, the live and
the expected accept length, per-position acceptance, and every patch's state; created in the scheduler process
next to sglang's own (``SchedulerMetricsCollector``: same labels, same ``PROMETHEUS_MULTIPROC_DIR``, so sglang's
``/metrics`` serves them).  The names and what they mean: docs/troubleshooting.md."""

from __future__ import annotations

from typing import Any

from .. import patches
from . import get_registry


class Gauges:
    def __init__(self, labels: dict) -> None:
        from prometheus_client import (
            Gauge,  # after sglang set PROMETHEUS_MULTIPROC_DIR, as sglang does
        )

        self.labels = {str(k): str(v) for k, v in labels.items()}
        names = list(self.labels)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()):
            return Gauge(f"eagle3_patches:{name}", doc, labelnames=[*names, *extra], multiprocess_mode="mostrecent")

        self.degraded = gauge(
            "watchdog_degraded",
            "1 when the last window's mean accept length was below the "
            "watchdog's threshold (drafts essentially never accepted), else 0; absent when the watchdog judges "
            "nothing (--speculative-adaptive)",
        )
        self.below_expected = gauge(
            "watchdog_below_expected",
            "1 when the last window's gain (accept length - 1) was below the stated fraction of the expected gain, "
            "else 0",
        )
        self.accept = gauge("watchdog_accept_length", "mean accept length of the watchdog's last window")
        self.accept_min = gauge("watchdog_accept_length_min", "lowest window mean accept length since start")
        self.expected = gauge(
            "expected_accept_length",
            "the accept length the draft is expected to reach (EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH or the draft "
            "config's expected_accept_length); absent when none is known",
        )
        self.expected_temperature = gauge(
            "expected_accept_temperature",
            "the requests' temperature the expected accept length holds at (0: greedy; "
            "EAGLE3_PATCHES_EXPECTED_ACCEPT_TEMPERATURE or the field's temperature); absent when not stated",
        )
        self.position = gauge(
            "draft_position_acceptance",
            "fraction of the last window's verify steps that accepted draft token k (position=k)",
            ("position",),
        )
        self.threshold = gauge("watchdog_threshold", "the watchdog's threshold (EAGLE3_PATCHES_WATCHDOG_THRESHOLD)")
        self.reports = gauge("watchdog_reports", "warnings the watchdog logged since start")
        self.verdict = gauge(
            "watchdog_first_wrong_hop",
            "1 for the probe's verdict at the last report: the first "
            'wrong hop (hop, mode, code), or hop="none" when every hop was right',
            ("hop", "mode", "code"),
        )
        self.patch_state = gauge(
            "patch_state",
            "1 for each eagle3-patches patch or instrument in its current state",
            ("patch", "kind", "state"),
        )
        self._states: dict[str, tuple[str, str, str]] = {}
        self._verdict: tuple[str, str, str] | None = None

    def _at(self, g, **extra: str):
        return g.labels(**self.labels, **extra)

    def export(self, dog: Any) -> None:
        """Everything the watchdog ``dog`` (an ``accept_watchdog.Watchdog``) knows, and the patch states."""
        self.export_patch_states()
        if dog is None:
            return
        if dog.stood_down is None:  # a watchdog that judges nothing exports no verdict (adaptive steps)
            self._at(self.degraded).set(1 if dog.degraded else 0)
            self._at(self.below_expected).set(1 if dog.below_expected else 0)
        self._at(self.threshold).set(dog.threshold)
        self._at(self.reports).set(dog.reports)
        if dog.expected is not None:
            self._at(self.expected).set(dog.expected.accept_length)
            if dog.expected.temperature is not None:
                self._at(self.expected_temperature).set(dog.expected.temperature)
        if dog.last_mean is not None:
            self._at(self.accept).set(dog.last_mean)
            self._at(self.accept_min).set(dog.min_mean)
        for k, rate in enumerate(dog.last_positions or (), start=1):
            self._at(self.position, position=str(k)).set(rate)
        if dog.diagnosis is not None:
            d = dog.diagnosis
            key = (
                ("none", "none", "ok")
                if isinstance(d, str)
                else (str(d.context.get("hop")), str(d.context.get("mode")), d.code)
            )
            if key != self._verdict:
                if self._verdict is not None:
                    self._at(self.verdict, **dict(zip(("hop", "mode", "code"), self._verdict))).set(0)
                self._at(self.verdict, **dict(zip(("hop", "mode", "code"), key))).set(1)
                self._verdict = key

    def export_patch_states(self) -> None:
        for kind, reg in (("patch", patches.get_registry()), ("instrument", get_registry())):
            for name, st in reg.status().items():
                key = (name, kind, st.state.value)
                old = self._states.get(name)
                if old == key:
                    continue
                if old is not None:
                    self._at(self.patch_state, **dict(zip(("patch", "kind", "state"), old))).set(0)
                self._at(self.patch_state, **dict(zip(("patch", "kind", "state"), key))).set(1)
                self._states[name] = key
