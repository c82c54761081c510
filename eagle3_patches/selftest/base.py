"""What a check is, what it finds, how a finding becomes a verdict, and how one check is run.

A :class:`Check` is a parent-side function ``run(ctx) -> Finding``: it starts its scenarios (:mod:`.scenarios`)
in isolated processes through the :class:`Context` (``ctx.observe``), on stock sglang (no patch in the
process) and with the patch set on, and reports what it saw as a :class:`Finding`: whether the bug was
observed on stock sglang (``bug``), whether the behaviour is right with the patch set on (``fixed``), with
one line of evidence for each.  :func:`judge` turns that and the patch's state into ``passed`` or
``failed``; a check that cannot run here raises :class:`Skip` with the reason (``skipped``), never passes.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..sglang_version import base_release

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
STATUSES = (PASSED, FAILED, SKIPPED)
#: the patch states under which the patch is in force in sglang's code
ACTIVE = ("applied", "in-source")

#: what the selftest's processes see of the EAGLE3_PATCHES_* settings: the library's default patch set,
#: whatever the calling environment selects (a check of "the patch set" must not test a trimmed one), and
#: no sglang plugin (a stock process must stay stock on sglang >= 0.5.11)
CHILD_ENV = {
    "EAGLE3_PATCHES_APPLY": "",
    "EAGLE3_PATCHES_DISABLE": "",
    "EAGLE3_PATCHES_ENABLE": "",
    "EAGLE3_PATCHES_UPGRADE_ALGORITHM": "",
    "EAGLE3_PATCHES_LAYER_ID_CONVENTION": "",
    "EAGLE3_PATCHES_PROBE": "",
    "EAGLE3_PATCHES_DUMP_DIR": "",
    "EAGLE3_PATCHES_ON_ERROR": "",
    "EAGLE3_PATCHES_PLUGIN": "0",
}


class Observed(NamedTuple):
    """What one isolated process saw: ``kind`` "ok" (``value`` is the scenario's result) or the type of the
    exception the scenario raised (``value`` is its message); ``states`` / ``reasons``: every patch's state there
    afterwards, and its reason."""

    kind: str
    value: Any
    states: dict
    reasons: dict

    def patch(self, name: str) -> tuple[str | None, str]:
        """``(state, reason)`` of the patch ``name`` in that process (what :class:`Finding` takes)."""
        return self.states.get(name), self.reasons.get(name, "")


class Skip(Exception):
    """The check cannot run on this install or device; the message says why."""


class CheckError(Exception):
    """The check could not finish (a process timed out or died): the check fails."""


@dataclass
class Finding:
    fixed: bool  # the behaviour with the patch set on is the right one
    patched: str  # evidence, one line
    bug: bool | None = None  # observed on stock sglang: True present, False absent, None not observable
    stock: str = ""  # evidence, one line
    state: str | None = None  # the patch's state in the patched process
    state_reason: str = ""
    observations: dict = field(default_factory=dict)  # the scenarios' raw data (tests read it; not in the JSON)


@dataclass
class Result:
    name: str
    title: str
    status: str
    patch: str | None = None
    needs: tuple[str, ...] = ()
    bug: str | None = None  # "present", "absent", "not observable" (None: not a patch check, or not run)
    needed: bool | None = None  # the patch is what fixes it here
    state: str | None = None
    stock: str = ""
    patched: str = ""
    reason: str = ""
    seconds: float = 0.0
    observations: dict = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``observations`` left out: they hold tensors)."""
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "patch": self.patch,
            "needs": list(self.needs),
            "bug": self.bug,
            "needed": self.needed,
            "state": self.state,
            "stock": self.stock,
            "patched": self.patched,
            "reason": self.reason,
            "seconds": round(self.seconds, 1),
        }


def bug_word(bug: bool | None) -> str:
    return {True: "present", False: "absent", None: "not observable"}[bug]


def judge(check: Check, finding: Finding, version: str) -> tuple[str, str, bool | None]:
    """``(status, reason, needed)`` from a finding.

    With the patch set on the behaviour must be right.  A bug observed on stock sglang must be one the patch is
    in force for (applied here, or its fork-path diff in the source); a bug not observed is a patch not needed
    on this release (upstream, outside its releases, or still applied where its declared range is wider)."""
    if not finding.fixed:
        return FAILED, f"with the patch set on: {finding.patched}", None
    if check.patch is None:
        return PASSED, "", None
    state = finding.state
    active = state in ACTIVE
    if state in ("failed", "pending", "disabled", "not-selected", None):
        return (
            FAILED,
            f"{check.patch} is {state or 'unknown'} with the patch set on "
            f"({finding.state_reason or 'no reason given'})",
            None,
        )
    if finding.bug is True:
        if not active:
            return (
                FAILED,
                (
                    f"the bug is present on stock sglang {version} but {check.patch} is {state} here "
                    f"({finding.state_reason})"
                ),
                None,
            )
        return PASSED, f"needed: {check.patch} fixes it on sglang {version}", True
    if finding.bug is False:
        if state == "in-source":
            return PASSED, "the fork-path diff is in sglang's source: the stock run saw the fixed source", False
        if active:
            return (
                PASSED,
                (
                    f"not observed on stock sglang {version}: {check.patch} is still applied (its declared "
                    "releases include this one) but this release does not need it"
                ),
                False,
            )
        return PASSED, f"gone on sglang {version}: {check.patch} is {state} ({finding.state_reason})", False
    return PASSED, "the bug cannot be observed on this install; the behaviour with the patch set on is right", None


