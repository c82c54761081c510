"""accept_watchdog

What it does: not a fix: the accept-length watchdog, on by default in every sglang scheduler process
(``EAGLE3_PATCHES_WATCHDOG=0`` switches it off).  Every failure this library exists for shows one symptom at run
time: an accept length near 1.0, with no error.  The watchdog follows the speculative accept statistics sglang
already keeps, in tumbling windows of verify steps, and, after a warm-up (default 100 verify steps), when the mean
accept length over a window (default 200 verify steps) falls below the threshold (default 1.05; all three are
``EAGLE3_PATCHES_WATCHDOG_*`` settings), i.e. drafts are essentially never accepted, it logs one WARNING naming the
symptom, the window and the likely causes, then applies the diagnostic probe (``eagle3_probe``, if it is not on) for
one record per hop, analyses the records after the next decode batch with
:func:`.probe_diagnosis.analyse` (the first wrong hop, logged as ``eagle3-patches probe-report`` prints
it) and reverts the probe.  At most one report per interval (default 600 s).  With ``--enable-metrics`` it also
wraps ``SchedulerMetricsCollector.__init__`` to create its gauges (the verdict, every patch's state) next to
sglang's ``sglang:*`` ones, with sglang's labels, in sglang's multiprocess directory: sglang's own Prometheus
set-up.  Settings, the message, the measured false-alarm margin and the metrics: docs/troubleshooting.md.

Why an instrument and not a patch: it fixes no sglang bug and changes no result; like the probe it rides on
sglang's path and reports.  It lives in the instruments registry, selected by its own setting
(:meth:`AcceptWatchdog.enabled_by`: on unless ``EAGLE3_PATCHES_WATCHDOG`` is off, so it is on in every process
``eagle3-patches run`` or the sglang plugin starts), it shows in ``status``,
``EAGLE3_PATCHES_DISABLE=accept_watchdog`` also switches it off, and it has no place in the fork series (which
holds one diff per fix of the patch registry; a source diff would fix nothing).

Where the statistics come from: sglang calls ``update_spec_metrics(bs, accepted_drafts, ...)`` once per
speculative decode batch, with the batch size (one verify step per request) and the number of draft tokens
accepted in it (Python ints already on the host), to feed its own ``accept len`` log line and
``sglang:spec_accept_length`` gauge.  The watchdog wraps that method and adds the same two numbers to its window;
accept length = (accepted drafts + verify steps) / verify steps, sglang's definition (from 0.5.23 sglang passes
``num_accept_tokens`` itself, used as given).  The method's home by release (read in the wheels of 0.5.9,
0.5.10.post1, 0.5.11, 0.5.12, 0.5.13, 0.5.15, 0.5.23): 0.5.9 ``SchedulerMetricsMixin`` in
``managers/scheduler_metrics_mixin.py`` (second argument ``num_accepted_tokens``); 0.5.10-0.5.12 the same mixin in
``observability/scheduler_metrics_mixin.py`` (``num_accepted_tokens``, ``num_accepted_drafts`` in 0.5.11,
``num_correct_drafts`` in 0.5.12); 0.5.13 and later ``SchedulerMetricsReporter`` in
``managers/scheduler_components/metrics_reporter.py`` (``num_correct_drafts``; 0.5.23 adds ``num_accept_tokens``).
sglang passes them positionally.  All of them are imported by ``managers/scheduler.py``, the module this instrument
hooks, and found from it: ``Scheduler``'s bases, or the ``SchedulerMetricsReporter`` it imports.  The Prometheus
collector is ``SchedulerMetricsCollector`` (``metrics/collector.py`` in 0.5.9, ``observability/metrics_collector.py``
from 0.5.10), imported by the module that defines ``update_spec_metrics`` (or by ``scheduler.py``).

Cost: nothing per token, which is why it can be on by default.  Per decode batch, on the rank that logs sglang's
decode statistics (attention-TP rank 0; the other ranks return at once): two integer additions and a comparison;
per window, a division and, with metrics on, a few gauge writes.  No tensor is touched and nothing is synchronised.
Only when it fires does the probe run (one host synchronisation per hop, about five), and it is reverted after its
report.

Releases: any (0.5.8 and later; the method's home by release is above).

Upstream probe: none (a diagnostic, nothing to fix upstream).

Tests: ``tests/unit/test_accept_watchdog.py`` (windows, warm-up, firing, silence at 1.06 and above, the interval
with an injected clock, the probe hand-off with the real ``analyse``, the settings),
``tests/probe/test_watchdog_on_sglang.py`` (the installed sglang's real scheduler classes and collector in an
isolated process: it lands, sglang's counters still count, it fires, the real probe is applied and reverted, the
gauges read back through ``MultiProcessCollector`` as sglang's ``/metrics`` reads them; off, nothing of sglang is
touched; passed on 0.5.9, 0.5.13, 0.5.15 and 0.5.23, and in the release matrix's selection),
``tests/e2e/test_watchdog.py`` (three real servers: see docs/troubleshooting.md).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from packaging.specifiers import SpecifierSet

from .. import patches, settings
from ..diagnostic import WARNING, Diagnostic
from ..registry import NotApplicable, Patch, Saver, expect_source
from ..sglang_runtime import server_arg
from . import eagle3_probe, get_registry
from .probe_diagnosis import analyse

logger = logging.getLogger("eagle3_patches")

NAME = "accept_watchdog"
#: decode batches the watchdog waits for the armed probe's records before it reports without them
PROBE_WAIT_BATCHES = 16
#: the doctor findings that check for the causes it names
RELATED = (
    "algorithm-eagle-with-eagle3-draft",
    "aux-disabled",
    "kimi-k25-delegation",
    "keys-missing",
    "d2t-invalid",
    "aux-ids-convention",
    "fc-width",
)
LIKELY_CAUSES = (
    "--speculative-algorithm EAGLE (or NEXTN) with an EAGLE-3 draft (the usual one: the target captures nothing, "
    "the draft's fc is skipped and its head replaced by the target's); the target not capturing its aux layers "
    "(use_aux_hidden_state false, a model wrapper that does not delegate set_eagle3_layers_to_capture); a patch of "
    "this library disabled or not applied (`eagle3-patches status`); draft tensors dropped or left at random init, "
    "or a broken d2t; a draft trained for another target or on other layers"
)


# ---------------------------------------------------------------------- the window (pure; unit-tested)
class Window:
    """Tumbling windows of ``size`` verify steps after ``warmup`` steps; :meth:`add` returns a completed
    window's mean accept length, else None.  The hot path: a comparison and two additions."""

    __slots__ = ("size", "warmup", "seen", "steps", "tokens")

    def __init__(self, size: int, warmup: int = 0):
        if size < 1 or warmup < 0:
            raise ValueError(f"window size {size} must be >= 1 and warm-up {warmup} >= 0")
        self.size, self.warmup = size, warmup
        self.seen = 0  # verify steps counted towards the warm-up
        self.steps = 0
        self.tokens = 0

    def add(self, steps: int, tokens: int) -> float | None:
        """One decode batch: ``steps`` verify steps that yielded ``tokens`` tokens (accepted drafts + 1 each)."""
        if self.seen < self.warmup:
            self.seen += steps  # a batch that ends the warm-up is not counted either
            return None
        self.steps += steps
        self.tokens += tokens
        if self.steps < self.size:
            return None
        mean = self.tokens / self.steps
        self.steps = self.tokens = 0
        return mean


