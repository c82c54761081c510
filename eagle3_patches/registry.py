"""The patch registry: version gates, upstream probes, lazy application, originals kept.

A :class:`Patch` is a small declarative object (one module per patch under
``eagle3_patches/patches/``): the sglang module whose import triggers it, the
releases it applies to, a probe for the upstream fix, the source it expects to
find, and ``patch(module, saver)`` which changes sglang only through the
:class:`Saver` it is handed.  The saver records every original (gevent.monkey's
``saved`` map), so revert, ``is_object_patched`` and ``get_original`` are exact.

Application is lazy (wrapt post-import hooks): ``apply()`` never imports sglang;
a patch lands the moment its module is imported, or at once if it already is.
Application is all-or-nothing: if ``patch()`` raises halfway, what it had changed is
restored, and so is every patch selected by the same ``apply()`` call.

A patch module is the one place for its sglang bug: the releases (``applies_to``), the
upstream probe, the runtime change, the preflight rule the doctor runs (``preflight``)
and the one-line summary ``status`` and docs/patches.md show.

What of sglang a patch touches is not declared a second time: inside :func:`recording_touches`,
every change through a :class:`Saver`, every attribute required with :func:`expect_attr` or probed with
:func:`defines` and every source read with :func:`source_of`, :func:`expect_source` or
:func:`read_source_file` is recorded as a :class:`Touch`
(``tools/drift_report.py`` runs each patch's probe, checks and change that way, then compares
the touched functions' sources between two sglang releases).
"""

from __future__ import annotations

import enum
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import wrapt
from packaging.specifiers import SpecifierSet

from . import settings
from .diagnostic import INFO, Diagnostic
from .errors import PatchError
from .sglang_version import base_release, installed_sglang_version

logger = logging.getLogger("eagle3_patches")

_MISSING = object()

#: Marker the fork-path diffs leave in sglang's source; a patch whose marker is in
#: its module's source reports ``in-source`` instead of patching at run time.
SOURCE_MARKER = "eagle3-patches: {name}"


class State(str, enum.Enum):
    NOT_SELECTED = "not-selected"  # apply() was not asked for it
    PENDING = "pending"  # selected; its sglang module is not imported yet
    APPLIED = "applied"
    IN_SOURCE = "in-source"  # the fork-path diff is present in sglang's source
    UPSTREAM = "upstream"  # the installed sglang already has the fix
    NOT_APPLICABLE = "not-applicable"
    DISABLED = "disabled"
    FAILED = "failed"


class NotApplicable(Exception):
    """Raised by a patch's checks: sglang's code is not what the patch was written for."""


@dataclass(frozen=True)
class Touch:
    """One sglang object a patch touched: ``kind`` is ``changes`` (set or wrapped through a Saver),
    ``requires`` (:func:`expect_attr`) or ``reads`` (its source read); ``module`` and ``qualname`` name
    it where it is defined (``qualname`` empty for a whole module)."""

    kind: str
    module: str
    qualname: str


_touches: list[Touch] | None = None


class recording_touches:  # noqa: N801 - used as a context manager, like a function
    """``with recording_touches() as touches:`` collects the :class:`Touch` of everything run inside
    (one recorder at a time; not thread-safe: a tool's, not a server's)."""

    def __enter__(self) -> list[Touch]:
        global _touches
        self._outer, _touches = _touches, []
        return _touches

    def __exit__(self, *exc: Any) -> None:
        global _touches
        _touches = self._outer


def _where(owner: Any, attr: str | None = None) -> tuple[str, str]:
    """(module, qualname) of ``owner.attr`` (or of ``owner``) as sglang's source defines it."""
    owner = getattr(owner, "__wrapped__", owner) if isinstance(owner, wrapt.ObjectProxy) else owner
    if isinstance(owner, ModuleType):
        # a module-level name, defined, imported or assigned there: recorded where the patch looks it up
        return owner.__name__, "" if attr is None else attr
    if inspect.isclass(owner):
        if attr:  # where the attribute is defined: the class itself or the base it inherits it from
            owner = next((k for k in inspect.getmro(owner) if attr in vars(k)), owner)
        base = getattr(owner, "__qualname__", owner.__name__)
        return owner.__module__, base + ("." + attr if attr else "")
    func = inspect.unwrap(getattr(owner, "__func__", owner)) if callable(owner) else owner
    module = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", "") or type(func).__name__
    return module, qual + ("." + attr if attr else "")


