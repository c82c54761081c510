"""Every ``EAGLE3_PATCHES_*`` environment variable, declared once and read in one place, once per process.

Each setting is one declaration on :class:`Settings`, in the idiom of sglang's own ``sglang/srt/environ.py``
(``EnvBool``, ``EnvInt``, ... descriptors on a class): the attribute's name gives the variable's
(``watchdog_window``: ``EAGLE3_PATCHES_WATCHDOG_WINDOW``, also the module constant ``WATCHDOG_WINDOW``), the
descriptor its type, default, meaning and the values it accepts.  The reader (:func:`read`), the table below and
docs/settings.md's table (``tools/gen_docs.py``) are derived from those declarations.  Standard library only: this module
is imported inside every sglang process.

:func:`current` reads the environment the first time it is called and keeps the result (:func:`reload` reads it
again: tests, or a process that changed its own environment before anything here ran).  A value that is not
understood is never ignored in silence: it is listed in :attr:`Settings.problems` and logged once, as is a patch
name that no registry knows (:func:`unknown_names`).  Surrounding spaces are dropped and a blank value is unset.

On and off are spelled one way everywhere: on is ``1``, ``true``, ``yes``, ``on``; off is unset, empty, ``0``,
``false``, ``no``, ``off`` (any case).

"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar, overload

logger = logging.getLogger("eagle3_patches")

PREFIX = "EAGLE3_PATCHES_"
#: in EAGLE3_PATCHES_DISABLE: every patch and instrument
ALL = "all"

ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})
#: the largest whole number a setting takes (a bound before anything is sized from it)
_WHOLE_MAX = 1 << 30

T = TypeVar("T")


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


class Setting(Generic[T]):
    """One ``EAGLE3_PATCHES_*`` variable, declared as an attribute of :class:`Settings`."""

    def __init__(self, default: T, meaning: str, *, behaviour: bool = False):
        self.default, self.meaning = default, meaning
        #: it changes what a server under eagle3-patches does to the EAGLE-3 path (which patches, the algorithm's
        #: upgrade, the layer-id convention): two servers that must agree (a prefill/decode pair) set it alike
        self.behaviour = behaviour
        self.attr = self.var = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr, self.var = name, PREFIX + name.upper()

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: Settings, owner: type | None = None) -> T: ...
    def __get__(self, obj: Settings | None, owner: type | None = None) -> Setting[T] | T:
        return self if obj is None else obj._values[self.attr]

    def parse(self, raw: str, problems: list[str]) -> T:
        """``raw`` (trimmed, not blank) as this setting's value; a value not understood appends to ``problems``
        and gives the default."""
        return raw  # type: ignore[return-value]  # Text: the value as written

    def accepts(self) -> str:
        """What the variable takes, for the table."""
        return "text"

    def shown_default(self) -> str:
        return "unset" if self.default in (None, "", frozenset()) else f"`{self.default}`"


class Text(Setting[T]):
    """The value as written (``None`` or ``""`` when unset)."""


class Names(Setting[frozenset[str]]):
    """A comma list of patch names."""

    def parse(self, raw: str, problems: list[str]) -> frozenset[str]:
        return names(raw)

    def accepts(self) -> str:
        return "comma list of patch names"


def _neither(var: str, raw: str, treated: str) -> str:
    return (
        f"{var}={raw!r} is neither on ({'/'.join(sorted(ON))}) nor off ({'/'.join(sorted(OFF - {''}))}); "
        f"treated as {treated}"
    )


class Flag(Setting[bool]):
    """On or off (:func:`parse_flag`); a value that is neither is off, and a problem."""

    def parse(self, raw: str, problems: list[str]) -> bool:
        value = parse_flag(raw)
        if value is None:
            problems.append(_neither(self.var, raw, "off"))
        return bool(value)

    def accepts(self) -> str:
        return "on / off"

    def shown_default(self) -> str:
        return "on" if self.default else "off"


class Word(Setting[str]):
    """One of ``words`` (any case); with ``flag``, on (``"on"``) and off (``""``) too."""

    def __init__(self, default: str, meaning: str, *, words: tuple[str, ...], flag: bool = False, **kw: Any):
        super().__init__(default, meaning, **kw)
        self.words, self.flag = words, flag

    def parse(self, raw: str, problems: list[str]) -> str:
        value = raw.lower()
        if value in self.words:
            return value
        if self.flag:
            on = parse_flag(raw)
            if on is None:
                problems.append(_neither(self.var, raw, "off"))
            return "on" if on else ""
        problems.append(
            f"{self.var}={value!r} is neither {' nor '.join(map(repr, self.words))}; treated as {self.default!r}"
        )
        return self.default

    def accepts(self) -> str:
        return " / ".join((["on", "off"] if self.flag else []) + [f"`{w}`" for w in self.words])

    def shown_default(self) -> str:
        return f"`{self.default}`" if self.default else "off"


class FlagOrPath(Setting[bool]):
    """On, off, or a path (which is on: :attr:`Settings.probe_path` holds it)."""

    def parse(self, raw: str, problems: list[str]) -> bool:
        return parse_flag(raw) is not False

    def accepts(self) -> str:
        return "on / off / a path"

    def shown_default(self) -> str:
        return "off"


class Number(Setting[T]):
    """A number in ``lo``..``hi`` (``lo_open`` / ``hi_open``: that end excluded), of ``unit``; ``whole``: an int.
    Outside the range or not a number: the default, and a problem."""

    def __init__(
        self,
        default: T,
        meaning: str,
        *,
        lo: float,
        hi: float = _WHOLE_MAX,
        unit: str = "",
        whole: bool = False,
        lo_open: bool = False,
        hi_open: bool = False,
    ):
        super().__init__(default, meaning)
        self.lo, self.hi, self.unit, self.whole, self.lo_open, self.hi_open = lo, hi, unit, whole, lo_open, hi_open

    def parse(self, raw: str, problems: list[str]) -> T:
        try:
            value = int(raw) if self.whole else float(raw)
            above = self.lo < value if self.lo_open else self.lo <= value
            below = value < self.hi if self.hi_open else value <= self.hi
            if above and below:
                return value  # type: ignore[return-value]  # T is the number's type (or None for unset)
        except ValueError:
            pass
        problems.append(f"{self.var}={raw!r} is not {self.accepts()}; using {self.shown_default().strip('`')}")
        return self.default

    def accepts(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        if self.unit:
            kind += f" of {self.unit}"
        lo = f"{self.lo:g} {'<' if self.lo_open else '<='} "
        hi = f" {'<' if self.hi_open else '<='} {'2^30' if self.hi == _WHOLE_MAX else format(self.hi, '.10g')}"
        return f"{kind}, {lo}value{hi}"

    def shown_default(self) -> str:
        return "unset" if self.default is None else f"`{self.default:g}`"


class Settings:
    """The settings of one environment (:func:`read`): each attribute below is one ``EAGLE3_PATCHES_*``
    variable's value; ``problems``: what was not understood."""

    # fmt: off
    apply: Text[str] = Text(
        "", "set by `eagle3-patches run`: `all` or a comma list of patch names to apply in every process (read by the "
        "bootstrap `sitecustomize`)", behaviour=True)
    disable = Names(
        frozenset(), "comma list of patch names never to apply (status: `disabled`); `all`: every patch and instrument",
        behaviour=True)
    enable = Names(frozenset(), "comma list of off-by-default patches and instruments to apply as well", behaviour=True)
    on_error = Word(
        "warn", "`warn`: a patch that fails to apply is logged, its whole selection is rolled back and reported "
        "`failed`; `raise`: the import that triggered it fails. A bootstrap that cannot load the library at all "
        "(`eagle3-patches run` with another Python) refuses to import sglang in that process unless this is set to "
        "`warn` explicitly", words=("warn", "raise"))
    cpu_profile = Word(
        "", "on: activate the CPU profile (refused when CUDA is available); `force`: activate even then",
        words=("force",), flag=True)
    upgrade_algorithm = Flag(
        False, "on: `--speculative-algorithm EAGLE` with an EAGLE-3 draft is upgraded to `EAGLE3` with a warning "
        "instead of refused", behaviour=True)
    layer_id_convention: Text[str] = Text(
        "", "sglang >= 0.5.13: the convention of a draft config that records none (`output-of-layer` or "
        "`input-of-layer`)", behaviour=True)
    probe = FlagOrPath(
        False, "on: the diagnostic probe (instrument `eagle3_probe`, `eagle3-patches run --probe`) logs what enters "
        "and leaves the EAGLE-3 path once per process, forward mode and hop; a path: also JSON lines there (a "
        "directory: `probe-<pid>.jsonl` per process; a `*.jsonl` file: appended by every process), read by "
        "`eagle3-patches probe-report`")
    dump_dir: Text[str | None] = Text(
        None, "the instrument `hidden_state_dump`: the directory its safetensors shards (aux hidden states + token ids "
        "of served requests) go to; setting it switches the dump on")
    dump_layer_ids: Text[str] = Text(
        "", "`hidden_state_dump` without EAGLE3 speculation: the aux layer ids to capture (comma list, the installed "
        "sglang's convention, e.g. `1,2,3`); unset: the `--speculative-draft-model-path` config's ids")
    dump_final_states = Flag(
        False, "`hidden_state_dump`: also the target's final normed hidden state of each row (`final_hidden_states`, "
        "H wide: a third more at Kimi-K2.5's width), which `eagle3-patches measure-accept --temperature` needs")
    dump_shard_tokens = Number(
        4096, "`hidden_state_dump`: rows (tokens) per shard before it is written (a partial shard is also written "
        "after one idle second and at exit)", lo=1, unit="rows", whole=True)
    series_dir: Text[str | None] = Text(
        None, "the fork path: a directory holding patch series directories, searched first")
    debug = Flag(False, "on: the CLI shows tracebacks instead of one-line messages")
    plugin = Flag(
        True, "installed next to sglang >= 0.5.11, the sglang plugin entry point applies the patch set in every sglang "
        "process; off: it does nothing (`eagle3-patches run` still works)")
    rank_check_timeout = Number(
        120.0, "seconds a rank waits for every other rank's patch set at model load (0: the check is off)",
        lo=0, hi=86400, unit="seconds")
    watchdog = Flag(
        True, "the accept-length watchdog (instrument `accept_watchdog`) follows each scheduler's speculative accept "
        "statistics, warns once per interval when drafts are essentially never accepted and runs the probe once to "
        "say why; off: it is not applied")
    watchdog_window = Number(
        200, "the watchdog's window: verify steps (one per request per decode batch) averaged together",
        lo=1, unit="verify steps", whole=True)
    watchdog_threshold = Number(
        1.05, "the watchdog fires when a window's mean accept length (accepted draft tokens + 1 per verify step, "
        "sglang's `accept len`) is below this", lo=1, hi=64, lo_open=True)
    watchdog_warmup = Number(
        100, "verify steps the watchdog ignores after the scheduler starts", lo=0, unit="verify steps", whole=True)
    watchdog_interval = Number(
        600.0, "seconds between two watchdog reports (0: every window that is below the threshold)",
        lo=0, hi=1e9, unit="seconds")
    expected_accept_length: Number[float | None] = Number(
        None, "the accept length the draft is expected to reach at the flags it is served with (the publisher's "
        "figure, or `eagle3-patches measure-accept`'s); overrides the draft config's `expected_accept_length` field; "
        "the watchdog compares the live figure with it", lo=1, hi=64, lo_open=True)
    expected_accept_temperature: Number[float | None] = Number(
        None, "the requests' temperature `EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH` holds at (0: greedy); the watchdog "
        "says it and compares only windows served at it; unset: not stated, every window is compared",
        lo=0, hi=100)
    watchdog_expected_fraction = Number(
        0.5, "the watchdog warns when a window's gain (accept length - 1) is below this fraction of the expected gain",
        lo=0, hi=1, lo_open=True, hi_open=True)
    # fmt: on

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        given: Mapping[str, str] | None = None,
        problems: tuple[str, ...] = (),
    ):
        """``values``: attribute -> value (a declaration's default where absent); ``given``: the variables set
        (trimmed, not blank)."""
        self._values = {s.attr: s.default for s in DECLARED} | dict(values or {})
        self._given = dict(given or {})
        self.problems = problems

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and (self._values, self._given) == (other._values, other._given)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def is_set(self, var: str) -> bool:
        """The variable was set (not blank), as sglang's ``EnvField.is_set``."""
        return var in self._given

    @property
    def on_error_explicit(self) -> bool:
        """EAGLE3_PATCHES_ON_ERROR was set (a failed bootstrap keeps sglang out unless ``warn`` is)."""
        return self.is_set(Settings.on_error.var)

    @property
    def probe_path(self) -> str | None:
        """The path EAGLE3_PATCHES_PROBE names, if it names one rather than on or off."""
        raw = self._given.get(Settings.probe.var)
        return raw if raw is not None and parse_flag(raw) is None else None

    @property
    def apply_names(self) -> frozenset[str] | None:
        """The names ``EAGLE3_PATCHES_APPLY`` lists; None for ``all``."""
        return None if self.apply == "all" else names(self.apply)

    def selects(self, name: str, default: bool = True) -> bool:
        """Whether a process with these settings runs the patch or instrument ``name`` (``default``: on unless
        asked): ``EAGLE3_PATCHES_APPLY``'s list where it names one, else on by default or listed in
        ``EAGLE3_PATCHES_ENABLE``; never where ``EAGLE3_PATCHES_DISABLE`` lists it or ``all``."""
        if name in self.disable or ALL in self.disable:
            return False
        listed = self.apply_names if self.apply else None
        return name in listed if listed is not None else default or name in self.enable

    def listed_names(self) -> dict[str, frozenset[str]]:
        """Every variable that lists patch names, with the names it lists."""
        out = {Settings.disable.var: self.disable, Settings.enable.var: self.enable}
        if self.apply and self.apply != "all":
            out[Settings.apply.var] = names(self.apply)
        return out