@dataclass(frozen=True)
class Check:
    """One check: ``run(ctx)`` observes and returns a :class:`Finding` (or raises :class:`Skip`)."""

    name: str
    title: str  # what it proves, one line
    run: Callable[[Context], Finding]
    patch: str | None = None  # the patch (or instrument) whose bug it observes
    #: "cuda": a CUDA device; "2gpu": two of them; "tp2": two ranks (two GPUs on a CUDA machine, gloo on CPU);
    #: "cpu": the CPU recreation of a GPU situation (on a CUDA device its real counterpart, ``instead``, runs)
    needs: tuple[str, ...] = ()
    instead: str = ""
    runs_on: str = ""  # a specifier set of sglang releases; outside them the check is skipped with ``outside``
    outside: str = ""

    def skip_reason(self, ctx: Context) -> str | None:
        """Why this check cannot run on this install and device, or None."""
        dev = ctx.device
        if "cuda" in self.needs and dev.kind != "cuda":
            return f"needs a CUDA device ({dev.describe()}): GPU checks were not run"
        if "2gpu" in self.needs and dev.count < 2:
            return f"needs two visible GPUs ({dev.count} visible)"
        if "tp2" in self.needs and dev.kind == "cuda" and dev.count < 2:
            return f"TP 2 needs two visible GPUs on a CUDA machine ({dev.count} visible; on CPU it runs over gloo)"
        if "cpu" in self.needs and dev.kind == "cuda":
            return f"the CPU recreation of a GPU situation; on this CUDA device `{self.instead}` observes the real one"
        if self.runs_on and ctx.version is not None:
            from packaging.specifiers import SpecifierSet

            if base_release(ctx.version) not in SpecifierSet(self.runs_on):
                return f"sglang {ctx.version} is outside {self.runs_on}: {self.outside}"
        return None


def execute(check: Check, ctx: Context) -> Result:
    """Run one check within ``ctx.timeout`` seconds; never raises."""
    t0 = time.monotonic()
    result = Result(check.name, check.title, SKIPPED, patch=check.patch, needs=check.needs)
    why = check.skip_reason(ctx)
    if why:
        result.reason = why
        return result
    ctx.start_clock()
    try:
        finding = check.run(ctx)
    except Skip as exc:
        result.reason = str(exc)
    except CheckError as exc:
        result.status, result.reason = FAILED, str(exc)
    except Exception as exc:  # noqa: BLE001 - a check that breaks fails, with where it broke
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.status = FAILED
        result.reason = (
            f"the check itself raised {type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
        )
    else:
        status, reason, needed = judge(check, finding, str(ctx.version))
        result.status, result.reason, result.needed = status, reason, needed
        # "not observable" is a finding of a check that ran; a check that broke observed nothing
        result.bug = bug_word(finding.bug) if check.patch and (finding.bug is not None or status == PASSED) else None
        result.state, result.stock, result.patched = finding.state, finding.stock, finding.patched
        result.observations = finding.observations
    result.seconds = time.monotonic() - t0
    return result


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"
    count: int = 0
    name: str = ""
    capability: tuple[int, int] | None = None

    def describe(self) -> str:
        if self.kind == "cuda":
            cap = f", sm{self.capability[0]}{self.capability[1]}" if self.capability else ""
            return f"{self.count} x {self.name}{cap}"
        return "no CUDA device visible: CPU, with the CPU profile"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "count": self.count,
            "name": self.name,
            "capability": list(self.capability) if self.capability else None,
        }


def detect_device() -> Device:
    import torch

    if not torch.cuda.is_available():
        return Device("cpu")
    count = torch.cuda.device_count()
    return Device("cuda", count, torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0)))