def _touch(kind: str, owner: Any, attr: str | None = None) -> None:
    if _touches is None:
        return
    try:
        module, qual = _where(owner, attr)
    except Exception:  # noqa: BLE001 - recording never changes what a patch does
        return
    if module.startswith("sglang"):
        _touches.append(Touch(kind, module, qual))


def defines(owner: Any, attr: str) -> bool:
    """``attr`` is in ``owner``'s own ``__dict__`` (an upstream probe's question), recorded as required."""
    _touch("requires", owner, attr)
    return attr in getattr(owner, "__dict__", {})


def read_source_file(path: str, module: str) -> str:
    """The text of sglang's source file ``path`` (the module ``module``, read without importing it), recorded
    as a read of that whole module; OSError as ``open`` raises it."""
    if _touches is not None and module.startswith("sglang"):
        _touches.append(Touch("reads", module, ""))
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def source_of(obj: Any) -> str:
    """``inspect.getsource(obj)`` (OSError / TypeError as it raises them), recorded as a read of ``obj``."""
    _touch("reads", obj)
    return inspect.getsource(obj)


@dataclass
class Saver:
    """Changes attributes and remembers the originals so they can be restored exactly."""

    records: list[tuple[Any, str, Any]] = field(default_factory=list)
    #: (value, attr, package prefix, original) of module functions other modules may import by name
    copies: list[tuple[Any, str, str, Any]] = field(default_factory=list)

    def set(self, owner: Any, attr: str, value: Any, *, imported_by: str | None = None) -> None:
        """``owner.attr = value``.  ``imported_by="sglang."``: modules of that package may bind the name
        (``from owner import attr``) after this, so :meth:`restore` also puts the original back in every
        such module that holds ``value`` then."""
        raw = owner.__dict__.get(attr, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, attr, _MISSING)
        _touch("changes", owner, attr)
        self.records.append((owner, attr, raw))
        if imported_by is not None and raw is not _MISSING:
            self.copies.append((value, attr, imported_by, raw))
        setattr(owner, attr, value)

    def wrap(self, owner: Any, attr: str, wrapper: Callable[..., Any]) -> None:
        """Replace ``owner.attr`` by a wrapt ``FunctionWrapper(original, wrapper)``.

        ``wrapper(wrapped, instance, args, kwargs)``, as in ``wrapt.wrap_function_wrapper``.
        """
        raw = owner.__dict__.get(attr, _MISSING)
        if raw is _MISSING:
            _touch("changes", owner, attr)
            raise NotApplicable(f"{_qualname(owner)}.{attr} is not defined on that class")
        self.set(owner, attr, wrapt.FunctionWrapper(raw, wrapper))

    def restore(self) -> None:
        while self.copies:
            value, attr, prefix, raw = self.copies.pop()
            for name, mod in list(sys.modules.items()):
                if name.startswith(prefix) and mod is not None and getattr(mod, "__dict__", {}).get(attr) is value:
                    setattr(mod, attr, raw)
        while self.records:
            owner, attr, raw = self.records.pop()
            if raw is _MISSING:
                try:
                    delattr(owner, attr)
                except AttributeError:
                    pass
            else:
                setattr(owner, attr, raw)


