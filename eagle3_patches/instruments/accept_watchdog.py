# long module: one instrument: its judging and its sglang hooks land together (its counters: accept_counts.py)
"""accept_watchdog

What it does: not a fix: the accept-length watchdog, on by default in every sglang scheduler process
(``EAGLE3_PATCHES_WATCHDOG=0`` switches it off). Every failure this library exists for shows one symptom at run
time: an accept length near 1.0, with no error. The watchdog follows the speculative accept statistics sglang
already keeps, in tumbling windows of verify steps, and, after a warm-up (default 100 verify steps), when the mean
accept length over a window (default 200 verify steps) falls below the threshold (default 1.05; all three are
``EAGLE3_PATCHES_WATCHDOG_*`` settings), i.e. drafts are essentially never accepted, it logs one WARNING naming the
symptom, the window and the likely causes (the quieter symptom too: when the draft's expected accept length is
known, from ``EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH`` or the draft config's ``expected_accept_length`` field, a
window whose gain over the target alone is below ``EAGLE3_PATCHES_WATCHDOG_EXPECTED_FRACTION`` of the expected gain
is reported the same way, with per-position acceptance; where the figure states the temperature it holds at, a
window more than a tenth of whose verify steps were served at other temperatures is not compared with it: see
:class:`Served`), then applies the diagnostic probe (``eagle3_probe``, if it is not on) for one record per hop,
analyses the records after the next decode batch with :func:`.probe_diagnosis.analyse` (the first wrong hop, logged
as ``eagle3-patches probe-report`` prints it) and reverts the probe. At most one report per interval (default 600
s). On a server launched with ``--speculative-adaptive`` (sglang 0.5.11+: the steps change at run time, down to 0 at
larger batches) it judges nothing and says so once at its first batch (:meth:`Watchdog.stand_down`). With
``--enable-metrics`` it also wraps ``SchedulerMetricsCollector.__init__`` to create its gauges
(``watchdog_metrics``: the verdicts, the live and expected accept length, per-position acceptance, every patch's
state) next to sglang's ``sglang:*`` ones, with sglang's labels, in sglang's multiprocess directory: sglang's own
Prometheus set-up. Settings, the message, the measured false-alarm margin and the metrics: docs/troubleshooting.md.

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
per request and verify step, one function call and two increments (the per-position counts: sglang's ``Req``'s
per-request histogram method is wrapped, and its argument is a host int sglang already computed; and the count of
the request's temperature, read from the ``Req``'s own ``sampling_params``);
per window, a division and, with metrics on, a few gauge writes.  No tensor is touched and nothing is synchronised.
Only when it fires does the probe run (one host synchronisation per hop, about five), and it is reverted after its
report.

Releases: any (0.5.8 and later; the method's home by release is above).

Upstream probe: none (a diagnostic, nothing to fix upstream).

Tests: ``tests/unit/test_accept_watchdog.py`` (windows, warm-up, firing, silence at 1.06 and above, the interval
with an injected clock, the probe hand-off with the real ``analyse``, the settings; against an expected figure:
fires below the fraction, silent at it, not compared at other flags, per-position counts; under adaptive steps
silent, once said),
``tests/probe/test_watchdog_on_sglang.py`` (the installed sglang's real scheduler classes and collector in an
isolated process: it lands, sglang's counters still count, it fires, the real probe is applied and reverted, the
gauges read back through ``MultiProcessCollector`` as sglang's ``/metrics`` reads them; off, nothing of sglang is
touched; on every release of the matrix's selection),
``tests/e2e/test_watchdog.py`` (three real servers: see docs/troubleshooting.md), ``tests/e2e/test_expected_accept.py``
(the degraded draft flagged against its expected figure, the intact one silent).
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

from .. import settings
from ..checkpoint import expected_accept
from ..checkpoint.formats import read_config
from ..diagnostic import WARNING, Diagnostic
from ..registry import NotApplicable, Patch, Saver, expect_source
from ..sglang_runtime import server_arg
from . import eagle3_probe, get_registry
from .accept_counts import (
    Positions,
    Served,
    Window,
    other_share,
    rates_text,
    request_temperature,
    served_text,
)
from .probe_diagnosis import analyse
from .watchdog_metrics import Gauges

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
#: what the decode server of a prefill/decode pair adds to a report: the causes it cannot see
PREFILL_SIDE = (
    "this is the decode server of a prefill/decode pair: the prefill server's own causes show here as well (its "
    "capture, its layer-id convention, HiCache there); a prefill server without speculation, with another draft or "
    "without eagle3-patches is refused per request by `disaggregation_fingerprint` when this server runs it. Run "
    "`eagle3-patches doctor --prefill CMD --decode CMD`, and the probe on the prefill server"
)
LIKELY_CAUSES = (
    "--speculative-algorithm EAGLE (or NEXTN) with an EAGLE-3 draft (the usual one: the target captures nothing, "
    "the draft's fc is skipped and its head replaced by the target's); the target not capturing its aux layers "
    "(use_aux_hidden_state false, a model wrapper that does not delegate set_eagle3_layers_to_capture); a patch of "
    "this library disabled or not applied (`eagle3-patches status`); draft tensors dropped or left at random init, "
    "or a broken d2t; a draft trained for another target or on other layers"
)
#: why a draft that loads and passes every check is accepted less often than it should be
BELOW_EXPECTED_CAUSES = (
    "a draft paired with another target or target revision than it was trained for; served with a quantization "
    "(--quantization is inherited by the draft), a context length, a RoPE scaling or a dtype it was not trained "
    "with; a d2t of another vocabulary split; draft weights altered in conversion; a figure measured at other "
    "flags, or on other traffic, than this server's"
)
#: the doctor findings that check for those causes
RELATED_BELOW = (
    "draft-quantization-inherited",
    "draft-context-length",
    "draft-rope",
    "draft-attention-backend",
    "draft-config-ignored",
    "d2t-invalid",
    "expected-accept-length",
)


#: a window is compared with a figure stated at one temperature only when at most this share of its verify steps was
#: served at others: they can lower the window's gain by at most this share of it (were they never accepted)
OTHER_SAMPLING_SHARE = 0.1


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
        #: ``--disaggregation-mode`` of this server ("decode": the prefill server's causes show here too)
        self.disaggregation_mode: str | None = None
        #: the accept length the draft should reach (:meth:`set_expected`), the fraction of its gain below which
        #: a window is reported, and whether the last window was below it
        self.expected: expected_accept.ExpectedAccept | None = None
        self.fraction = 0.5
        self.below_expected = False
        self.positions = Positions()
        self.last_positions: list[float] = []
        #: the temperatures the window's verify steps were served at (:class:`Served`), and the last window's
        self.served = Served()
        self.last_served: dict[float | None, int] = {}
        #: whether the watchdog said that windows served at another temperature are not compared
        self.said_other_sampling = False
        #: why this server's acceptance is judged against nothing (:meth:`stand_down`), None while it is judged
        self.stood_down: str | None = None

    @classmethod
    def from_settings(cls, s: settings.Settings, **kw: Any) -> Watchdog:
        dog = cls(s.watchdog_window, s.watchdog_threshold, s.watchdog_warmup, s.watchdog_interval, **kw)
        dog.fraction = s.watchdog_expected_fraction
        return dog

    def add(self, steps: int, tokens: int) -> None:
        warming_up = self.window.seen < self.window.warmup
        mean = self.window.add(steps, tokens)
        if warming_up:
            self.positions.take()  # the warm-up's verify steps count for no window
            self.served.take()
        if self.waiting is not None:
            self._follow_probe()
        if mean is not None:
            self._judge(mean)

    # -- per window
    def _judge(self, mean: float) -> None:
        self.last_mean = mean
        self.min_mean = mean if self.min_mean is None else min(self.min_mean, mean)
        self.degraded = self.stood_down is None and mean < self.threshold
        self.last_served = self.served.take()
        self.below_expected = (
            not self.degraded
            and self.expected is not None
            and self._held_to_expected(self.expected)
            and mean - 1.0 < self.fraction * self.expected.gain
        )
        self.last_positions = self.positions.take()
        if (
            (self.degraded or self.below_expected)
            and self.waiting is None
            and (self.last_report is None or self.clock() - self.last_report >= self.interval)
        ):
            self._report(mean)
        if self.gauges is not None:
            self.gauges.export(self)

    def _held_to_expected(self, exp: expected_accept.ExpectedAccept) -> bool:
        """Whether the last window is compared with ``exp``: not when more than :data:`OTHER_SAMPLING_SHARE` of its
        verify steps were served at another temperature than the one ``exp`` states (said once)."""
        share = other_share(self.last_served, exp.temperature)
        if share <= OTHER_SAMPLING_SHARE:
            return True
        if not self.said_other_sampling:
            self.said_other_sampling = True
            logger.warning(
                "eagle3-patches watchdog: the expected accept length %s is not compared with windows whose verify "
                "steps were served at other temperatures (more than %.0f%% of them): this window's requests were "
                "served %s; measure the figure at the temperature you serve (`eagle3-patches measure-accept "
                "--temperature T`)",
                exp.describe(),
                # pragma: no mutate core/NumberReplacer: printed with %.0f, the share times 99 or 101 reads 10 as
                # times 100 does
                OTHER_SAMPLING_SHARE * 100,
                served_text(self.last_served),
            )
        return False

    def finding(self, mean: float) -> Diagnostic:
        """The watchdog's own diagnostic: the symptom, the window, the likely causes."""
        algo = f", --speculative-algorithm {self.algorithm}" if self.algorithm else ""
        if not mean < self.threshold and self.expected is not None:
            return self._below_expected(mean, algo, self.expected)
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

    def _below_expected(self, mean: float, algo: str, exp: expected_accept.ExpectedAccept) -> Diagnostic:
        positions = (
            f"; draft token k accepted in {rates_text(self.last_positions)} of steps" if self.last_positions else ""
        )
        if self.last_served:
            positions += f"; requests served {served_text(self.last_served)} of verify steps"
        return Diagnostic.make(
            WARNING,
            "accept-length-below-expected",
            "drafts are accepted far less often than this draft is expected to be",
            where=f"{self.where}{algo}",
            found=f"mean accept length {mean:.3f} over the last {self.window.size} verify steps: a gain of "
            f"{mean - 1:.3f} token(s) a step, {(mean - 1) / exp.gain:.0%} of the expected {exp.gain:.3f}{positions}",
            expected=f"accept length {exp.describe()}; reported below {self.fraction:g} of its gain "
            "(EAGLE3_PATCHES_WATCHDOG_EXPECTED_FRACTION)",
            cause=BELOW_EXPECTED_CAUSES,
            fix="the diagnostic probe runs once now; then `eagle3-patches doctor --target T --draft D -- <launch "
            "flags>` (what the draft runs with) and `eagle3-patches docs troubleshooting` (a draft well below its "
            "expected figure)",
            related=RELATED_BELOW,
            context={
                "accept_length": round(mean, 4),
                "expected": exp.accept_length,
                "expected_temperature": exp.temperature,
                "fraction": self.fraction,
                "window": self.window.size,
                "positions": [round(r, 4) for r in self.last_positions],
            },
        )

    def set_expected(
        self, figure: expected_accept.ExpectedAccept | None, served: tuple[Any, Any, Any] = (None, None, None)
    ) -> None:
        """Compare with ``figure`` from now on, unless it was measured at other flags than ``served`` (steps, topk,
        draft tokens): then say so once and compare with nothing."""
        if self.stood_down is not None:
            figure = None
        why = figure.not_comparable(*served) if figure is not None else None
        if figure is not None and why is not None:
            logger.warning(
                "eagle3-patches watchdog: the expected accept length %s is not compared with this server's: %s",
                figure.describe(),
                why,
            )
            figure = None
        self.expected = figure

    def stand_down(self, why: str) -> None:
        """Judge no window from now on (the windows and gauges still follow the live accept length), and say so
        once: for a server whose steps change at run time (``--speculative-adaptive``), where a low accept length
        may be sglang's own choice of fewer steps."""
        if self.stood_down is None:
            logger.warning(
                "eagle3-patches watchdog: judges no accept length on this server (%s); the probe "
                "(EAGLE3_PATCHES_PROBE=1, `eagle3-patches probe-report`) still checks the capture",
                why,
            )
        self.stood_down = why
        self.expected = None

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
        if self.disaggregation_mode == "decode":
            tail += "\n  pair:     " + PREFILL_SIDE
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
            dog.disaggregation_mode = _disaggregation_mode()
            if _state.logging_rank:
                if adaptive_steps():
                    dog.stand_down(expected_accept.ADAPTIVE_STEPS)
                else:
                    dog.set_expected(expected_figure(), served_flags())
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