# ---------------------------------------------------------------------- the probe, armed on demand
class ProbeHooks:
    """How the watchdog runs the diagnostic probe once: arm it (apply the instrument if it is not on, and make
    it record every hop again), read what it recorded, disarm it (revert it if the watchdog applied it)."""

    def __init__(self) -> None:
        self._applied_here = False

    def arm(self) -> str | None:
        """None when armed, else why not."""
        instruments = get_registry()
        name = eagle3_probe.PROBE_NAME
        self._applied_here = False
        if not instruments.is_applied(name):
            try:
                state = instruments.apply([name])[name].state.value
            except Exception as exc:  # noqa: BLE001 - a failed probe never stops the scheduler
                return f"the probe could not be applied: {type(exc).__name__}: {exc}"
            if not instruments.is_applied(name):
                return f"the probe is {state} ({instruments.status()[name].reason})"
            self._applied_here = True
        eagle3_probe.rearm()
        return None

    def records(self) -> list[dict]:
        return list(eagle3_probe.RECORDS)

    def disarm(self) -> None:
        if self._applied_here:
            get_registry().revert([eagle3_probe.PROBE_NAME])
            self._applied_here = False


# ---------------------------------------------------------------------- the watchdog
class Watchdog:
    """One per scheduler process.  :meth:`add` is called once per speculative decode batch."""

    def __init__(
        self,
        window: int = 200,
        threshold: float = 1.05,
        warmup: int = 100,
        interval: float = 600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe: Any = None,
        where: str = "",
    ):
        self.window = Window(window, warmup)
        self.threshold = threshold
        self.interval = interval
        self.clock = clock
        self.probe = probe if probe is not None else ProbeHooks()
        self.where = where or f"scheduler pid {os.getpid()}"
        self.last_mean: float | None = None
        self.min_mean: float | None = None
        self.degraded = False
        self.reports = 0
        self.last_report: float | None = None
        self.waiting: int | None = None  # decode batches since the probe was armed; None: not armed
        #: the probe's verdict of the last report: a Diagnostic (the first wrong hop), "ok", or None (none yet)
        self.diagnosis: Diagnostic | str | None = None
        self.gauges: Gauges | None = None
        self.algorithm: str | None = None  # for the message (read lazily from sglang's server args)

    @classmethod
    def from_settings(cls, s: settings.Settings, **kw: Any) -> Watchdog:
        return cls(s.watchdog_window, s.watchdog_threshold, s.watchdog_warmup, s.watchdog_interval, **kw)

    def add(self, steps: int, tokens: int) -> None:
        mean = self.window.add(steps, tokens)
        if self.waiting is not None:
            self._follow_probe()
        if mean is not None:
            self._judge(mean)

    # -- per window
    def _judge(self, mean: float) -> None:
        self.last_mean = mean
        self.min_mean = mean if self.min_mean is None else min(self.min_mean, mean)
        self.degraded = mean < self.threshold
        if (
            self.degraded
            and self.waiting is None
            and (self.last_report is None or self.clock() - self.last_report >= self.interval)
        ):
            self._report(mean)
        if self.gauges is not None:
            self.gauges.export(self)

    def finding(self, mean: float) -> Diagnostic:
        """The watchdog's own diagnostic: the symptom, the window, the likely causes."""
        algo = f", --speculative-algorithm {self.algorithm}" if self.algorithm else ""
        return Diagnostic.make(
            WARNING,
            "accept-length-low",
            "speculative decoding accepts essentially no draft tokens (the accept length is about 1.0)",
            where=f"{self.where}{algo}",
            found=f"mean accept length {mean:.3f} over the last {self.window.size} verify steps (below the "
            f"threshold {self.threshold:g}; 1.0 means no draft token accepted)",
            expected="accept length = accepted draft tokens + 1 per verify step, sglang's `accept len`: what the "
            "draft's publisher measured at the same --speculative-num-steps / -eagle-topk / -num-draft-tokens",
            cause=LIKELY_CAUSES,
            fix="the diagnostic probe runs once now and names the first wrong hop after the next decode batch; "
            "then `eagle3-patches doctor --target T --draft D -- <launch flags>` and "
            "`eagle3-patches docs troubleshooting`",
            related=RELATED,
            context={"accept_length": round(mean, 4), "window": self.window.size, "threshold": self.threshold},
        )

    def _report(self, mean: float) -> None:
        self.reports += 1
        self.last_report = self.clock()
        head = "eagle3-patches watchdog: "
        why_not = self.probe.arm()
        tail = (
            f"\n  next:     at most one report every {self.interval:g} s (EAGLE3_PATCHES_WATCHDOG_INTERVAL); "
            "EAGLE3_PATCHES_WATCHDOG=0 switches the watchdog off"
        )
        if why_not is not None:
            tail += (
                f"\n  probe:    not run: {why_not}; run it yourself: `eagle3-patches run --probe DIR -- ...`, "
                "`eagle3-patches probe-report DIR`"
            )
        else:
            self.waiting = 0
        logger.warning("%s%s", self.finding(mean).render(head), tail)

    # -- after the probe was armed
    def _follow_probe(self) -> None:
        self.waiting = (self.waiting or 0) + 1
        records = self.probe.records()
        if not records and self.waiting < PROBE_WAIT_BATCHES:
            return
        self.waiting = None
        try:
            self._diagnose(records)
        finally:
            self.probe.disarm()
        if self.gauges is not None:
            self.gauges.export(self)

    def _diagnose(self, records: list[dict]) -> None:
        if not records:
            self.diagnosis = None
            logger.warning(
                "eagle3-patches watchdog: the probe recorded nothing in %d decode batches; run it yourself "
                "(`eagle3-patches run --probe DIR -- ...`, `eagle3-patches probe-report DIR`)",
                PROBE_WAIT_BATCHES,
            )
            return
        report = analyse(records)
        self.diagnosis = report.first or "ok"
        if report.first is not None:
            also = f" ({len(report.problems) - 1} more wrong hop(s) after it)" if len(report.problems) > 1 else ""
            logger.warning(
                "eagle3-patches watchdog: the probe's diagnosis from %d record(s), as `eagle3-patches "
                "probe-report` gives it%s:\n%s",
                len(records),
                also,
                report.verdict(),
            )
        else:
            logger.warning(
                "eagle3-patches watchdog: the probe's diagnosis from %d record(s): %s The widths are right, so the "
                "draft sees states of the right shape but the wrong content, or its tokens map to the wrong ids: "
                "run `eagle3-patches doctor --target T --draft D -- <launch flags>` (layer ids, d2t, tensors; "
                "check 3 of `eagle3-patches docs troubleshooting`)",
                len(records),
                report.verdict(),
            )