class Context:
    """What a check runs with: the checkpoints, the device and its server arguments, the time left."""

    def __init__(
        self,
        root: Path,
        device: Device,
        version: Any,
        *,
        timeout: float = 600.0,
        attention_backend: str | None = None,
        dtype: str | None = None,
        log: Path | None = None,
    ):
        self.root = Path(root)
        self.log = log  # the file this check's processes write their output to (None: the terminal)
        self.device = device
        self.version = version
        self.timeout = timeout
        self.attention_backend = attention_backend
        self.dtype = dtype
        self._deadline = time.monotonic() + timeout

    @property
    def on_gpu(self) -> bool:
        return self.device.kind == "cuda"

    def start_clock(self) -> None:
        self._deadline = time.monotonic() + self.timeout

    def path(self, name: str) -> str:
        """The checkpoint ``name`` (:data:`.checkpoints.BUILDERS`), built on first use."""
        from .checkpoints import build

        return str(build(self.root, name))

    def overrides(self, **extra: Any) -> dict[str, Any]:
        """Server arguments for this device: none on CPU (the harness's CPU defaults); on a CUDA device sglang's
        defaults as a user runs them (CUDA graphs on, sglang's attention backend unless one was given, bf16)."""
        if not self.on_gpu:
            return dict(extra)
        out: dict[str, Any] = {
            "device": "cuda",
            "disable_cuda_graph": False,
            "dtype": self.dtype or "bfloat16",
            "attention_backend": self.attention_backend,
            "cuda_graph_bs": [1, 2, 4],
        }
        out.update(extra)
        return out

    def _env(self) -> dict[str, str]:
        from .scenarios import LOG_VARIABLE

        return {**CHILD_ENV, **({LOG_VARIABLE: str(self.log)} if self.log else {})}

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise CheckError(f"out of time: the check's {self.timeout:.0f} s (--timeout) were spent")
        return left

    def observe(
        self, fn: Callable[..., Any], *args: Any, patches: Any = None, env: dict[str, str] | None = None, **kwargs: Any
    ) -> Observed:
        """``fn(*args, **kwargs)`` in a new isolated process: ``Observed("ok", value, states)``, or
        ``Observed(exception type, message, states)`` when the scenario raised (what stock or patched sglang did
        is an observation too); ``states``: every patch's state in that process afterwards.  ``patches``: None
        (stock sglang), "all" (the default patch set) or names.  A process that times out or dies fails the
        check (:class:`CheckError`)."""
        from concurrent.futures.process import BrokenProcessPool

        from ..testing.isolation import run_isolated
        from .scenarios import observed

        try:
            out = run_isolated(
                observed,
                fn,
                *args,
                patches=patches,
                cpu_profile=not self.on_gpu,
                env={**self._env(), **(env or {})},
                timeout=self._left(),
                **kwargs,
            )
        except (BrokenProcessPool, TimeoutError) as exc:
            raise CheckError(f"{getattr(fn, '__name__', fn)}: {exc or type(exc).__name__} (--timeout)") from None
        kind, value = out["outcome"]
        return Observed(kind, value, out["states"], out["reasons"])

    def observe_ranks(
        self, fn: Callable[..., Any], world_size: int, *args: Any, patches: list, env: list[dict[str, str]]
    ) -> list:
        """``fn(rank, world_size, port, *args)`` on ``world_size`` concurrent isolated processes (TP ranks), each with
        its own patch selection and environment (on a CUDA device each rank sees its own GPU as ``cuda:0``)."""
        from concurrent.futures.process import BrokenProcessPool

        from ..testing.isolation import run_ranks

        if self.on_gpu:  # each rank its own GPU
            placement = [{"CUDA_VISIBLE_DEVICES": str(r)} for r in range(world_size)]
        else:
            # each rank its share of the cores (sglang >= 0.5.23 binds threads before the CPU profile's workaround can)
            from ..cpu.workarounds import split_cpus

            bind = os.environ.get("SGLANG_CPU_OMP_THREADS_BIND") or split_cpus(
                list(os.sched_getaffinity(0)), world_size
            )
            placement = [{"SGLANG_CPU_OMP_THREADS_BIND": bind}] * world_size
        envs = [{**self._env(), **(e or {}), **placement[r]} for r, e in enumerate(env)]
        try:
            return run_ranks(
                fn,
                world_size,
                *args,
                patches=patches,
                cpu_profile=not self.on_gpu,
                env=envs,
                timeout=self._left(),
                per_rank=True,
            )
        except (BrokenProcessPool, TimeoutError) as exc:
            raise CheckError(f"{getattr(fn, '__name__', fn)} on {world_size} ranks: {exc}") from None


def describe_error(observed: tuple) -> str:
    """One line for an observation that is an exception."""
    kind, message = observed[0], observed[1]
    first = str(message).strip().splitlines()[0] if str(message).strip() else ""
    return f"{kind}: {first}"
