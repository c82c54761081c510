"""The registry's contract on a throwaway module: lazy, idempotent, all-or-nothing, exact revert."""

from __future__ import annotations

import copy
import importlib
import inspect
import itertools
import sys
import threading
import typing
import uuid

import pytest
from packaging.specifiers import SpecifierSet

from eagle3_patches import settings
from eagle3_patches.errors import PatchError
from eagle3_patches.registry import NotApplicable, Patch, Registry, State


@pytest.fixture
def module_name(tmp_path, monkeypatch):
    """A real importable module on disk with a class to patch."""
    name = f"fake_sglang_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("class Target:\n    def method(self):\n        return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _patch(module_name, *, name="p", fail=False, add=False, upstream=None, check=None, check_breaks=False):
    class P(Patch):
        summary = "test patch"
        module = module_name
        applies_to = SpecifierSet()

        def upstream(self, module):
            return upstream

        def check(self, module):
            if check:
                raise NotApplicable(check)
            if check_breaks:
                module.Target.renamed_in_a_new_release  # noqa: B018 - an AttributeError from a changed sglang

        def patch(self, module, saver):
            saver.wrap(module.Target, "method", lambda wrapped, inst, a, k: "patched:" + wrapped(*a, **k))
            if add:
                saver.set(module.Target, "added", lambda self: "new")
            if fail:
                raise RuntimeError("boom halfway")

    P.name = name
    return P()


def test_lazy_until_import_then_applied(module_name):
    reg = Registry("t", [_patch(module_name)])
    reg.apply()
    assert module_name not in sys.modules
    assert reg.status()["p"].state is State.PENDING
    mod = importlib.import_module(module_name)
    assert reg.status()["p"].state is State.APPLIED
    assert mod.Target().method() == "patched:original"


def test_a_module_the_install_lacks_makes_its_patches_not_applicable_now_and_later(module_name):
    later = f"absent_{uuid.uuid4().hex}"  # a module of later releases
    reg = Registry("t", [_patch(module_name), _patch(later, name="q")])
    reg.apply(["q"])
    assert reg.status()["q"].state is State.PENDING
    reg.module_absent(later)
    assert reg.status()["q"].state is State.NOT_APPLICABLE and later in reg.status()["q"].reason
    reg.revert()
    reg.apply()  # selected again: said at once, nothing waits for the import
    assert reg.status()["q"].state is State.NOT_APPLICABLE
    assert reg.status()["p"].state is State.PENDING  # the other module's patch is untouched


def test_a_patch_of_a_module_the_install_lacks_does_not_stop_the_selection_after_it(module_name):
    later = f"absent_{uuid.uuid4().hex}"
    reg = Registry("t", [_patch(later, name="a"), _patch(module_name, name="b")])
    reg.module_absent(later)
    reg.apply()
    assert [reg.status()[n].state for n in ("a", "b")] == [State.NOT_APPLICABLE, State.PENDING]


def test_apply_twice_changes_nothing_and_revert_restores_identity(module_name):
    mod = importlib.import_module(module_name)
    original = mod.Target.__dict__["method"]
    reg = Registry("t", [_patch(module_name, add=True)])
    reg.apply()
    wrapped = mod.Target.__dict__["method"]
    reg.apply()
    assert mod.Target.__dict__["method"] is wrapped
    assert mod.Target().method() == "patched:original"
    assert reg.is_object_patched(mod.Target, "method")
    assert reg.get_original(mod.Target, "method") is original
    reg.revert()
    assert mod.Target.__dict__["method"] is original
    assert "added" not in mod.Target.__dict__
    assert not reg.is_object_patched(mod.Target, "method")
    assert reg.status()["p"].state is State.NOT_SELECTED