#: every declaration, in the order of the class
DECLARED: tuple[Setting[Any], ...] = tuple(v for v in vars(Settings).values() if isinstance(v, Setting))
KNOWN = tuple(s.var for s in DECLARED)
BEHAVIOUR = tuple(s.var for s in DECLARED if s.behaviour)
#: the behaviour settings that choose which patches run (:meth:`Settings.selects`): two processes agree on them when
#: they select the same patches, however each list is spelt or ordered
SELECTING = (Settings.apply.var, Settings.disable.var, Settings.enable.var)
_CONSTANTS = {s.attr.upper(): s.var for s in DECLARED}


def __getattr__(name: str) -> str:
    """``settings.WATCHDOG_WINDOW`` and the like: the variable's name, from its declaration."""
    try:
        return _CONSTANTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def table() -> str:
    """The Markdown table of the declarations (the README's, and this module's docstring's)."""
    rows = ["| variable | takes | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.var}` | {s.accepts()} | {s.shown_default()} | {s.meaning} |" for s in DECLARED]
    return "\n".join(rows)


if __doc__ is not None:  # not under python -OO
    __doc__ += table() + "\n"


def read(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings an environment holds (default: ``os.environ``); never raises."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    given = {s.var: env[s.var].strip() for s in DECLARED if env.get(s.var, "").strip()}
    values = {s.attr: s.parse(given[s.var], problems) for s in DECLARED if s.var in given}
    return Settings(values, given, tuple(problems))


_current: list[Settings] = []


def current() -> Settings:
    """This process's settings, read from the environment the first time (see :func:`reload`)."""
    if not _current:
        reload()
    # pragma: no mutate core/NumberReplacer: reload() keeps one Settings in the list, so [-1] is [0]
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