class Patch:
    """One fix: the one place for its sglang bug.  Subclasses set the class attributes and implement
    :meth:`patch`; the module's docstring states the bug, its releases and the upstream probe."""

    name: str = ""
    summary: str = ""  # what it fixes, one line (status, docs/patches.md)
    module: str = ""  # the sglang module whose import triggers it
    applies_to: SpecifierSet = SpecifierSet()  # sglang releases that need it
    default_enabled: bool = True
    #: its place in the set (application order, the fork series' order); ties go by name
    order: int = 100
    #: shipped as a fork-path diff too (patches/<series>/); False for a check of the library's own deployment
    in_fork_series: bool = True
    #: target architectures this patch makes able to serve an EAGLE-3 draft on the releases it applies to
    targets: tuple[str, ...] = ()
    #: with the patch active, a problem its preflight rule finds is "fixed" (the launch works) or
    #: "refused" (the launch stops at start with this library's message)
    remedy: str = "fixed"
    #: draft config fields (EAGLE-3.1's norms) that this patch makes a release read: the draft config field check
    #: (``eagle3_draft_config_fields``) counts them as read where the patch is active
    backports_draft_fields: frozenset[str] = frozenset()

    def upstream(self, module: ModuleType) -> str | None:
        """Return why the installed sglang already has the fix, or None."""
        return None

    def check(self, module: ModuleType) -> None:
        """Raise :class:`NotApplicable` when the code to patch is not what was expected."""

    def patch(self, module: ModuleType, saver: Saver) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def preflight(self, setup: Any) -> Iterable[Diagnostic]:
        """What the bug does to this setup on stock sglang, seen before any server starts (the doctor runs
        it): ``setup`` is what :class:`eagle3_patches.preflight.PatchSetup` declares (release, flags, configs,
        tensor headers; nothing of sglang imported), the annotation every override gives it (this layer is below
        that interface, hence ``Any`` here).  The doctor turns each diagnostic into a note, or marks it
        refused at start, where this patch is active (:attr:`remedy`)."""
        return ()

    def when_patched(self, d: Diagnostic, setup: Any) -> Diagnostic:
        """What a preflight diagnostic becomes on a server that runs this patch: the :attr:`remedy` policy (a note
        where the patch fixes it, an error that says so where it refuses it at start); an info stays as it is."""
        if d.severity == INFO:
            return d
        if self.remedy == "fixed":
            return d.replace(
                severity=INFO,
                fix="",
                what=f"{d.what} - fixed by eagle3-patches' {self.name} (the launch runs under it)",
            )
        return d.replace(what=f"{d.what} - eagle3-patches ({self.name}) refuses this at start")

    def enabled_by(self, s: settings.Settings) -> bool:
        """Selected by a plain ``apply()`` under settings ``s`` (on by default, or listed in
        ``EAGLE3_PATCHES_ENABLE``).
        """
        return self.default_enabled or self.name in s.enable

    def covers(self, version: Any) -> bool:
        """The patch applies to sglang ``version`` (its ``applies_to``; post releases as their base release)."""
        if version is None or not self.applies_to:
            return True
        return base_release(version) in self.applies_to


def expect_source(obj: Any, *snippets: str) -> None:
    """Raise NotApplicable unless every snippet occurs in ``obj``'s source."""
    try:
        src = source_of(obj)
    except (OSError, TypeError) as exc:
        raise NotApplicable(f"cannot read the source of {_qualname(obj)}: {exc}") from None
    for snippet in snippets:
        if snippet not in src:
            raise NotApplicable(f"{_qualname(obj)} no longer contains {snippet!r}")


def expect_attr(owner: Any, attr: str) -> Any:
    """``owner.attr`` from ``owner``'s own ``__dict__``; NotApplicable when it is not defined there."""
    _touch("requires", owner, attr)
    if attr not in getattr(owner, "__dict__", {}):
        raise NotApplicable(f"{_qualname(owner)}.{attr} does not exist")
    return owner.__dict__[attr]


def _qualname(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__


@dataclass
class PatchStatus:
    name: str
    summary: str
    state: State
    reason: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "summary": self.summary, "state": self.state.value, "reason": self.reason}