def test_failure_halfway_restores_every_original_and_raises(module_name):
    mod = importlib.import_module(module_name)
    original = mod.Target.__dict__["method"]
    reg = Registry("t", [_patch(module_name, name="good"), _patch(module_name, name="bad", fail=True, add=True)])
    # "good" wraps method, then "bad" wraps it again and fails halfway: both are undone
    with pytest.raises(PatchError, match="bad.*boom halfway"):
        reg.apply()
    assert mod.Target.__dict__["method"] is original
    assert "added" not in mod.Target.__dict__
    assert reg.status()["bad"].state is State.FAILED


def test_failure_at_import_time_is_rolled_back_and_reported(module_name):
    reg = Registry("t", [_patch(module_name, fail=True, add=True)])
    reg.apply()
    mod = importlib.import_module(module_name)
    assert mod.Target().method() == "original" and "added" not in mod.Target.__dict__
    status = reg.status()["p"]
    assert status.state is State.FAILED and "boom halfway" in status.reason


def test_a_check_that_breaks_fails_the_patch_and_rolls_back_its_selection_instead_of_the_import(module_name, caplog):
    reg = Registry("t", [_patch(module_name, name="first"), _patch(module_name, name="broken", check_breaks=True)])
    reg.apply()
    with caplog.at_level("ERROR", logger="eagle3_patches"):
        mod = importlib.import_module(module_name)  # sglang's import goes on
    assert mod.Target().method() == "original"  # "first" landed, then was rolled back with its selection
    broken = reg.status()["broken"]
    assert broken.state is State.FAILED and "AttributeError while checking sglang's code" in broken.reason
    assert reg.status()["first"].state is State.FAILED
    assert any("sglang runs WITHOUT these patches" in r.getMessage() for r in caplog.records)


def test_an_eager_apply_whose_check_breaks_raises_naming_the_patch(module_name):
    importlib.import_module(module_name)
    reg = Registry("t", [_patch(module_name, name="broken", check_breaks=True)])
    with pytest.raises(PatchError, match="broken.*AttributeError"):
        reg.apply()


def test_upstream_and_not_applicable_leave_the_module_untouched(module_name):
    mod = importlib.import_module(module_name)
    original = mod.Target.__dict__["method"]
    reg = Registry(
        "t",
        [
            _patch(module_name, name="up", upstream="fixed in 9.9"),
            _patch(module_name, name="na", check="signature changed"),
        ],
    )
    reg.apply()
    assert mod.Target.__dict__["method"] is original
    assert reg.status()["up"].state is State.UPSTREAM and reg.status()["up"].reason == "fixed in 9.9"
    assert reg.status()["na"].state is State.NOT_APPLICABLE and "signature changed" in reg.status()["na"].reason


def test_version_gate(module_name, monkeypatch):
    from packaging.version import Version

    import eagle3_patches.registry as registry_module

    p = _patch(module_name)
    p.applies_to = SpecifierSet("<0.5.10")
    monkeypatch.setattr(registry_module, "installed_sglang_version", lambda: Version("0.5.12"))
    reg = Registry("t", [p])
    reg.apply()
    importlib.import_module(module_name)
    assert reg.status()["p"].state is State.NOT_APPLICABLE and "0.5.12" in reg.status()["p"].reason


def test_disabled_by_environment(module_name, monkeypatch):
    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", "p, other")
    settings.reload()
    reg = Registry("t", [_patch(module_name)])
    reg.apply()
    mod = importlib.import_module(module_name)
    assert reg.status()["p"].state is State.DISABLED
    assert mod.Target().method() == "original"


def test_unknown_name_is_a_clear_error(module_name):
    reg = Registry("t", [_patch(module_name)])
    with pytest.raises(KeyError, match="unknown patch 'nope'.*known t patches: p"):
        reg.apply(["nope"])


