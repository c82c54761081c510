"""Every ``EAGLE3_PATCHES_*`` environment variable, read in one place, once per process.

:func:`current` reads the environment the first time it is called and keeps the result
(:func:`reload` reads it again: tests, or a process that changed its own environment before
anything here ran).  A value that is not understood is never ignored in silence: it is listed
in :attr:`Settings.problems` and logged once, as is a patch name that no registry knows
(:func:`unknown_names`).

| variable | meaning |
|---|---|
| ``EAGLE3_PATCHES_APPLY`` | set by ``eagle3-patches run``: ``all`` or a comma list of patch names to apply in every process (read by the bootstrap ``sitecustomize``) |
| ``EAGLE3_PATCHES_DISABLE`` | comma list of patch names never to apply (status: ``disabled``); ``all``: every patch and instrument |
| ``EAGLE3_PATCHES_ENABLE`` | comma list of off-by-default patches and instruments to apply as well |
| ``EAGLE3_PATCHES_ON_ERROR`` | ``warn`` (default): a patch that fails to apply is logged, its whole selection is rolled back and reported ``failed``; ``raise``: the import that triggered it fails. A bootstrap that cannot load the library at all (``eagle3-patches run`` with another Python) refuses to import sglang in that process unless this is set to ``warn`` explicitly |
| ``EAGLE3_PATCHES_CPU_PROFILE`` | on: activate the CPU profile (refused when CUDA is available); ``force``: activate even then |
| ``EAGLE3_PATCHES_UPGRADE_ALGORITHM`` | on: ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft is upgraded to ``EAGLE3`` with a warning instead of refused |
| ``EAGLE3_PATCHES_LAYER_ID_CONVENTION`` | sglang >= 0.5.13: the convention of a draft config that records none (``output-of-layer`` or ``input-of-layer``) |
| ``EAGLE3_PATCHES_PROBE`` | off by default. On: the diagnostic probe (instrument ``eagle3_probe``, ``eagle3-patches run --probe``) logs what enters and leaves the EAGLE-3 path once per process, forward mode and hop; a path: also JSON lines there (a directory: ``probe-<pid>.jsonl`` per process; a ``*.jsonl`` file: appended by every process), read by ``eagle3-patches probe-report`` |
| ``EAGLE3_PATCHES_DUMP_DIR`` | the instrument ``hidden_state_dump``: the directory its safetensors shards (aux hidden states + token ids of served requests) go to; setting it switches the dump on |
| ``EAGLE3_PATCHES_DUMP_LAYER_IDS`` | ``hidden_state_dump`` without EAGLE3 speculation: the aux layer ids to capture (comma list, the installed sglang's convention, e.g. ``1,2,3``); default: the ``--speculative-draft-model-path`` config's ids |
| ``EAGLE3_PATCHES_DUMP_SHARD_TOKENS`` | ``hidden_state_dump``: rows (tokens) per shard before it is written (default 4096; a partial shard is also written after one idle second and at exit) |
| ``EAGLE3_PATCHES_PLUGIN`` | on by default: installed next to sglang >= 0.5.11, the sglang plugin entry point applies the patch set in every sglang process; off: it does nothing (``eagle3-patches run`` still works) |
| ``EAGLE3_PATCHES_RANK_CHECK_TIMEOUT`` | seconds a rank waits for every other rank's patch set at model load (default 120; 0: the check is off) |
| ``EAGLE3_PATCHES_SERIES_DIR`` | the fork path: a directory holding patch series directories, searched first |
| ``EAGLE3_PATCHES_DEBUG`` | on: the CLI shows tracebacks instead of one-line messages |
| ``EAGLE3_PATCHES_WATCHDOG`` | on by default: the accept-length watchdog (instrument ``accept_watchdog``) follows each scheduler's speculative accept statistics, warns once per interval when drafts are essentially never accepted and runs the probe once to say why; off: it is not applied |
| ``EAGLE3_PATCHES_WATCHDOG_WINDOW`` | the watchdog's window: verify steps (one per request per decode batch) averaged together (default 200) |
| ``EAGLE3_PATCHES_WATCHDOG_THRESHOLD`` | the watchdog fires when a window's mean accept length (accepted draft tokens + 1 per verify step, sglang's ``accept len``) is below this (default 1.05; 1 < value <= 64) |
| ``EAGLE3_PATCHES_WATCHDOG_WARMUP`` | verify steps the watchdog ignores after the scheduler starts (default 100) |
| ``EAGLE3_PATCHES_WATCHDOG_INTERVAL`` | seconds between two watchdog reports (default 600; 0: every window that is below the threshold) |
| ``EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH`` | the accept length the draft is expected to reach at the flags it is served with (1 < value <= 64; the publisher's figure, or ``eagle3-patches measure-accept``'s); overrides the draft config's ``expected_accept_length`` field; the watchdog compares the live figure with it |
| ``EAGLE3_PATCHES_WATCHDOG_EXPECTED_FRACTION`` | the watchdog warns when a window's gain (accept length - 1) is below this fraction of the expected gain (default 0.5; 0 < value < 1) |

On and off are spelled one way everywhere: on is ``1``, ``true``, ``yes``, ``on``; off is unset,
empty, ``0``, ``false``, ``no``, ``off`` (any case).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

logger = logging.getLogger("eagle3_patches")

PREFIX = "EAGLE3_PATCHES_"
APPLY = "EAGLE3_PATCHES_APPLY"
DISABLE = "EAGLE3_PATCHES_DISABLE"
ENABLE = "EAGLE3_PATCHES_ENABLE"
ON_ERROR = "EAGLE3_PATCHES_ON_ERROR"
CPU_PROFILE = "EAGLE3_PATCHES_CPU_PROFILE"
UPGRADE_ALGORITHM = "EAGLE3_PATCHES_UPGRADE_ALGORITHM"
LAYER_ID_CONVENTION = "EAGLE3_PATCHES_LAYER_ID_CONVENTION"
PROBE = "EAGLE3_PATCHES_PROBE"
DUMP_DIR = "EAGLE3_PATCHES_DUMP_DIR"
DUMP_LAYER_IDS = "EAGLE3_PATCHES_DUMP_LAYER_IDS"
DUMP_SHARD_TOKENS = "EAGLE3_PATCHES_DUMP_SHARD_TOKENS"
SERIES_DIR = "EAGLE3_PATCHES_SERIES_DIR"
DEBUG = "EAGLE3_PATCHES_DEBUG"
PLUGIN = "EAGLE3_PATCHES_PLUGIN"
RANK_CHECK_TIMEOUT = "EAGLE3_PATCHES_RANK_CHECK_TIMEOUT"
WATCHDOG = "EAGLE3_PATCHES_WATCHDOG"
WATCHDOG_WINDOW = "EAGLE3_PATCHES_WATCHDOG_WINDOW"
WATCHDOG_THRESHOLD = "EAGLE3_PATCHES_WATCHDOG_THRESHOLD"
WATCHDOG_WARMUP = "EAGLE3_PATCHES_WATCHDOG_WARMUP"
WATCHDOG_INTERVAL = "EAGLE3_PATCHES_WATCHDOG_INTERVAL"
EXPECTED_ACCEPT_LENGTH = "EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH"
WATCHDOG_EXPECTED_FRACTION = "EAGLE3_PATCHES_WATCHDOG_EXPECTED_FRACTION"
#: the variables that change what a server under eagle3-patches does to the EAGLE-3 path (which patches, the
#: algorithm's upgrade, the layer-id convention): two servers that must agree (a prefill/decode pair) set them alike
BEHAVIOUR = (APPLY, ENABLE, DISABLE, UPGRADE_ALGORITHM, LAYER_ID_CONVENTION)
KNOWN = (
    APPLY,
    DISABLE,
    ENABLE,
    ON_ERROR,
    CPU_PROFILE,
    UPGRADE_ALGORITHM,
    LAYER_ID_CONVENTION,
    PROBE,
    DUMP_DIR,
    DUMP_LAYER_IDS,
    DUMP_SHARD_TOKENS,
    SERIES_DIR,
    DEBUG,
    PLUGIN,
    RANK_CHECK_TIMEOUT,
    WATCHDOG,
    WATCHDOG_WINDOW,
    WATCHDOG_THRESHOLD,
    WATCHDOG_WARMUP,
    WATCHDOG_INTERVAL,
    EXPECTED_ACCEPT_LENGTH,
    WATCHDOG_EXPECTED_FRACTION,
)
#: in EAGLE3_PATCHES_DISABLE: every patch and instrument
ALL = "all"

ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True)
class Settings:
    apply: str = ""  # "" (the bootstrap does nothing), "all", or a comma list
    disable: frozenset[str] = frozenset()
    enable: frozenset[str] = frozenset()
    on_error: str = "warn"  # "warn" | "raise"
    on_error_explicit: bool = (
        False  # EAGLE3_PATCHES_ON_ERROR was set (a failed bootstrap keeps sglang out unless "warn" is)
    )
    cpu_profile: str = ""  # "" | "on" | "force"
    upgrade_algorithm: bool = False
    layer_id_convention: str = ""
    probe: bool = False
    probe_path: str | None = None
    dump_dir: str | None = None
    dump_layer_ids: str = ""  # parsed where it is used, with its own message
    dump_shard_tokens: int = 4096
    series_dir: str | None = None
    debug: bool = False
    plugin: bool = True
    rank_check_timeout: float = 120.0
    watchdog: bool = True
    watchdog_window: int = 200  # verify steps
    watchdog_threshold: float = 1.05  # mean accept length
    watchdog_warmup: int = 100  # verify steps
    watchdog_interval: float = 600.0  # seconds
    expected_accept_length: float | None = None  # None: the draft config's field, if any
    watchdog_expected_fraction: float = 0.5  # of the expected gain
    problems: tuple[str, ...] = field(default=(), compare=False)

    @property
    def apply_names(self) -> frozenset[str] | None:
        """The names ``EAGLE3_PATCHES_APPLY`` lists; None for ``all``."""
        return None if self.apply == "all" else names(self.apply)

    def listed_names(self) -> dict[str, frozenset[str]]:
        """Every variable that lists patch names, with the names it lists."""
        out = {DISABLE: self.disable, ENABLE: self.enable}
        if self.apply and self.apply != "all":
            out[APPLY] = names(self.apply)
        return out


def names(raw: str) -> frozenset[str]:
    return frozenset(n.strip() for n in raw.replace(";", ",").split(",") if n.strip())


def parse_flag(raw: str | None) -> bool | None:
    """The one spelling of on/off: True, False, or None when ``raw`` is neither."""
    value = (raw or "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    return None


def read(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings an environment holds (default: ``os.environ``); never raises."""
    env = os.environ if environ is None else environ
    problems: list[str] = []

    def flag(var: str, *, also: Iterable[str] = (), default: bool = False) -> bool | str:
        raw = env.get(var, "")
        if not raw.strip():
            return default
        if raw.strip().lower() in also:
            return raw.strip().lower()
        value = parse_flag(raw)
        if value is None:
            problems.append(
                f"{var}={raw!r} is neither on ({'/'.join(sorted(ON))}) nor off ({'/'.join(sorted(OFF - {''}))}); "
                "treated as off"
            )
            return False
        return value

    on_error = env.get(ON_ERROR, "").strip().lower() or "warn"
    if on_error not in ("warn", "raise"):
        problems.append(f"{ON_ERROR}={on_error!r} is neither 'warn' nor 'raise'; treated as 'warn'")
        on_error = "warn"

    def number(
        var: str,
        default: float,
        lo: float,
        hi: float,
        what: str,
        *,
        whole: bool = False,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float:
        """``var`` as a number in lo..hi (``lo_open`` / ``hi_open``: excluding that end); ``default`` when unset or
        not understood (a problem)."""
        raw = env.get(var, "").strip()
        if not raw:
            return default
        try:
            value = int(raw) if whole else float(raw)
            if not (lo < value if lo_open else lo <= value) or not (value < hi if hi_open else value <= hi):
                raise ValueError
            return value
        except ValueError:
            problems.append(f"{var}={raw!r} is not {what}; using {default:g}")
            return default

    cpu = flag(CPU_PROFILE, also=("force",))
    probe_raw = env.get(PROBE, "").strip()
    probe_flag = parse_flag(probe_raw)
    rank_timeout = number(RANK_CHECK_TIMEOUT, 120.0, 0, 86400, "a number of seconds in 0..86400")
    shard_tokens = int(number(DUMP_SHARD_TOKENS, 4096, 1, 1 << 30, "a positive whole number of rows", whole=True))
    apply = env.get(APPLY, "").strip()
    return Settings(
        apply=apply,
        disable=names(env.get(DISABLE, "")),
        enable=names(env.get(ENABLE, "")),
        on_error=on_error,
        on_error_explicit=bool(env.get(ON_ERROR, "").strip()),
        cpu_profile="force" if cpu == "force" else ("on" if cpu else ""),
        upgrade_algorithm=bool(flag(UPGRADE_ALGORITHM)),
        layer_id_convention=env.get(LAYER_ID_CONVENTION, "").strip(),
        probe=probe_flag is not False,  # on, or a path
        probe_path=None if probe_flag is not None else probe_raw,
        dump_dir=env.get(DUMP_DIR, "").strip() or None,
        dump_layer_ids=env.get(DUMP_LAYER_IDS, "").strip(),
        dump_shard_tokens=shard_tokens,
        series_dir=env.get(SERIES_DIR, "").strip() or None,
        debug=bool(flag(DEBUG)),
        plugin=bool(flag(PLUGIN, default=True)),
        rank_check_timeout=rank_timeout,
        watchdog=bool(flag(WATCHDOG, default=True)),
        watchdog_window=int(
            number(WATCHDOG_WINDOW, 200, 1, 1 << 30, "a positive whole number of verify steps", whole=True)
        ),
        watchdog_threshold=number(
            WATCHDOG_THRESHOLD, 1.05, 1.0, 64.0, "an accept length above 1 and at most 64", lo_open=True
        ),
        watchdog_warmup=int(number(WATCHDOG_WARMUP, 100, 0, 1 << 30, "a whole number of verify steps", whole=True)),
        watchdog_interval=number(WATCHDOG_INTERVAL, 600.0, 0, 1e9, "a number of seconds (0 or more)"),
        expected_accept_length=(
            number(EXPECTED_ACCEPT_LENGTH, 0.0, 1.0, 64.0, "an accept length above 1 and at most 64", lo_open=True)
            or None
        ),
        watchdog_expected_fraction=number(
            WATCHDOG_EXPECTED_FRACTION, 0.5, 0.0, 1.0, "a fraction between 0 and 1", lo_open=True, hi_open=True
        ),
        problems=tuple(problems),
    )


_current: list[Settings] = []


def current() -> Settings:
    """This process's settings, read from the environment the first time (see :func:`reload`)."""
    if not _current:
        reload()
    return _current[0]


def reload(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the environment again (tests; a process that set ``EAGLE3_PATCHES_*`` itself)."""
    s = read(environ)
    _current[:] = [s]
    for problem in s.problems:
        logger.warning("eagle3-patches: %s", problem)
    return s


def unknown_names(known: Iterable[str], s: Settings | None = None) -> dict[str, list[str]]:
    """Patch names listed in ``EAGLE3_PATCHES_DISABLE`` / ``_ENABLE`` / ``_APPLY`` that are not in ``known``."""
    known = set(known) | {ALL}
    s = s or current()
    return {var: sorted(listed - known) for var, listed in s.listed_names().items() if listed - known}