# ---------------------------------------------------------------------- Prometheus (sglang --enable-metrics)
class Gauges:
    """The watchdog's verdict and every patch's state as multiprocess gauges, created in the scheduler process
    next to sglang's own (``SchedulerMetricsCollector``: same labels, same ``PROMETHEUS_MULTIPROC_DIR``, so
    sglang's ``/metrics`` serves them)."""

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
            "watchdog's threshold (drafts essentially never accepted), else 0",
        )
        self.accept = gauge("watchdog_accept_length", "mean accept length of the watchdog's last window")
        self.accept_min = gauge("watchdog_accept_length_min", "lowest window mean accept length since start")
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

    def export(self, dog: Watchdog | None) -> None:
        self.export_patch_states()
        if dog is None:
            return
        self._at(self.degraded).set(1 if dog.degraded else 0)
        self._at(self.threshold).set(dog.threshold)
        self._at(self.reports).set(dog.reports)
        if dog.last_mean is not None:
            self._at(self.accept).set(dog.last_mean)
            self._at(self.accept_min).set(dog.min_mean)
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


# ---------------------------------------------------------------------- process state and the wrappers
class _State:
    watchdog: Watchdog | None = None
    gauges: Gauges | None = None
    logging_rank: bool | None = None  # decided at the first batch
    broken = False  # an internal error switched the watchdog off in this process


