"""tools/drift_report.py: what a patch touches is recorded by the registry, and the comparison of two releases'
sources (syntax trees, docstrings and formatting ignored) on small synthetic sources; no sglang needed."""

from __future__ import annotations

import types
import zipfile

import pytest

from eagle3_patches.registry import NotApplicable, Patch, Saver, Touch, expect_attr, expect_source, recording_touches


@pytest.fixture(scope="module")
def drift(tool):
    return tool("drift_report")


OLD = '''
"""module docstring"""
import os
from x import helper

if os.environ.get("A"):
    def branchy():
        return 1
else:
    def branchy():
        return 2


class Runner:
    """doc"""

    def forward(self, batch):
        """old doc"""
        out = self.model(batch)  # a comment
        return out

    def init_graphs(self):
        return capture(self.layers)

    def gone(self):
        return None


def plain(a, b):
    return a + b
'''

NEW = '''
"""module docstring, reworded"""
import os
from y import helper

if os.environ.get("A"):
    def branchy():
        return 1
else:
    def branchy():
        return 3


class Runner:
    """doc"""

    def forward(self,
                batch):
        """new doc"""
        out = self.model(batch)
        return out

    def init_graphs(self):
        self.set_aux_layers()
        return capture(self.layers)

    def fresh(self):
        return 0


def plain(a, b):
    # only a comment and formatting changed
    return (a + b)
'''


@pytest.mark.parametrize(
    "qualname, status",
    [
        ("Runner.forward", "unchanged"),  # docstring, comment, line breaks: no drift
        ("Runner.init_graphs", "changed"),
        ("Runner.gone", "removed"),
        ("Runner.fresh", "added"),
        ("Runner.nowhere", "absent"),
        ("plain", "unchanged"),
        ("branchy", "changed"),  # defined per branch of an if: every definition counts
        ("helper", "changed"),  # a module-level name bound by an import from elsewhere now
        ("Runner", "changed"),  # a class read as a whole changed when a method did
        ("", "changed"),  # the whole module
    ],
)
def test_compare_on_synthetic_sources(drift, qualname, status):
    assert drift.compare(OLD, NEW, qualname)["status"] == status


def test_a_changed_function_shows_its_normalised_diff(drift):
    diff = drift.compare(OLD, NEW, "Runner.init_graphs")["diff"]
    assert "+    self.set_aux_layers()" in diff
    assert drift.compare(OLD, NEW, "Runner.forward")["diff"] == ""


def test_a_module_missing_from_a_release(drift):
    assert drift.compare(None, NEW, "plain")["status"] == "added"
    assert drift.compare(OLD, None, "plain")["status"] == "removed"
    assert drift.compare(None, None, "plain")["status"] == "absent"


def test_module_source_reads_modules_and_packages_from_a_wheel(drift, tmp_path):
    wheel = tmp_path / "sglang-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/srt/runner.py", NEW)
        zf.writestr("sglang/srt/models/__init__.py", OLD)
    assert drift.module_source(wheel, "sglang.srt.runner") == NEW
    assert drift.module_source(wheel, "sglang.srt.models") == OLD
    assert drift.module_source(wheel, "sglang.srt.missing") is None


def _fake_sglang_module() -> types.ModuleType:
    """A module named like sglang's, with a class and a function defined in it."""
    mod = types.ModuleType("sglang.drift_fake")
    code = (
        "class Runner:\n    def forward(self, x):\n        return x\n\n    def init(self):\n        return 1\n\n"
        "def plain(a):\n    return a\n"
    )
    mod.__file__ = "<fake>"
    exec(compile(code, "<fake>", "exec"), mod.__dict__)
    return mod


def test_the_registry_records_what_a_patch_changes_requires_and_reads(monkeypatch):
    mod = _fake_sglang_module()
    monkeypatch.setattr("inspect.getsource", lambda obj: "def init(self):\n    return 1\n")

    class Fake(Patch):
        name = "fake"
        module = "sglang.drift_fake"

        def check(self, module):
            expect_attr(module.Runner, "init")
            expect_source(module.Runner.init, "return 1")

        def patch(self, module, saver):
            saver.wrap(module.Runner, "forward", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
            saver.set(module, "plain", lambda a: a)

    saver = Saver()
    with recording_touches() as touches:
        Fake().check(mod)
        Fake().patch(mod, saver)
    saver.restore()
    assert touches == [
        Touch("requires", "sglang.drift_fake", "Runner.init"),
        Touch("reads", "sglang.drift_fake", "Runner.init"),
        Touch("changes", "sglang.drift_fake", "Runner.forward"),
        Touch("changes", "sglang.drift_fake", "plain"),
    ]
    # outside the recorder nothing is kept; a missing attribute is recorded before the patch is refused
    Fake().check(mod)
    with recording_touches() as touches, pytest.raises(NotApplicable):
        expect_attr(mod.Runner, "gone")
    assert touches == [Touch("requires", "sglang.drift_fake", "Runner.gone")]


def test_objects_outside_sglang_are_not_recorded():
    mod = types.ModuleType("not_sglang")
    mod.f = lambda: None
    with recording_touches() as touches:
        Saver().set(mod, "f", lambda: 1)
    assert touches == []


def test_an_inherited_method_is_recorded_where_it_is_defined():
    mod = types.ModuleType("sglang.drift_fake_bases")
    exec(
        compile(
            "class Base:\n    def forward(self):\n        return 0\n\nclass Child(Base):\n    pass\n", "<fake>", "exec"
        ),
        mod.__dict__,
    )
    saver = Saver()
    with recording_touches() as touches:
        saver.set(mod.Child, "forward", lambda self: 1)
    saver.restore()
    assert touches == [Touch("changes", "sglang.drift_fake_bases", "Base.forward")]
