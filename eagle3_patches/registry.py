"""The patch registry: version gates, upstream probes, lazy application, originals kept.

A :class:`Patch` is a small declarative object (one module per patch under
``eagle3_patches/patches/``): the sglang module whose import triggers it, the
releases it applies to, a probe for the upstream fix, the source it expects to
find, and ``patch(module, saver)`` which changes sglang only through the
:class:`Saver` it is handed.  The saver records every original (gevent.monkey's
``saved`` map), so revert, ``is_object_patched`` and ``get_original`` are exact.

Application is lazy (wrapt post-import hooks): ``apply()`` never imports sglang;
a patch lands the moment its module is imported, or at once if it already is.
Applying one patch is all-or-nothing: if ``patch()`` raises halfway, what it had
changed is restored before the error is reported.
"""

from __future__ import annotations

import enum
import inspect
import logging
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterable

import wrapt
from packaging.specifiers import SpecifierSet

from . import settings
from .errors import PatchError
from .sglang_version import installed_sglang_version

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
    """One fix.  Subclasses set the class attributes and implement :meth:`patch`."""

    name: str = ""
    summary: str = ""  # what it fixes, one line
    module: str = ""  # the sglang module whose import triggers it
    applies_to: SpecifierSet = SpecifierSet()  # sglang releases that need it
    default_enabled: bool = True

    def upstream(self, module: ModuleType) -> str | None:
        """Return why the installed sglang already has the fix, or None."""
        return None

    def check(self, module: ModuleType) -> None:
        """Raise :class:`NotApplicable` when the code to patch is not what was expected."""

    def patch(self, module: ModuleType, saver: Saver) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def expect_source(obj: Any, *snippets: str) -> None:
    """Raise NotApplicable unless every snippet occurs in ``obj``'s source."""
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError) as exc:
        raise NotApplicable(f"cannot read the source of {_qualname(obj)}: {exc}") from None
    for snippet in snippets:
        if snippet not in src:
            raise NotApplicable(f"{_qualname(obj)} no longer contains {snippet!r}")


def expect_attr(owner: Any, attr: str) -> Any:
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
    """A set of patches and what happened to each.  Thread-safe."""

    def __init__(self, label: str, patches: Iterable[Patch] = ()):
        self.label = label
        self._lock = threading.RLock()
        self._patches: dict[str, Patch] = {}
        self._states: dict[str, PatchStatus] = {}
        self._savers: dict[str, Saver] = {}
        self._selected: set[str] = set()
        self._hooked: set[str] = set()
        for p in patches:
            self.add(p)

    # -- declaration -------------------------------------------------------
    def add(self, patch: Patch) -> Patch:
        if not patch.name or patch.name in self._patches:
            raise ValueError(f"patch name {patch.name!r} empty or registered twice")
        self._patches[patch.name] = patch
        self._states[patch.name] = PatchStatus(patch.name, patch.summary, State.NOT_SELECTED)
        return patch

    def names(self) -> list[str]:
        return list(self._patches)

    def __getitem__(self, name: str) -> Patch:
        return self._patches[name]

    # -- the verbs ---------------------------------------------------------
    def apply(self, names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
        """Select patches (default: all enabled by default, plus ``EAGLE3_PATCHES_ENABLE``).

        Patches whose sglang module is already imported are applied now, all or none:
        if one fails, the others applied by this call are reverted and PatchError is raised.
        The rest land when their module is imported.
        """
        chosen = self._resolve(names)
        disabled = settings.name_list(settings.DISABLE)
        applied_now: list[str] = []
        with self._lock:
            for name in chosen:
                if name in disabled:
                    self._set(name, State.DISABLED, f"listed in {settings.DISABLE}")
                    continue
                if name in self._selected:
                    continue  # idempotent
                self._selected.add(name)
                patch = self._patches[name]
                if patch.module in sys.modules:
                    state = self._land(patch, sys.modules[patch.module])
                    if state is State.FAILED:
                        for done in reversed(applied_now):
                            self._unland(done)
                        for n in chosen:
                            self._selected.discard(n)
                        raise PatchError(
                            f"eagle3-patches: patch {name!r} failed: {self._states[name].reason}; "
                            "every patch applied by this call was reverted"
                        )
                    if state is State.APPLIED:
                        applied_now.append(name)
                else:
                    self._set(name, State.PENDING, f"waits for `import {patch.module}`")
                    self._hook(patch.module)
        return self.status()

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
                self._selected.discard(name)
                self._set(name, State.NOT_SELECTED)
            for name in undo:
                if name not in wanted:  # stacked on a reverted patch: put it back on top
                    self._set(name, State.PENDING)
                    self._land(self._patches[name], sys.modules[self._patches[name].module])
        return self.status()

    def status(self) -> dict[str, PatchStatus]:
        with self._lock:
            return {n: PatchStatus(**vars(s)) for n, s in self._states.items()}

    def is_applied(self, name: str) -> bool:
        return self._states[name].state is State.APPLIED

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
    def _unknown(self, name: str) -> None:
        if name not in self._patches:
            raise KeyError(
                f"eagle3-patches: unknown patch {name!r}; known {self.label} patches: {', '.join(self._patches)}"
            )

    def _resolve(self, names: Iterable[str] | None) -> list[str]:
        if names is None:
            extra = settings.name_list(settings.ENABLE)
            return [n for n, p in self._patches.items() if p.default_enabled or n in extra]
        names = list(names)
        for n in names:
            self._unknown(n)
        return names

    def _set(self, name: str, state: State, reason: str = "") -> None:
        self._states[name] = PatchStatus(name, self._patches[name].summary, state, reason)

    def _hook(self, module_name: str) -> None:
        if module_name in self._hooked:
            return
        self._hooked.add(module_name)
        wrapt.register_post_import_hook(self._on_import, module_name)

    def _on_import(self, module: ModuleType) -> None:
        with self._lock:
            for name in list(self._selected):
                patch = self._patches[name]
                if patch.module == module.__name__ and self._states[name].state is State.PENDING:
                    if self._land(patch, module) is State.FAILED and settings.raise_on_patch_error():
                        raise PatchError(f"eagle3-patches: patch {name!r} failed: {self._states[name].reason}")

    def _land(self, patch: Patch, module: ModuleType) -> State:
        """Apply one patch now, all or nothing; never raises, returns the new state."""
        name = patch.name
        if self._states[name].state is State.APPLIED:
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
            if version is not None and patch.applies_to and version not in patch.applies_to:
                self._set(name, State.NOT_APPLICABLE, f"sglang {version} is outside {patch.applies_to}")
                return State.NOT_APPLICABLE
            patch.check(module)
        except NotApplicable as exc:
            self._set(name, State.NOT_APPLICABLE, str(exc))
            return State.NOT_APPLICABLE
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
            logger.error("eagle3-patches: patch %s failed and was rolled back: %s", name, exc)
            return State.FAILED
        self._savers[name] = saver
        self._set(name, State.APPLIED, f"sglang {installed_sglang_version()}")
        logger.debug("eagle3-patches: applied %s", name)
        return State.APPLIED

    def _unland(self, name: str) -> None:
        saver = self._savers.pop(name, None)
        if saver is not None:
            saver.restore()


def _has_marker(module: ModuleType, name: str) -> bool:
    path = getattr(module, "__file__", None)
    if not path:
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            return SOURCE_MARKER.format(name=name) in fh.read()
    except OSError:
        return False