_state = _State()
_lock = threading.Lock()


def _stats_logging_rank(owner: Any) -> bool:
    """True on the rank where sglang logs its decode statistics (attention-TP rank 0)."""
    for value in (
        getattr(owner, "is_stats_logging_rank", None),
        getattr(getattr(owner, "metrics_collector_context", None), "is_stats_logging_rank", None),
    ):
        if value is not None:
            return bool(value)
    rank = getattr(owner, "attn_tp_rank", None)
    return True if rank is None else rank == 0


def accept_counts(args: tuple, kwargs: dict) -> tuple[int, int]:
    """(verify steps, tokens they yielded) from ``update_spec_metrics``'s arguments, any release."""
    bs = args[0] if args else kwargs["bs"]
    if len(args) > 1:
        drafts = args[1]
    else:
        drafts = next(
            (kwargs[k] for k in ("num_correct_drafts", "num_accepted_drafts", "num_accepted_tokens") if k in kwargs), 0
        )
    tokens = args[2] if len(args) > 2 else kwargs.get("num_accept_tokens")
    return bs, drafts + bs if tokens is None else tokens


def _counted_spec_metrics(wrapped, instance, args, kwargs):
    out = wrapped(*args, **kwargs)
    dog = _state.watchdog
    if dog is None or _state.broken:
        return out
    try:
        if _state.logging_rank is None:
            _state.logging_rank = _stats_logging_rank(instance)
            dog.algorithm = _algorithm()
        if _state.logging_rank:
            dog.add(*accept_counts(args, kwargs))
    except Exception as exc:  # noqa: BLE001 - the watchdog never breaks the scheduler
        _state.broken = True
        logger.warning(
            "eagle3-patches watchdog: switched off in pid %d after an internal error: %s: %s",
            os.getpid(),
            type(exc).__name__,
            exc,
        )
    return out