def test_concurrent_apply_wraps_once(module_name):
    mod = importlib.import_module(module_name)
    reg = Registry("t", [_patch(module_name)])
    threads = [threading.Thread(target=reg.apply) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mod.Target().method() == "patched:original"  # not patched:patched:...


def test_in_source_marker_reports_in_source(tmp_path, monkeypatch):
    name = f"fake_forked_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "# eagle3-patches: p\nclass Target:\n    def method(self):\n        return 'fixed'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("t", [_patch(name)])
    reg.apply()
    mod = importlib.import_module(name)
    assert reg.status()["p"].state is State.IN_SOURCE
    assert mod.Target().method() == "fixed"
    sys.modules.pop(name, None)


#: THE snapshot of the production patch set, in registry order: the one list of patch names to update when a patch
#: is added, renamed or removed (docs/patches.md, "Adding a patch", its checklist).  Every other count or list of
#: the patches in the tests is derived from the registries (the fork series, the selftest's checks, the docs table).
PATCHES = [
    "rank_consistency",
    "disaggregation_fingerprint",
    "kimi_k25_eagle3_delegation",
    "kimi_vl_eagle3_delegation",
    "qwen3_vl_eagle3_capture",
    "aux_capture_validation",
    "dp_attention_aux_gather",
    "cuda_graph_capture_order",
    "draft_chunked_prefix_cache",
    "tp_allreduce_fusion_capture",
    "speculators_draft_config",
    "eagle3_draft_strict_loading",
    "mla_draft_strict_loading",
    "eagle3_fc_guard",
    "mla_draft_fc_guard",
    "eagle3_draft_norms",
    "eagle3_algorithm_guard",
    "hicache_draft_kv",
    "eagle3_image_draft_rows",
    "eagle3_target_capability",
    "eagle3_draft_config_fields",
    "layer_id_convention",
]
INSTRUMENTS = ["accept_watchdog", "eagle3_probe", "hidden_state_dump"]


def test_production_registries_declare_every_patch_and_instrument():
    import eagle3_patches

    reg, instruments = eagle3_patches.registries()
    assert reg.names() == PATCHES
    assert instruments.names() == INSTRUMENTS
    for p in [*reg.patches(), *instruments.patches()]:
        assert p.summary and p.module.startswith("sglang.") and p.applies_to
        assert sys.modules[type(p).__module__].__doc__.lstrip().startswith(p.name)
    assert all(p.default_enabled for p in reg.patches())
    # the watchdog is the one instrument on by default (it reports, it changes nothing); the others are opt-in
    assert [p.name for p in instruments.patches() if p.default_enabled] == ["accept_watchdog"]


def test_reverting_a_patch_under_a_stacked_one_keeps_the_other_and_restores_identity(module_name):
    mod = importlib.import_module(module_name)
    original = mod.Target.__dict__["method"]
    reg = Registry("t", [_patch(module_name, name="first"), _patch(module_name, name="second")])
    reg.apply()
    assert mod.Target().method() == "patched:patched:original"
    reg.revert(["first"])
    assert mod.Target().method() == "patched:original"  # second is still on, first is gone
    assert reg.status()["second"].state is State.APPLIED
    assert reg.status()["first"].state is State.NOT_SELECTED
    reg.revert()
    assert mod.Target.__dict__["method"] is original


def test_full_revert_of_stacked_patches_restores_identity(module_name):
    mod = importlib.import_module(module_name)
    original = mod.Target.__dict__["method"]
    reg = Registry("t", [_patch(module_name, name="first"), _patch(module_name, name="second")])
    reg.apply()
    reg.revert()
    assert mod.Target.__dict__["method"] is original


def test_revert_follows_a_function_other_modules_imported_by_name(tmp_path, monkeypatch):
    """``saver.set(..., imported_by=prefix)``: a module of the package that bound the patched function by
    name after the patch landed gets the original back on revert; one holding something else is left alone."""
    pkg = f"fake_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "ops.py").write_text("def op():\n    return 'original'\n")
    (tmp_path / pkg / "user.py").write_text(f"from {pkg}.ops import op\n")
    (tmp_path / pkg / "other.py").write_text("def op():\n    return 'its own'\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class P(Patch):
        name = "by-name"
        summary = "test patch"
        module = f"{pkg}.ops"
        applies_to = SpecifierSet()

        def patch(self, module, saver):
            saver.set(module, "op", lambda: "patched", imported_by=pkg + ".")

    try:
        ops = importlib.import_module(f"{pkg}.ops")
        original = ops.op
        reg = Registry("t", [P()])
        reg.apply()
        user = importlib.import_module(f"{pkg}.user")  # binds the patched function by name
        other = importlib.import_module(f"{pkg}.other")
        assert user.op() == "patched" and other.op() == "its own"
        reg.revert()
        assert ops.op is original and user.op is original
        assert other.op() == "its own"
    finally:
        for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            sys.modules.pop(name)


# --------------------------------------------------------------------------- states that cannot lie
def _three(module_name, fail_third=True):
    """Three patches of one selection, each changing its own attribute; the third fails halfway."""
    out = []
    for i, name in enumerate(("one", "two", "three")):

        class P(Patch):
            summary = "test patch"
            module = module_name
            applies_to = SpecifierSet()
            order = i

            def patch(self, module, saver, _i=i):
                saver.set(module.Target, f"attr{_i}", "patched")
                if _i == 2 and fail_third:
                    raise RuntimeError("boom in the third")

        P.name = name
        out.append(P())
    return out


def _originals_back(mod):
    return all(f"attr{i}" not in mod.Target.__dict__ for i in range(3))


def test_eager_failure_of_the_third_patch_rolls_back_all_three_and_says_so(module_name):
    mod = importlib.import_module(module_name)
    reg = Registry("t", _three(module_name))
    with pytest.raises(PatchError, match="three.*boom in the third.*rolled back \\(one, two\\)"):
        reg.apply()
    assert _originals_back(mod)
    states = reg.status()
    assert {n: s.state for n, s in states.items()} == {"one": State.FAILED, "two": State.FAILED, "three": State.FAILED}
    assert "boom in the third" in states["three"].reason and "rolled back: three" in states["one"].reason
    assert not any(reg.is_applied(n) for n in states)


def test_lazy_failure_rolls_back_the_patches_of_the_same_selection_that_landed_earlier(module_name, tmp_path, caplog):
    """Two modules: the first imports fine and its patches land; the second's patch fails at import: the
    first's are rolled back too, sglang's originals everywhere, every state failed."""
    other = f"{module_name}_b"
    (tmp_path / f"{other}.py").write_text("class Target:\n    pass\n")
    import sys as _sys

    _sys.path.insert(0, str(tmp_path))
    try:
        first = _three(module_name, fail_third=False)[:2]
        bad = _three(other)[2]
        reg = Registry("t", [*first, bad])
        reg.apply()
        assert {n: s.state for n, s in reg.status().items()} == {
            "one": State.PENDING,
            "two": State.PENDING,
            "three": State.PENDING,
        }
        mod = importlib.import_module(module_name)
        assert reg.is_applied("one") and reg.is_applied("two") and mod.Target.__dict__["attr0"] == "patched"
        importlib.import_module(other)  # the post-import hook: the third fails
        assert _originals_back(mod) and "attr2" not in _sys.modules[other].Target.__dict__
        assert {n: s.state for n, s in reg.status().items()} == {
            "one": State.FAILED,
            "two": State.FAILED,
            "three": State.FAILED,
        }
        assert "sglang runs WITHOUT these patches" in caplog.text
    finally:
        _sys.path.remove(str(tmp_path))
        _sys.modules.pop(other, None)


def test_lazy_failure_raises_at_the_import_with_on_error_raise(module_name, monkeypatch):
    monkeypatch.setenv("EAGLE3_PATCHES_ON_ERROR", "raise")
    settings.reload()
    reg = Registry("t", _three(module_name))
    reg.apply()
    with pytest.raises(PatchError, match="three"):
        importlib.import_module(module_name)
    assert not any(reg.is_applied(n) for n in reg.names())


def test_applied_is_derived_from_the_originals_held(module_name):
    """No state is kept for 'applied': whatever restores the originals, the status follows."""
    mod = importlib.import_module(module_name)
    reg = Registry("t", _three(module_name, fail_third=False))
    reg.apply()
    assert all(s.state is State.APPLIED for s in reg.status().values())
    reg._unland("two")  # the saver gone, by whatever path
    assert reg.status()["two"].state is not State.APPLIED and "attr1" not in mod.Target.__dict__


# ------------------------------------------------------------------ selection, queries, version ranges, markers
def _second_module(tmp_path, name: str) -> str:
    (tmp_path / f"{name}.py").write_text("class Target:\n    def method(self):\n        return 'original'\n")
    return name


def test_a_patch_lands_on_its_own_module_only(module_name, tmp_path):
    """Two patches on two modules, selected together: importing the one module lands its patch, not the other's
    (whose module sorts before or after it)."""
    before, after = _second_module(tmp_path, "aaa_" + module_name), _second_module(tmp_path, "zzz_" + module_name)
    try:
        reg = Registry(
            "t", [_patch(before, name="on_before"), _patch(module_name, name="on_mine"), _patch(after, name="on_after")]
        )
        reg.apply()
        mod = importlib.import_module(module_name)
        assert {n: s.state for n, s in reg.status().items()} == {
            "on_before": State.PENDING,
            "on_mine": State.APPLIED,
            "on_after": State.PENDING,
        }
        assert mod.Target().method() == "patched:original"
        assert importlib.import_module(after).Target().method() == "patched:original"
        assert reg.status()["on_after"].state is State.APPLIED and reg.status()["on_before"].state is State.PENDING
    finally:
        sys.modules.pop(before, None)
        sys.modules.pop(after, None)


def test_a_disabled_or_already_selected_patch_does_not_stop_the_ones_after_it(module_name, monkeypatch):
    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", "a")
    settings.reload()
    reg = Registry(
        "t", [_patch(module_name, name="a"), _patch(module_name, name="b"), _patch(module_name, name="c", add=True)]
    )
    reg.apply(["a", "b"])
    assert [reg.status()[n].state for n in "abc"] == [State.DISABLED, State.PENDING, State.NOT_SELECTED]
    reg.apply(["b", "c"])  # b is selected already
    mod = importlib.import_module(module_name)
    assert [reg.status()[n].state for n in "abc"] == [State.DISABLED, State.APPLIED, State.APPLIED]
    assert mod.Target().added() == "new"


def test_a_patch_needs_a_name_of_its_own():
    p = Patch()
    with pytest.raises(ValueError, match="empty or registered twice"):
        Registry("t", [p])
    q = Patch()
    q.name = "q"
    with pytest.raises(ValueError, match="'q' empty or registered twice"):
        Registry("t", [q, q])


def test_queries_match_owner_and_attribute_both(module_name):
    mod = importlib.import_module(module_name)
    other = type("Other", (), {"method": lambda self: "other"})
    mod.Target.plain = "kept"
    reg = Registry("t", [_patch(module_name)])
    reg.apply()
    assert reg.is_object_patched(mod.Target, "method")
    assert not reg.is_object_patched(mod.Target, "plain") and not reg.is_object_patched(other, "method")
    assert reg.get_original(mod.Target, "plain") == "kept"  # not patched: what the class holds
    assert reg.get_original(other, "method") is other.__dict__["method"]


@pytest.mark.parametrize(
    "version, spec, covered",
    [
        ("0.5", "==0.5.0", True),  # a short release is padded with zeros
        ("1", "==1.0.0", True),
        ("0.5.9.post1", "<=0.5.9", True),  # a post release is its base release
        ("0.5.9.1", "<=0.5.9", True),  # a fourth number too
        ("0.5.10", "<=0.5.9", False),
    ],
)
def test_a_release_is_compared_as_its_first_three_numbers(version, spec, covered):
    from packaging.version import Version

    p = Patch()
    p.applies_to = SpecifierSet(spec)
    assert p.covers(Version(version)) is covered
    assert p.covers(None) is True  # no sglang found: nothing to exclude


def test_the_fork_marker_is_read_from_the_modules_file_only(tmp_path):
    from eagle3_patches.registry import SOURCE_MARKER, in_source

    f = tmp_path / "m.py"
    f.write_text(f"# {SOURCE_MARKER.format(name='p')}\n")
    assert in_source(str(f), "p") and not in_source(str(f), "q")
    assert not in_source(None, "p")  # a module without a file (a namespace package, a builtin)
    assert not in_source(str(tmp_path / "missing.py"), "p") and not in_source(str(tmp_path), "p")  # unreadable


def test_a_restored_addition_that_is_gone_already_is_no_error(module_name):
    from eagle3_patches.registry import Saver

    mod = importlib.import_module(module_name)
    saver = Saver()
    saver.set(mod.Target, "added", 1)
    del mod.Target.added
    saver.restore()
    assert "added" not in mod.Target.__dict__ and saver.records == []


def test_a_patch_is_tried_once_even_when_another_lands_on_its_module_later(module_name):
    """A patch's state is the outcome of its one attempt: a later apply() landing another patch on the same
    module does not ask the first again (whose check might pass on the changed module and land it unasked)."""
    asked = []
    up = _patch(module_name, name="up")
    up.upstream = lambda module: asked.append(1) or "fixed upstream"
    importlib.import_module(module_name)
    reg = Registry("t", [up, _patch(module_name, name="later")])
    reg.apply(["up"])
    reg.apply(["later"])
    assert (reg.status()["up"].state, reg.status()["later"].state, len(asked)) == (State.UPSTREAM, State.APPLIED, 1)


def test_revert_of_an_unknown_name_is_refused_before_anything_comes_off(module_name):
    mod = importlib.import_module(module_name)
    reg = Registry("t", [_patch(module_name)])
    reg.apply()
    with pytest.raises(KeyError, match="unknown patch 'nope'; known t patches: p"):
        reg.revert(["p", "nope"])
    assert reg.status()["p"].state is State.APPLIED and mod.Target().method() == "patched:original"


def test_a_reverted_patch_can_be_applied_again(module_name):
    mod = importlib.import_module(module_name)
    reg = Registry("t", [_patch(module_name)])
    reg.apply()
    reg.revert(["p"])
    assert mod.Target().method() == "original"
    reg.apply(["p"])
    assert reg.status()["p"].state is State.APPLIED and mod.Target().method() == "patched:original"


def test_a_patch_that_finds_sglang_changed_halfway_leaves_nothing_behind(module_name):
    """``patch()`` changed one attribute, then found the next one missing (``Saver.wrap`` raises NotApplicable):
    the first change is undone and the patch reports why."""
    mod = importlib.import_module(module_name)
    original = mod.Target.__dict__["method"]

    class Halfway(Patch):
        name, summary, module = "halfway", "test patch", module_name

        def patch(self, module, saver):
            saver.wrap(module.Target, "method", lambda wrapped, inst, a, k: "patched")
            saver.wrap(module.Target, "gone", lambda wrapped, inst, a, k: "patched")

    reg = Registry("t", [Halfway()])
    reg.apply()
    assert mod.Target.__dict__["method"] is original
    status = reg.status()["halfway"]
    assert (status.state, status.reason) == (State.NOT_APPLICABLE, "Target.gone is not defined on that class")


def test_each_patch_applied_is_logged_for_debugging(module_name, caplog):
    import logging

    importlib.import_module(module_name)
    with caplog.at_level(logging.DEBUG, logger="eagle3_patches"):
        Registry("t", [_patch(module_name)]).apply()
    assert "eagle3-patches: applied p" in caplog.messages


def test_a_failure_rolls_back_its_own_apply_call_only(module_name):
    """A patch that failed in a later apply() call takes down the patches selected with it, not those an earlier
    call applied; once its cause is gone it can be selected again."""
    mod = importlib.import_module(module_name)
    bad = _patch(module_name, name="bad", fail=True, add=True)
    reg = Registry("t", [_patch(module_name, name="good"), bad])
    reg.apply(["good"])
    with pytest.raises(PatchError, match="'bad' failed"):
        reg.apply(["bad"])
    assert reg.status()["good"].state is State.APPLIED and mod.Target().method() == "patched:original"
    assert reg.status()["bad"].state is State.FAILED and "added" not in mod.Target.__dict__

    bad.patch = lambda module, saver: saver.set(module.Target, "added", lambda self: "new")  # fixed
    reg.apply(["bad"])
    assert reg.status()["bad"].state is State.APPLIED and mod.Target().added() == "new"


def _order_is_marked_equivalent(patch: Patch) -> bool:
    """The patch's module marks the mutants of its ``order`` equivalent (the pragma right above ``order = ``)."""
    lines = inspect.getsource(type(patch)).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("order = "))
    above = list(itertools.takewhile(lambda line: line.strip().startswith("#"), reversed(lines[:at])))
    return any("pragma: no mutate core/NumberReplacer" in line for line in above)


def test_an_order_marked_equivalent_sorts_the_patch_set_alike_one_off():
    """The mark on a patch's ``order`` says one more or one less sorts the patch set as it is: hold every marked
    order to it (with a neighbour one away the tie goes by name, and may not), so a mark cannot go stale."""
    import eagle3_patches

    reg, _ = eagle3_patches.registries()
    marked = [p for p in reg.patches() if _order_is_marked_equivalent(p)]
    assert marked, "no order is marked: the pragma's form changed, and this test with it"
    for p in marked:
        for shift in (-1, 1):
            moved = copy.copy(p)
            moved.order = p.order + shift
            others = [q for q in reg.patches() if q.name != p.name]
            assert Registry("t", [*others, moved]).names() == reg.names(), (p.name, p.order + shift)


def test_a_shift_of_an_order_with_a_neighbour_one_away_is_caught():
    """The check above is not vacuous: an order one below a neighbour that sorts first by name would reorder (the
    production set keeps its marked orders clear of that, so two patches of this test stand for it)."""
    low, high = _patch("m", name="b"), _patch("m", name="a")
    low.order, high.order = 5, 6
    moved = copy.copy(low)
    moved.order = high.order
    assert Registry("t", [low, high]).names() == ["b", "a"]
    assert Registry("t", [high, moved]).names() == ["a", "b"]


def test_every_preflight_rule_is_typed_against_what_it_may_read():
    """A patch's ``preflight`` and ``when_patched`` annotate ``setup`` with :class:`PatchSetup`, so mypy refuses a rule
    that reads what the interface does not declare; :class:`Setup` is held to the interface by mypy (``run_rules``)."""
    import eagle3_patches
    from eagle3_patches.preflight import PatchSetup

    reg, instruments = eagle3_patches.registries()
    overriding = []
    for p in [*reg.patches(), *instruments.patches()]:
        for method in ("preflight", "when_patched"):
            fn = getattr(type(p), method)
            if fn is not getattr(Patch, method):
                # the modules import the interface for the type checker only (``TYPE_CHECKING``): a serving process does
                # not load the doctor's layer (tests/unit/test_architecture.py)
                hints = typing.get_type_hints(fn, localns={"PatchSetup": PatchSetup})
                overriding.append((p.name, method, hints.get("setup")))
    assert overriding
    assert [o for o in overriding if o[2] is not PatchSetup] == []


def test_the_draft_fields_a_patch_backports_are_declared_on_every_patch():
    import eagle3_patches

    reg, _ = eagle3_patches.registries()
    assert Patch.backports_draft_fields == frozenset()
    assert {p.name for p in reg.patches() if p.backports_draft_fields} == {"eagle3_draft_norms"}