#: ``Req``'s method that counts one request's accepted draft tokens of one verify step (a host int), by release:
#: ``update_spec_acceptance_histogram(accepted_draft_tokens)`` in 0.5.9-0.5.11,
#: ``update_spec_correct_drafts_histogram(num_correct_drafts)`` from 0.5.12 (read in the wheels of 0.5.9, 0.5.10.post1,
#: 0.5.11, 0.5.12, 0.5.13, 0.5.15, 0.5.17, 0.5.20, 0.5.23)
HISTOGRAM_METHODS = ("update_spec_acceptance_histogram", "update_spec_correct_drafts_histogram")


def _counted_positions(wrapped, instance, args, kwargs):
    """sglang's own per-request count (:data:`HISTOGRAM_METHODS`), once per request and verify step, with a host
    int; the watchdog adds it to its per-position counts."""
    out = wrapped(*args, **kwargs)
    dog = _state.watchdog
    if dog is not None and not _state.broken and _state.logging_rank is not False:
        try:
            dog.positions.add(int(args[0] if args else next(iter(kwargs.values()))))
            dog.served.add(request_temperature(instance))
        except Exception:  # noqa: BLE001 - the watchdog never breaks the scheduler; the counts are only advice
            pass
    return out


def expected_figure() -> expected_accept.ExpectedAccept | None:
    """The accept length this server's draft is expected to reach: ``EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH`` (at
    the served flags), else the draft config's field; None when neither states one or the config cannot be read
    (logged: the doctor reports a malformed field)."""
    s = settings.current()
    if s.expected_accept_length is not None:
        return expected_accept.ExpectedAccept(
            s.expected_accept_length,
            source=settings.EXPECTED_ACCEPT_LENGTH,
            temperature=s.expected_accept_temperature,
        )
    try:
        path = server_arg("speculative_draft_model_path")
    except Exception:  # noqa: BLE001 - no server arguments in this process: no draft to read a figure from
        return None
    if not isinstance(path, str) or not os.path.isdir(path):
        return None  # no draft, or a hub id: nothing local to read
    try:
        return expected_accept.from_config(read_config(path, "draft"), where=os.path.join(path, "config.json"))
    except Exception as exc:  # noqa: BLE001 - a figure it cannot read is no figure (the doctor reports it)
        logger.warning("eagle3-patches watchdog: the draft's expected accept length is not used: %s", exc)
        return None


