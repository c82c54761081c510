"""cuda_graph_capture_order: the layers baked into CUDA graphs are the configured ones.

There is no CUDA graph on CPU, so the bug is shown by the call sequence the real
``ModelRunner`` performs: its real ``initialize`` -> ``init_device_graphs`` -> the real
``CudaGraphRunner.__init__`` (which makes the no-argument ``set_eagle3_layers_to_capture()``
call) -> ``capture()``.  Stand-ins, only for what cannot run on CPU:

* ``init_device_graphs`` skips graphs for device ``cpu`` unless torch.compile is on, and its
  ``cpu`` slot is ``CPUGraphRunner``: the child sets ``enable_torch_compile`` on the
  already-built ``ServerArgs`` (so nothing else in ``__post_init__`` changes) and puts a
  subclass of the real ``CudaGraphRunner`` in that slot, so the GPU code path runs.
* ``CudaGraphRunner.capture`` (the CUDA graph capture itself) records the target's
  ``layers_to_capture`` at the moment capture starts instead of capturing.

The tiny draft's aux ids are [1, 2, 3] (configured capture [2, 3, 4]); the tiny 6-layer
target's no-argument defaults are [2, 6 // 2, 6 - 3] = [2, 3, 3].
"""

from __future__ import annotations

import importlib.util
import linecache
import sys
import textwrap
import types

import pytest
from support.releases import requires_patch, stock_bug

from eagle3_patches.patches import cuda_graph_capture_order as cgo
from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checks.cuda_graph_capture_order import graph_capture_sequence
from eagle3_patches.testing.isolation import run_isolated

CONFIGURED = [2, 3, 4]  # draft eagle_aux_hidden_state_layer_ids [1, 2, 3], + 1
DEFAULTS = [2, 3, 3]  # [2, n // 2, n - 3] for the 6-layer tiny target


# --------------------------------------------------------------------------- real sglang, isolated
@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: ``graph_capture_sequence`` (its check module) on the tiny DeepSeek-V3, stock and patched."""
    return run_check("cuda_graph_capture_order")


@pytest.mark.stock
@pytest.mark.sglang
@stock_bug("cuda_graph_capture_order")
def test_stock_graphs_bake_in_the_default_layers(check):
    """Stock 0.5.9: capture runs with [2, 3, 3], eager prefill with [2, 3, 4]: the bug."""
    out = check.observations["stock"].value
    assert out["upstream"] is None  # the probe does not mistake 0.5.9 for the fixed release
    assert out["configured_ids"] == [1, 2, 3]
    assert out["graph_runner"] == "CudaGraphRunnerOnCpu"  # the GPU path really ran
    assert out["at_capture"] == [DEFAULTS]
    assert out["eager"] == CONFIGURED
    assert out["at_capture"][0] != out["eager"]  # graphs and eager prefill capture different layers
    # recapturing (weight update) leaves the defaults in force for eager runs too
    assert out["at_recapture"] == DEFAULTS
    assert out["eager_after_recapture"] == DEFAULTS
    assert check.bug == "present"


@pytest.mark.runtime_only
@pytest.mark.sglang
@requires_patch("cuda_graph_capture_order")
def test_patched_graphs_bake_in_the_configured_layers(check):
    assert check.status == PASSED, check.reason
    out = check.observations["patched"].value
    assert out["state"] == "applied"
    assert out["wrapped"]
    assert out["graph_runner"] == "CudaGraphRunnerOnCpu"
    assert out["at_capture"] == [CONFIGURED]
    assert out["eager"] == CONFIGURED
    assert not out["shadow_left"]  # the temporary instance attribute is gone after capture
    assert out["at_recapture"] == CONFIGURED
    assert out["eager_after_recapture"] == CONFIGURED
    assert out["revert_identity"]  # revert puts sglang's own function object back
    assert out["original_is_sglangs"]


@pytest.mark.runtime_only
@pytest.mark.sglang
@requires_patch("cuda_graph_capture_order")
def test_patched_kimi_wrapper_graphs_bake_in_the_configured_layers(tiny):
    """Model-agnostic: Kimi-K2.5's wrapper (setter delegated to its language_model)."""
    out = run_isolated(graph_capture_sequence, str(tiny["kimi_k25"]), str(tiny["draft"]), True)
    assert out["state"] == "applied"
    assert out["at_capture"] == [CONFIGURED]
    assert out["eager"] == CONFIGURED
    assert out["at_recapture"] == CONFIGURED
    assert not out["shadow_left"]


# --------------------------------------------------------------------------- the wrapper alone
class _LanguageModel:
    def __init__(self):
        self.calls: list = []
        self.layers_to_capture: list[int] = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append(layer_ids)
        self.layers_to_capture = [2, 3, 3] if layer_ids is None else [i + 1 for i in layer_ids]


class _Wrapper:
    """Like KimiK25ForConditionalGeneration after the delegation patch."""

    def __init__(self):
        self.language_model = _LanguageModel()

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        return self.language_model.set_eagle3_layers_to_capture(layer_ids)


