"""What the registry records of sglang while ``recording_touches`` runs (what tools/drift_report.py compares between
releases), on real sglang objects: each touch names the module and qualname where sglang's source defines the object,
nothing outside sglang is recorded, recording never changes what a patch does, and the NotApplicable messages name
the object the way a user reads it.

The sglang modules used (``sglang.lang.ir``, ``sglang.lang.interpreter``, ``sglang.srt.environ``) import in a second
on a CPU machine; every change made through a :class:`Saver` here is restored before the test ends.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import wrapt

from eagle3_patches.registry import (
    NotApplicable,
    Saver,
    Touch,
    defines,
    expect_attr,
    expect_source,
    read_source_file,
    recording_touches,
    source_of,
)

ir = pytest.importorskip("sglang.lang.ir")
interp = pytest.importorskip("sglang.lang.interpreter")
environ = pytest.importorskip("sglang.srt.environ")

IR = "sglang.lang.ir"
INTERP = "sglang.lang.interpreter"


def _recorded(action) -> list[Touch]:
    """The touches ``action()`` records (what it raises, NotApplicable included, is left to the caller)."""
    with recording_touches() as touches:
        action()
    return list(touches)


def _changed(owner, attr, value) -> list[Touch]:
    """The touches of ``Saver.set(owner, attr, value)``, the change undone before returning."""
    saver = Saver()
    try:
        with recording_touches() as touches:
            saver.set(owner, attr, value)
        return list(touches)
    finally:
        saver.restore()


def _refusal(action) -> tuple[str, list[Touch]]:
    """The NotApplicable message ``action()`` raises, and the touches it recorded."""
    with recording_touches() as touches, pytest.raises(NotApplicable) as info:
        action()
    return str(info.value), list(touches)


def _source_error(obj) -> str:
    """What ``inspect.getsource`` says about ``obj`` on this Python (the tail of expect_source's message)."""
    with pytest.raises((OSError, TypeError)) as info:
        inspect.getsource(obj)
    return str(info.value)


def _wrapper(*args, **kwargs):
    return None


# -- modules ------------------------------------------------------------------------------------------------------


def test_reading_a_whole_module_is_recorded_with_an_empty_qualname():
    assert _recorded(lambda: source_of(ir)) == [Touch("reads", IR, "")]


def test_a_function_defined_in_a_module_is_recorded_under_its_name():
    assert _recorded(lambda: expect_attr(interp, "run_program")) == [Touch("requires", INTERP, "run_program")]


def test_a_function_imported_into_a_module_is_recorded_in_the_module_that_binds_the_name():
    """``from sglang.utils import encode_image_base64`` in the interpreter: a patch of that name changes the
    interpreter's binding, so the touch names the interpreter, not sglang.utils where the function is defined."""
    assert interp.encode_image_base64.__module__ == "sglang.utils"
    assert _recorded(lambda: expect_attr(interp, "encode_image_base64")) == [
        Touch("requires", INTERP, "encode_image_base64")
    ]
    assert _changed(interp, "encode_image_base64", _wrapper) == [Touch("changes", INTERP, "encode_image_base64")]


def test_a_lazy_import_in_sglangs_package_is_recorded_there_without_being_loaded():
    """``sglang.ServerArgs = LazyImport("sglang.srt.server_args", "ServerArgs")``: a callable whose attributes
    import its module; recording the name must not (on a CPU machine that import fails)."""
    sglang = pytest.importorskip("sglang")
    assert type(vars(sglang)["ServerArgs"]).__name__ == "LazyImport"
    assert _recorded(lambda: defines(sglang, "ServerArgs")) == [Touch("requires", "sglang", "ServerArgs")]


def test_an_alias_in_a_module_is_recorded_under_the_alias():
    saver = Saver()
    saver.set(interp, "eagle3_test_alias", interp.run_program)  # ``eagle3_test_alias = run_program``
    try:
        assert _recorded(lambda: defines(interp, "eagle3_test_alias")) == [
            Touch("requires", INTERP, "eagle3_test_alias")
        ]
    finally:
        saver.restore()
    assert not hasattr(interp, "eagle3_test_alias")


def test_a_module_constant_is_recorded_under_its_name():
    assert _recorded(lambda: defines(environ, "envs")) == [Touch("requires", "sglang.srt.environ", "envs")]


def test_a_name_a_module_lacks_is_refused_naming_the_module():
    message, touches = _refusal(lambda: expect_attr(ir, "nope"))
    assert message == "sglang.lang.ir.nope does not exist"
    assert touches == [Touch("requires", IR, "nope")]


# -- classes ------------------------------------------------------------------------------------------------------


def test_reading_a_class_is_recorded_under_its_qualname():
    assert _recorded(lambda: source_of(ir.SglGen)) == [Touch("reads", IR, "SglGen")]


def test_a_method_a_class_defines_is_recorded_on_that_class():
    assert _recorded(lambda: expect_attr(ir.SglGen, "__init__")) == [Touch("requires", IR, "SglGen.__init__")]


def test_an_inherited_method_is_recorded_at_the_base_class_that_defines_it():
    """SglGen inherits concatenate_ir from SglExpr: setting it on SglGen shadows SglExpr's, whose source is what
    the patch depends on."""
    assert "concatenate_ir" not in vars(ir.SglGen) and "concatenate_ir" in vars(ir.SglExpr)
    assert _changed(ir.SglGen, "concatenate_ir", _wrapper) == [Touch("changes", IR, "SglExpr.concatenate_ir")]
    assert "concatenate_ir" not in vars(ir.SglGen)


def test_wrapping_a_method_is_recorded_once_and_restored():
    original = vars(ir.SglGen)["__init__"]
    saver = Saver()
    try:
        with recording_touches() as touches:
            saver.wrap(ir.SglGen, "__init__", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
        assert touches == [Touch("changes", IR, "SglGen.__init__")]
        assert isinstance(vars(ir.SglGen)["__init__"], wrapt.FunctionWrapper)
    finally:
        saver.restore()
    assert vars(ir.SglGen)["__init__"] is original


def test_wrapping_a_method_the_class_only_inherits_is_refused_and_recorded_at_the_base():
    message, touches = _refusal(lambda: Saver().wrap(ir.SglGen, "concatenate_ir", _wrapper))
    assert message == "SglGen.concatenate_ir is not defined on that class"
    assert touches == [Touch("changes", IR, "SglExpr.concatenate_ir")]
    assert "concatenate_ir" not in vars(ir.SglGen)


def test_an_attribute_a_class_lacks_is_refused_naming_the_class():
    message, touches = _refusal(lambda: expect_attr(ir.SglGen, "nope"))
    assert message == "SglGen.nope does not exist"
    assert touches == [Touch("requires", IR, "SglGen.nope")]


# -- functions, methods and what wraps them -----------------------------------------------------------------------


def test_a_module_function_is_recorded_under_its_qualname():
    assert _recorded(lambda: source_of(interp.run_program)) == [Touch("reads", INTERP, "run_program")]


def test_a_method_read_from_its_class_is_recorded_with_the_class_in_its_qualname():
    assert _recorded(lambda: source_of(ir.SglGen.__init__)) == [Touch("reads", IR, "SglGen.__init__")]


def test_a_bound_method_is_recorded_as_the_function_it_binds():
    bound = ir.SglConstantText("hi").concatenate_ir
    assert _recorded(lambda: source_of(bound)) == [Touch("reads", IR, "SglExpr.concatenate_ir")]


def test_an_attribute_of_a_function_is_recorded_under_the_function():
    assert _changed(interp.run_program, "eagle3_test_mark", True) == [
        Touch("changes", INTERP, "run_program.eagle3_test_mark")
    ]
    assert not hasattr(interp.run_program, "eagle3_test_mark")


def test_a_function_wrapper_is_recorded_as_the_function_it_wraps():
    wrapped = wrapt.FunctionWrapper(interp.run_program, lambda wrapped, instance, args, kwargs: None)
    assert _recorded(lambda: source_of(wrapped)) == [Touch("reads", INTERP, "run_program")]


def test_a_wrapper_that_names_its_original_in_wrapped_is_recorded_as_that_original():
    """inspect.getsource follows ``__wrapped__``; the touch names the function whose source was read."""

    def patched(*args, **kwargs):
        return None

    patched.__wrapped__ = ir.SglExpr.concatenate_ir
    with recording_touches() as touches:
        src = source_of(patched)
    assert src == inspect.getsource(ir.SglExpr.concatenate_ir)
    assert touches == [Touch("reads", IR, "SglExpr.concatenate_ir")]


def test_an_sglang_object_without_a_name_is_recorded_and_refused_under_its_type():
    message, touches = _refusal(lambda: expect_source(environ.envs))
    assert message == f"cannot read the source of Envs: {_source_error(environ.envs)}"
    assert touches == [Touch("reads", "sglang.srt.environ", "Envs")]


def test_a_proxy_around_an_sglang_object_is_recorded_as_that_object():
    proxy = wrapt.ObjectProxy(environ.envs)
    assert _recorded(lambda: defines(proxy, "nope")) == [Touch("requires", "sglang.srt.environ", "Envs.nope")]


def test_a_proxy_around_an_sglang_class_is_recorded_as_that_class():
    proxy = wrapt.ObjectProxy(ir.SglGen)
    assert _recorded(lambda: defines(proxy, "__init__")) == [Touch("requires", IR, "SglGen.__init__")]
    assert _recorded(lambda: source_of(proxy)) == [Touch("reads", IR, "SglGen")]


def test_a_plain_class_that_names_an_sglang_class_in_wrapped_is_not_that_class():
    class Local:
        __wrapped__ = ir.SglGen

    assert _recorded(lambda: defines(Local, "__init__")) == []


# -- source checks ------------------------------------------------------------------------------------------------


def test_expect_source_passes_when_every_snippet_is_there_and_records_the_read():
    assert _recorded(lambda: expect_source(ir.SglGen, "class SglGen", "def __init__")) == [Touch("reads", IR, "SglGen")]


def test_expect_source_refuses_a_snippet_no_longer_there():
    message, touches = _refusal(lambda: expect_source(ir.SglGen, "def __init__", "no such code"))
    assert message == "SglGen no longer contains 'no such code'"
    assert touches == [Touch("reads", IR, "SglGen")]


def test_expect_source_refuses_a_builtin_it_cannot_read():
    message, touches = _refusal(lambda: expect_source(len))
    assert message == f"cannot read the source of len: {_source_error(len)}"
    assert touches == []


def test_expect_source_refuses_a_function_whose_source_file_is_gone():
    scope: dict = {"__name__": "scratch"}
    exec(compile("def gone():\n    return 1\n", "/nonexistent/eagle3_gone.py", "exec"), scope)
    gone = scope["gone"]
    message, touches = _refusal(lambda: expect_source(gone))
    assert message == f"cannot read the source of gone: {_source_error(gone)}"
    assert touches == []


def test_reading_an_sglang_source_file_is_recorded_as_a_read_of_its_module():
    path = ir.__file__
    with recording_touches() as touches:
        text = read_source_file(path, IR)
    assert text == Path(path).read_text(encoding="utf-8")
    assert touches == [Touch("reads", IR, "")]


def test_reading_another_packages_source_file_is_not_recorded():
    with recording_touches() as touches:
        text = read_source_file(inspect.__file__, "inspect")
    assert text == Path(inspect.__file__).read_text(encoding="utf-8")
    assert touches == []


# -- nothing outside sglang, and nothing outside a recording -------------------------------------------------------


def test_objects_outside_sglang_are_not_recorded():
    class Local:
        def method(self):
            return 1

    def helper():
        return 2

    saver = Saver()
    try:
        with recording_touches() as touches:
            source_of(helper)
            source_of(Local)
            defines(Local, "method")
            expect_attr(inspect, "getsource")
            saver.set(Local, "method", helper)
        assert touches == []
        assert Local.method is helper
    finally:
        saver.restore()
    assert Local().method() == 1


def test_outside_a_recording_nothing_is_recorded_and_patches_work_the_same():
    saver = Saver()
    try:
        saver.set(interp.run_program, "eagle3_test_mark", True)
        assert interp.run_program.eagle3_test_mark is True
        assert expect_attr(interp, "run_program") is interp.run_program
        assert defines(ir.SglGen, "__init__")
        assert read_source_file(ir.__file__, IR) == Path(ir.__file__).read_text(encoding="utf-8")
        with recording_touches() as touches:
            pass
        assert touches == []
    finally:
        saver.restore()
    assert not hasattr(interp.run_program, "eagle3_test_mark")


def test_an_owner_recording_cannot_place_is_still_changed_and_not_recorded():
    """Recording never changes what a patch does: an owner that even ``isinstance`` cannot inspect."""

    class Opaque:
        @property
        def __class__(self):
            raise RuntimeError("no class here")

    owner = Opaque()
    saver = Saver()
    with recording_touches() as touches:
        saver.set(owner, "value", 1)
    assert vars(owner) == {"value": 1}
    assert touches == []
    saver.restore()
    assert vars(owner) == {}