def served_flags() -> tuple[Any, Any, Any]:
    """(--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens) as resolved."""
    try:
        return tuple(
            server_arg(n) for n in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
        )
    except Exception:  # noqa: BLE001
        return (None, None, None)


def adaptive_steps() -> bool:
    """Whether sglang changes the steps at run time: ``--speculative-adaptive`` (0.5.11+; absent before) where
    sglang does not fall back to fixed steps (:func:`.expected_accept.adaptive_turned_off`)."""
    try:
        if not server_arg("speculative_adaptive", False):
            return False
        flags = ("speculative_algorithm", "speculative_eagle_topk", "enable_dp_attention", "enable_two_batch_overlap")
        algorithm, topk, dp_attention, tbo = (server_arg(n) for n in flags)
        # later flags: a release without one has no such fallback
        multi_layer, pdmux = (server_arg(n, False) for n in ("enable_multi_layer_eagle", "enable_pdmux"))
    except Exception:  # noqa: BLE001 - no server arguments in this process: fixed steps
        return False
    name = getattr(algorithm, "name", algorithm)  # sglang's SpeculativeAlgorithm enum, or the flag's string
    off = expected_accept.adaptive_turned_off(
        str(name).upper() if name else None,
        topk,
        bool(dp_attention),
        bool(tbo),
        multi_layer_eagle=bool(multi_layer),
        pdmux=bool(pdmux),
    )
    return off is None


def _disaggregation_mode() -> str | None:
    try:
        mode = server_arg("disaggregation_mode")
        return str(getattr(mode, "value", mode)) if mode is not None else None
    except Exception:  # noqa: BLE001
        return None


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


def _req_histogram(module: ModuleType) -> tuple[type, str] | None:
    """sglang's ``Req`` and its per-request acceptance counting method (:data:`HISTOGRAM_METHODS`), or None."""
    for mod in (module, sys.modules.get("sglang.srt.managers.schedule_batch")):
        cls = getattr(mod, "Req", None)
        for name in HISTOGRAM_METHODS:
            if isinstance(cls, type) and name in vars(cls):
                return cls, name
    return None


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
        found = _req_histogram(module)
        if found is not None:  # per-position acceptance where sglang counts it per request
            saver.wrap(*found, _counted_positions)
        collector = _collector_class(owner, module)
        if collector is not None:
            saver.wrap(collector, "__init__", _collector_init)
        if _state.watchdog is None:
            _state.watchdog = Watchdog.from_settings(settings.current())


PATCH = AcceptWatchdog()