class _Runner:
    def __init__(self, model, ids, use_aux=True):
        self.model = model
        self.eagle_use_aux_hidden_state = use_aux
        self.eagle_aux_hidden_state_layer_ids = ids
        self.seen: list = []

    def init_device_graphs(self):  # what CudaGraphRunner.__init__ does in 0.5.9
        self.model.set_eagle3_layers_to_capture()
        self.seen.append(list(self.model.language_model.layers_to_capture))


def _call(runner):
    return cgo._configured_ids_during_graph_capture(runner.init_device_graphs, runner, (), {})


def test_wrapper_redirects_the_no_argument_call_only_during_capture():
    runner = _Runner(_Wrapper(), [1, 2, 3])
    _call(runner)
    assert runner.seen == [CONFIGURED]
    assert cgo.SETTER not in vars(runner.model)
    runner.model.set_eagle3_layers_to_capture()  # outside capture: the model's own behaviour again
    assert runner.model.language_model.layers_to_capture == DEFAULTS


class _RunnerCallingWithIds(_Runner):
    def init_device_graphs(self):  # a capture that names its own ids: they are kept
        self.model.set_eagle3_layers_to_capture([0, 1])
        self.seen.append(list(self.model.language_model.layers_to_capture))


def test_wrapper_keeps_the_ids_a_call_during_capture_gives():
    runner = _RunnerCallingWithIds(_Wrapper(), [1, 2, 3])
    _call(runner)
    assert runner.model.language_model.calls[-1] == [0, 1]


class _RunnerWithoutTheNoArgumentCall(_Runner):
    def init_device_graphs(self):  # CPUGraphRunner / NPUGraphRunner: capture without calling the setter
        self.seen.append(list(self.model.language_model.layers_to_capture))


def test_wrapper_sets_the_configured_ids_before_a_capture_that_does_not_ask_for_them():
    runner = _RunnerWithoutTheNoArgumentCall(_Wrapper(), [1, 2, 3])
    _call(runner)
    assert runner.seen == [CONFIGURED]  # not the model's initial [] (no aux states in the graphs)


def test_wrapper_nested_capture_keeps_the_configured_ids_and_leaves_nothing_behind():
    """A subclass whose init_device_graphs calls the (wrapped) parent's: both levels capture the
    configured ids and the model is left as it was."""
    runner = _Runner(_Wrapper(), [1, 2, 3])
    inner = runner.init_device_graphs

    def outer():
        _call(runner)  # the wrapped parent, re-entered
        inner()

    cgo._configured_ids_during_graph_capture(outer, runner, (), {})
    assert runner.seen == [CONFIGURED, CONFIGURED]
    assert cgo.SETTER not in vars(runner.model)
    runner.model.set_eagle3_layers_to_capture()
    assert runner.model.language_model.layers_to_capture == DEFAULTS


def test_wrapper_logs_the_ids_the_graphs_are_captured_with(caplog):
    with caplog.at_level("DEBUG", logger="eagle3_patches"):
        _call(_Runner(_Wrapper(), [1, 2, 3]))
    assert "device graphs are captured with the configured EAGLE-3 aux layer ids [1, 2, 3]" in caplog.text


def test_wrapper_passes_through_without_configured_ids():
    for runner in (_Runner(_Wrapper(), None), _Runner(_Wrapper(), [1, 2, 3], use_aux=False)):
        _call(runner)
        assert runner.seen == [DEFAULTS]
        assert runner.model.language_model.calls == [None]


def test_wrapper_restores_an_own_attribute_and_survives_errors():
    model = _Wrapper()
    own = model.set_eagle3_layers_to_capture  # a bound method stored on the instance
    model.set_eagle3_layers_to_capture = own
    runner = _Runner(model, [1, 2, 3])

    def boom():
        runner.model.set_eagle3_layers_to_capture()
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        cgo._configured_ids_during_graph_capture(boom, runner, (), {})
    assert vars(model)[cgo.SETTER] is own
    assert model.language_model.layers_to_capture == CONFIGURED


# --------------------------------------------------------------------------- upstream probe
_INIT_059 = """
def initialize(self):
    self.init_attention_backend()
    self.init_device_graphs()
    if self.eagle_use_aux_hidden_state:
        self.model.set_eagle3_layers_to_capture(self.eagle_aux_hidden_state_layer_ids)
"""
_INIT_0511 = """
def initialize(self):
    # Must be called BEFORE init_device_graphs() so CUDA graph capture sees the ids
    self.init_aux_hidden_state_capture()
    self.init_attention_backend()
    self.init_device_graphs()
"""
_GRAPH_RUNNER_059 = """
def __init__(self, model_runner):
    if model_runner.eagle_use_aux_hidden_state:
        self.model_runner.model.set_eagle3_layers_to_capture()
    self.capture()
"""
_GRAPH_RUNNER_0511 = """
def __init__(self, model_runner):
    self.capture()
"""


