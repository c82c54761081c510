"""Which sglang release the tests run against, and pytest markers that follow it.

The behavioural suite runs on every release of the matrix (``tools/matrix.py``).  Tests that
assert a *stock bug* of a release (0.5.9's Kimi wrapper without the EAGLE-3 hooks, ...) or that a
patch is ``applied`` only make sense where that patch applies; they carry one of the markers
below and are skipped, with the reason, elsewhere.  The facts come from
:mod:`eagle3_patches.checkpoint.releases` (the release table) and from each patch's declared
``applies_to`` (the registry); nothing here imports sglang.
"""

from __future__ import annotations

from types import ModuleType

from packaging.version import Version

from eagle3_patches.checkpoint.releases import PINNED, facts, rel
from eagle3_patches.sglang_version import installed_sglang_version


def sglang_version() -> Version | None:
    """The installed sglang release (``0.5.10.post1`` as is), or None when sglang is not installed."""
    return installed_sglang_version()


def release() -> tuple[int, int, int] | None:
    """The installed release as a 3-tuple (post releases compare as their base release)."""
    v = sglang_version()
    return None if v is None else rel(v)


def is_pinned() -> bool:
    v = release()
    return v is not None and v == rel(PINNED)


def patch_applies(name: str) -> bool:
    """The patch ``name`` declares the installed release (False when sglang is not installed)."""
    import eagle3_patches

    v = sglang_version()
    return v is not None and eagle3_patches.get_patch(name).covers(v)


def import_hooked_modules() -> dict[str, ModuleType]:
    """Every sglang module a patch or an instrument hooks, imported (patch name -> module); a module this release
    does not have (one of later releases) is left out and its patches told so (``Registry.module_absent``)."""
    import importlib

    import eagle3_patches

    out = {}
    for reg in eagle3_patches.registries():
        for name in reg.names():
            module = reg[name].module
            try:
                out[name] = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                reg.module_absent(module)
    return out


def expected_state(name: str, *, upstream: str = "upstream") -> str:
    """``applied`` where the patch declares the installed release, else ``upstream`` (or the given state)."""
    return "applied" if patch_applies(name) else upstream


def expected_states() -> dict[str, str]:
    """What ``eagle3_patches.apply()`` (default selection) should report per patch on the installed release.

    ``applied`` where a default-on patch declares the release; ``not-selected`` for opt-in patches.
    Patches outside their releases are left out: they report ``upstream`` or ``not-applicable``
    depending on their probe, which :func:`outside_states` checks.
    """
    import eagle3_patches

    out = {}
    for reg in eagle3_patches.registries():
        for name in reg.names():
            if not reg[name].default_enabled:
                out[name] = "not-selected"
            elif reg[name].covers(sglang_version()):
                out[name] = "applied"
    return out


def outside_states(states: dict[str, str]) -> dict[str, str]:
    """The states of patches that do not apply here and are neither upstream nor not-applicable (should be {})."""
    expected = expected_states()
    return {n: s for n, s in states.items() if n not in expected and s not in ("upstream", "not-applicable")}


def _pytest():
    import pytest

    return pytest


def stock_bug(patch: str):
    """Skip unless the installed release has the stock bug that patch ``patch`` fixes (it declares the release)."""
    v = sglang_version()
    return _pytest().mark.skipif(
        not patch_applies(patch),
        reason=f"asserts a stock bug fixed by {patch}, which does not apply to sglang {v} (see docs/compat.md)",
    )


def requires_patch(patch: str):
    """Skip unless patch ``patch`` applies to the installed release (tests that assert it is ``applied``)."""
    v = sglang_version()
    return _pytest().mark.skipif(
        not patch_applies(patch),
        reason=f"{patch} does not apply to sglang {v} (upstream or outside its releases; see docs/compat.md)",
    )


def only_release(spec: str, why: str = ""):
    """Skip unless the installed release is in the specifier set ``spec`` (e.g. ``"<0.5.10"``)."""
    from packaging.specifiers import SpecifierSet

    r = release()
    ok = r is not None and Version(".".join(map(str, r))) in SpecifierSet(spec)
    return _pytest().mark.skipif(
        not ok, reason=f"sglang {sglang_version()} is outside {spec}" + (f": {why}" if why else "")
    )


#: tests that pin the behaviour of stock sglang 0.5.9 itself
def stock_0_5_9():
    return only_release("==0.5.9", "pins stock 0.5.9 behaviour")


__all__ = [
    "sglang_version",
    "release",
    "is_pinned",
    "patch_applies",
    "expected_state",
    "expected_states",
    "outside_states",
    "stock_bug",
    "requires_patch",
    "only_release",
    "facts",
    "stock_0_5_9",
]