def _collector_init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    try:
        with _lock:
            if _state.gauges is None:  # one set of gauges per process (prometheus registers names once)
                labels = getattr(instance, "labels", None)
                if labels is None:
                    labels = args[0] if args else kwargs.get("labels", {})
                _state.gauges = Gauges(dict(labels))
            _state.gauges.export_patch_states()  # the watchdog's own gauges follow with its first window
            if _state.watchdog is not None:
                _state.watchdog.gauges = _state.gauges
    except Exception as exc:  # noqa: BLE001 - metrics never break the scheduler
        logger.warning("eagle3-patches watchdog: cannot export its Prometheus gauges: %s: %s", type(exc).__name__, exc)


def _algorithm() -> str | None:
    try:
        algo = server_arg("speculative_algorithm")
        return str(getattr(algo, "name", algo)) if algo is not None else None
    except Exception:  # noqa: BLE001
        return None


def _spec_metrics_owner(module: ModuleType) -> type:
    """The class that defines ``update_spec_metrics`` in this release (see the module docstring)."""
    candidates = [getattr(module, "SchedulerMetricsReporter", None)]
    scheduler = getattr(module, "Scheduler", None)
    candidates += list(getattr(scheduler, "__mro__", ()))
    for cls in candidates:
        if isinstance(cls, type) and "update_spec_metrics" in vars(cls):
            return cls
    raise NotApplicable(
        f"{module.__name__}: neither Scheduler's bases nor SchedulerMetricsReporter define update_spec_metrics"
    )


def _collector_class(owner: type, module: ModuleType) -> type | None:
    for mod in (sys.modules.get(owner.__module__), module):
        cls = getattr(mod, "SchedulerMetricsCollector", None)
        if isinstance(cls, type) and "__init__" in vars(cls):
            return cls
    return None


class AcceptWatchdog(Patch):
    name = NAME
    summary = (
        "on by default: warns when the windowed accept length says drafts are never accepted and names the "
        "first wrong hop with the probe; Prometheus gauges with --enable-metrics"
    )
    module = "sglang.srt.managers.scheduler"
    applies_to = SpecifierSet(">=0.5.8")
    default_enabled = True
    in_fork_series = False

    def enabled_by(self, s: settings.Settings) -> bool:
        return s.watchdog or self.name in s.enable

    def check(self, module: ModuleType) -> None:
        owner = _spec_metrics_owner(module)
        expect_source(vars(owner)["update_spec_metrics"], "bs")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        owner = _spec_metrics_owner(module)
        saver.wrap(owner, "update_spec_metrics", _counted_spec_metrics)
        collector = _collector_class(owner, module)
        if collector is not None:
            saver.wrap(collector, "__init__", _collector_init)
        if _state.watchdog is None:
            _state.watchdog = Watchdog.from_settings(settings.current())


PATCH = AcceptWatchdog()