def test_upstream_probe_reads_the_call_order():
    assert not cgo.ids_configured_before_graphs(_INIT_059, _GRAPH_RUNNER_059)
    assert cgo.ids_configured_before_graphs(_INIT_0511, _GRAPH_RUNNER_0511)
    assert cgo.ids_configured_before_graphs(_INIT_0511, None)
    # ids set first but the graph runner still resets them to the defaults: not fixed
    assert not cgo.ids_configured_before_graphs(_INIT_0511, _GRAPH_RUNNER_059)
    # a comment mentioning init_device_graphs() is not a call
    assert not cgo.ids_configured_before_graphs(
        _INIT_059.replace("    self.init_attention", "    # init_device_graphs()\n    self.init_attention"), None
    )


def test_upstream_probe_reads_calls_not_text():
    # no init_device_graphs call, or no configuring call: nothing says the ids come first
    assert not cgo.ids_configured_before_graphs(
        "def initialize(self):\n    self.init_aux_hidden_state_capture()\n", None
    )
    assert not cgo.ids_configured_before_graphs("def initialize(self):\n    self.init_device_graphs()\n", None)
    # bare names and the ids passed to the setter (0.5.11's own shape) count as calls
    src = "def initialize(self):\n    set_eagle3_layers_to_capture(ids)\n    init_device_graphs()\n"
    assert cgo.ids_configured_before_graphs(src, None)
    # on one line, the column decides
    assert cgo.ids_configured_before_graphs(
        "def initialize(self):\n    self.init_aux_hidden_state_capture(); self.init_device_graphs()\n", None
    )
    assert not cgo.ids_configured_before_graphs(
        "def initialize(self):\n    self.init_device_graphs(); self.init_aux_hidden_state_capture()\n", None
    )
    # a graph runner that passes ids (positionally or by keyword) does not reset them
    for call in ("set_eagle3_layers_to_capture(ids)", "set_eagle3_layers_to_capture(layer_ids=ids)"):
        assert cgo.ids_configured_before_graphs(_INIT_0511, f"def __init__(self, runner):\n    self.model.{call}\n")
    # source that does not parse proves nothing
    assert not cgo.ids_configured_before_graphs("def initialize(self:\n", None)


def _load(tmp_path, name, source):
    """A module from a real file, so that ``inspect.getsource`` reads it as it reads sglang's."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runner_module(tmp_path, name, initialize, graph_runner_init=None):
    src = "class ModelRunner:\n" + textwrap.indent(textwrap.dedent(initialize), "    ")
    if graph_runner_init is not None:
        src += "\n\nclass CudaGraphRunner:\n" + textwrap.indent(textwrap.dedent(graph_runner_init), "    ")
    return _load(tmp_path, name, src)


CGR_MODULE = "sglang.srt.model_executor.cuda_graph_runner"


def test_upstream_reads_the_releases_model_runner_and_graph_runner(tmp_path, monkeypatch):
    """``upstream()`` on modules shaped like 0.5.9's and 0.5.11's: fixed only where both agree."""
    monkeypatch.delitem(sys.modules, CGR_MODULE, raising=False)
    fixed = cgo.PATCH.upstream(_runner_module(tmp_path, "mr_0511", _INIT_0511, _GRAPH_RUNNER_0511))
    assert fixed and "0.5.11" in fixed
    assert cgo.PATCH.upstream(_runner_module(tmp_path, "mr_059", _INIT_059, _GRAPH_RUNNER_0511)) is None
    assert cgo.PATCH.upstream(_runner_module(tmp_path, "mr_reset", _INIT_0511, _GRAPH_RUNNER_059)) is None
    # the graph runner not imported into model_runner: read from its own module where loaded
    assert cgo.PATCH.upstream(_runner_module(tmp_path, "mr_alone", _INIT_0511))
    graph_module = _load(
        tmp_path, "cgr_059", "class CudaGraphRunner:\n" + textwrap.indent(textwrap.dedent(_GRAPH_RUNNER_059), "    ")
    )
    monkeypatch.setitem(sys.modules, CGR_MODULE, graph_module)
    assert cgo.PATCH.upstream(_runner_module(tmp_path, "mr_alone2", _INIT_0511)) is None


def test_upstream_is_none_where_the_source_cannot_be_read(tmp_path):
    assert cgo.PATCH.upstream(types.ModuleType("no_model_runner")) is None
    builtin = types.ModuleType("builtin_initialize")
    builtin.ModelRunner = type("ModelRunner", (), {"initialize": len})  # TypeError from inspect
    assert cgo.PATCH.upstream(builtin) is None
    gone = _runner_module(tmp_path, "mr_gone", _INIT_0511, _GRAPH_RUNNER_0511)
    (tmp_path / "mr_gone.py").unlink()  # OSError from inspect
    linecache.checkcache()
    assert cgo.PATCH.upstream(gone) is None


def test_version_gate():
    from packaging.version import Version

    assert Version("0.5.9") in cgo.PATCH.applies_to
    assert Version("0.5.8") in cgo.PATCH.applies_to
    assert Version("0.5.11") not in cgo.PATCH.applies_to