class Registry:
    """A set of patches and what happened to each.  Thread-safe.

    ``applied`` is never recorded, it is derived: a patch is applied exactly while its :class:`Saver`
    (its originals) is held.  Every other state is the outcome of its last attempt.  A patch lands
    through one code path, :meth:`_land_module`, whether its module was imported before ``apply()``
    (eagerly, from ``apply()``) or after (lazily, from the post-import hook); either way a failure
    rolls back every patch selected by the same ``apply()`` call, so sglang is never left half-patched.
    """

    def __init__(self, label: str, patches: Iterable[Patch] = ()):
        self.label = label
        self._lock = threading.RLock()
        self._patches: dict[str, Patch] = {}
        self._savers: dict[str, Saver] = {}  # application order; present <=> applied
        self._applied_reason: dict[str, str] = {}
        self._outcome: dict[str, PatchStatus] = {}  # every state but applied
        self._selection: dict[str, int] = {}  # name -> the apply() call that selected it
        self._calls = 0
        self._hooked: set[str] = set()
        self._absent: set[str] = set()  # modules this install does not have (module_absent)
        for p in sorted(patches, key=lambda p: (p.order, p.name)):
            self.add(p)

    # -- declaration -------------------------------------------------------
    def add(self, patch: Patch) -> Patch:
        if not patch.name or patch.name in self._patches:
            raise ValueError(f"patch name {patch.name!r} empty or registered twice")
        self._patches[patch.name] = patch
        self._set(patch.name, State.NOT_SELECTED)
        return patch

    def names(self) -> list[str]:
        return list(self._patches)

    def patches(self) -> list[Patch]:
        return list(self._patches.values())

    def __getitem__(self, name: str) -> Patch:
        return self._patches[name]

    def __contains__(self, name: object) -> bool:
        return name in self._patches

    # -- the verbs ---------------------------------------------------------
    def apply(self, names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
        """Select patches (default: all enabled by default, plus ``EAGLE3_PATCHES_ENABLE``).

        Patches whose sglang module is already imported land now; the rest when their module is
        imported.  All or none: if one fails, every patch this call selected is rolled back and
        reported ``failed``; now, :class:`PatchError` is raised (later, at import, it is logged, or
        raised with ``EAGLE3_PATCHES_ON_ERROR=raise``).
        """
        chosen = self._resolve(names)
        disabled = settings.current().disable
        with self._lock:
            self._calls += 1
            modules: list[str] = []
            for name in chosen:
                if name in disabled or settings.ALL in disabled:
                    self._set(name, State.DISABLED, f"listed in {settings.DISABLE}")
                    continue
                if name in self._selection:
                    continue  # idempotent
                self._selection[name] = self._calls
                patch = self._patches[name]
                if patch.module in self._absent:
                    self._set_absent(name)
                    continue
                self._set(name, State.PENDING, f"waits for `import {patch.module}`")
                if patch.module not in modules:
                    modules.append(patch.module)
            for module_name in modules:
                if module_name in sys.modules:
                    self._land_module(sys.modules[module_name], raise_errors=True)
                self._hook(module_name)
        return self.status()

    def module_absent(self, module_name: str) -> None:
        """This install has no ``module_name`` (a module of later releases): its patches, pending or selected
        later, will never land, and say so."""
        with self._lock:
            self._absent.add(module_name)
            for name, patch in self._patches.items():
                if patch.module == module_name and self._status(name).state is State.PENDING:
                    self._set_absent(name)

    def _set_absent(self, name: str) -> None:
        patch = self._patches[name]
        version = installed_sglang_version()
        self._set(name, State.NOT_APPLICABLE, f"sglang {version} has no {patch.module} ({patch.applies_to})")

    def revert(self, names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
        """Restore every original changed by the given (default: all) patches.

        Patches come off in reverse order of application.  A patch applied later that wraps an
        attribute a reverted patch also changed comes off first and is applied again afterwards,
        so stacked wrappers never resurrect a reverted one.
        """
        with self._lock:
            wanted = list(names) if names is not None else list(self._patches)
            for name in wanted:
                self._unknown(name)
            touched: set[tuple[int, str]] = set()
            undo = []
            for name, saver in self._savers.items():  # application order
                keys = {(id(owner), attr) for owner, attr, _ in saver.records}
                if name in wanted or keys & touched:
                    undo.append(name)
                    touched |= keys
            for name in reversed(undo):
                self._unland(name)
            for name in wanted:
                self._selection.pop(name, None)
                self._set(name, State.NOT_SELECTED)
            for name in undo:
                if name not in wanted:  # stacked on a reverted patch: put it back on top
                    self._set(name, State.PENDING)
                    self._land(self._patches[name], sys.modules[self._patches[name].module])
        return self.status()

    def status(self) -> dict[str, PatchStatus]:
        with self._lock:
            return {n: self._status(n) for n in self._patches}

    def is_applied(self, name: str) -> bool:
        return name in self._savers

    # -- gevent.monkey-style queries ---------------------------------------
    def is_object_patched(self, owner: Any, attr: str) -> bool:
        with self._lock:
            return any(o is owner and a == attr for s in self._savers.values() for o, a, _ in s.records)

    def get_original(self, owner: Any, attr: str) -> Any:
        """The attribute as it was before any patch of this registry (raw, unbound)."""
        with self._lock:
            for saver in self._savers.values():
                for o, a, raw in saver.records:
                    if o is owner and a == attr:
                        return None if raw is _MISSING else raw
        return owner.__dict__.get(attr)

    # -- internals ---------------------------------------------------------
    def _status(self, name: str) -> PatchStatus:
        if name in self._savers:
            return PatchStatus(name, self._patches[name].summary, State.APPLIED, self._applied_reason.get(name, ""))
        return PatchStatus(**vars(self._outcome[name]))

    def _unknown(self, name: str) -> None:
        if name not in self._patches:
            raise KeyError(
                f"eagle3-patches: unknown patch {name!r}; known {self.label} patches: {', '.join(self._patches)}"
            )

    def _resolve(self, names: Iterable[str] | None) -> list[str]:
        if names is None:
            s = settings.current()
            return [n for n, p in self._patches.items() if p.enabled_by(s)]
        names = list(names)
        for n in names:
            self._unknown(n)
        return [n for n in self._patches if n in names]  # the registry's order

    def _set(self, name: str, state: State, reason: str = "") -> None:
        self._outcome[name] = PatchStatus(name, self._patches[name].summary, state, reason)

    def _hook(self, module_name: str) -> None:
        if module_name in self._hooked:
            return
        self._hooked.add(module_name)
        wrapt.register_post_import_hook(self._on_import, module_name)

    def _on_import(self, module: ModuleType) -> None:
        self._land_module(module, raise_errors=settings.current().on_error == "raise")

    def _land_module(self, module: ModuleType, *, raise_errors: bool) -> None:
        """Land every selected, pending patch of ``module``, in order; on a failure roll back the failing
        patch's whole selection, then raise :class:`PatchError` or log it."""
        with self._lock:
            for name, patch in self._patches.items():
                if (
                    patch.module != module.__name__
                    or name not in self._selection
                    or self._status(name).state is not State.PENDING
                ):
                    continue
                if self._land(patch, module) is State.FAILED:
                    reason = self._outcome[name].reason
                    rolled = self._roll_back(self._selection[name], failed=name)
                    message = (
                        f"eagle3-patches: patch {name!r} failed: {reason}; every patch selected with it was "
                        f"rolled back ({', '.join(rolled) or 'none had landed'})"
                    )
                    if raise_errors:
                        raise PatchError(message)
                    logger.error("%s; sglang runs WITHOUT these patches", message)
                    return

    def _roll_back(self, call: int, *, failed: str) -> list[str]:
        """Undo every patch the ``apply()`` call ``call`` selected; returns those that had landed."""
        group = [n for n, c in self._selection.items() if c == call]
        landed = [n for n in self._savers if n in group]
        for name in reversed(landed):
            self._unland(name)
        for name in group:
            self._selection.pop(name, None)
            if name != failed:
                self._set(name, State.FAILED, f"rolled back: {failed}, selected with it, failed to apply")
        return landed

    def _land(self, patch: Patch, module: ModuleType) -> State:
        """Apply one patch now, all or nothing; never raises, returns the new state."""
        name = patch.name
        if name in self._savers:
            return State.APPLIED
        try:
            if _has_marker(module, name):
                self._set(name, State.IN_SOURCE, f"the fork-path diff is in {module.__file__}")
                return State.IN_SOURCE
            why = patch.upstream(module)
            if why:
                self._set(name, State.UPSTREAM, why)
                return State.UPSTREAM
            version = installed_sglang_version()
            if not patch.covers(version):
                self._set(name, State.NOT_APPLICABLE, f"sglang {version} is outside {patch.applies_to}")
                return State.NOT_APPLICABLE
            patch.check(module)
        except NotApplicable as exc:
            self._set(name, State.NOT_APPLICABLE, str(exc))
            return State.NOT_APPLICABLE
        except Exception as exc:  # noqa: BLE001 - a check that breaks on a changed sglang fails the patch, not sglang
            self._set(name, State.FAILED, f"{type(exc).__name__} while checking sglang's code: {exc}")
            return State.FAILED
        saver = Saver()
        try:
            patch.patch(module, saver)
        except NotApplicable as exc:
            saver.restore()
            self._set(name, State.NOT_APPLICABLE, str(exc))
            return State.NOT_APPLICABLE
        except Exception as exc:  # noqa: BLE001 - reported, originals restored
            saver.restore()
            self._set(name, State.FAILED, f"{type(exc).__name__}: {exc}")
            return State.FAILED
        self._savers[name] = saver
        self._applied_reason[name] = f"sglang {installed_sglang_version()}"
        logger.debug("eagle3-patches: applied %s", name)
        return State.APPLIED

    def _unland(self, name: str) -> None:
        saver = self._savers.pop(name, None)
        if saver is not None:
            saver.restore()


def discover(package: str) -> list[Patch]:
    """The ``PATCH`` of every module of ``package`` (imported: they import nothing of sglang at module level)."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    found = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        patch = getattr(module, "PATCH", None)
        if isinstance(patch, Patch):
            found.append(patch)
    return found


def _has_marker(module: ModuleType, name: str) -> bool:
    return in_source(getattr(module, "__file__", None), name)


def in_source(path: str | None, name: str) -> bool:
    """The fork-path diff of patch ``name`` is in the source file ``path``."""
    if not path:
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            return SOURCE_MARKER.format(name=name) in fh.read()
    except OSError:
        return False
