"""cuda_graph_capture_order

Bug: ``ModelRunner.initialize`` calls ``init_device_graphs()`` first.  That builds a ``CudaGraphRunner``, whose
``__init__`` calls ``model.set_eagle3_layers_to_capture()`` with no arguments, which sets the defaults
``[2, n//2, n-3]`` (no +1), and then captures the decode / target-verify graphs.  Only after that does
``initialize`` call ``set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)`` with the draft's configured
ids.  So the graphs bake in the default layers, while eager runs (prefill, draft extend) capture the configured
ids + 1.  The same happens when graphs are captured again after ``update_weights_from_disk``, and that case is
worse: nothing re-applies the configured ids afterwards, so eager runs capture the defaults as well.

What users see: nothing at start and no error.  For Kimi-K2.5 with the draft ids ``[2, 30, 58]``, the graphs
capture before layers ``[2, 30, 58]`` and prefill captures before ``[3, 31, 59]``: one layer apart.  Every step
replayed from a graph gives the draft states from the wrong layers, so the accept length drops.  With
``--disable-cuda-graph`` the problem goes away, which is a clue.

What the patch changes: it wraps ``ModelRunner.init_device_graphs``.  This applies only when the runner uses aux
hidden states and the draft set ``eagle_aux_hidden_state_layer_ids``.  The wrapper first calls the model's own
``set_eagle3_layers_to_capture(ids)``.  While the graphs are being captured, it also places a method of the same
name on the model instance that turns a call with no arguments into a call with the configured ids.  When capture
ends, even if it fails, that temporary method is removed (or the previous instance attribute is put back).
Everything still goes through the model's own setter, so the patch works for any target: ``DeepseekV3ForCausalLM``,
Kimi-K2.5's wrapper (which delegates to ``language_model``, see ``kimi_k25_eagle3_delegation``), Llama, Qwen and
others.  If the draft set no ids (defaults), or the run has no aux capture, the call passes through unchanged.
Graph capture after a weight update is covered too.

Releases: sglang >=0.5.8,<0.5.11.  0.5.11 fixed it by call order: ``init_aux_hidden_state_capture()`` runs before
``init_device_graphs()``, and ``CudaGraphRunner`` no longer makes the call with no arguments.

Upstream probe: the patch parses the source of ``ModelRunner.initialize`` (with ``ast``, so comments do not count).
If the configured call (``set_eagle3_layers_to_capture(`` or ``init_aux_hidden_state_capture(``) comes before
``init_device_graphs()`` and ``CudaGraphRunner.__init__`` has no ``set_eagle3_layers_to_capture()`` call without
arguments, it reports ``upstream``.  Checked against the real 0.5.9 (not fixed) and 0.5.11 (fixed) sources.

Tests: ``tests/patches/test_cuda_graph_capture_order.py``.  The real ``ModelRunner`` for the tiny 6-layer
DeepSeek-V3 target with EAGLE3 and the tiny draft (ids ``[1, 2, 3]``, so the configured capture is ``[2, 3, 4]``
and the defaults are ``[2, 3, 3]``) is built in an isolated process.  Its real ``initialize`` ->
``init_device_graphs`` -> real ``CudaGraphRunner.__init__`` sequence runs.  Stand-ins are used only where CPU
cannot follow the GPU path:

1. ``init_device_graphs`` skips graphs on device ``cpu`` unless torch.compile is on.  The test sets
   ``enable_torch_compile`` on the ``ServerArgs`` after it is built and puts a subclass of the real
   ``CudaGraphRunner`` in the ``cpu`` slot.
2. ``CudaGraphRunner.capture`` records the target's ``layers_to_capture`` instead of doing the CUDA capture.

Results:

- Stock 0.5.9: capture sees ``[2, 3, 3]`` while eager uses ``[2, 3, 4]`` (the bug), and after a second graph
  capture eager also uses ``[2, 3, 3]``.
- Patched: capture and eager both see ``[2, 3, 4]``, also after the second capture, and no instance attribute is
  left on the model.
- ``revert()`` puts sglang's own function object back (identity).
- The same check passes for the tiny Kimi-K2.5 target, with ``kimi_k25_eagle3_delegation`` applied.
- Tests with no sglang involved cover: the wrapper on a stand-in Kimi-like model (redirect only during capture,
  pass-through without ids, restoring an existing instance attribute, cleanup after an exception), the upstream
  probe on 0.5.9-like and 0.5.11-like sources, and the version gate.

Not verified on CPU: a GPU is needed for a real CUDA graph capture and replay with the patch, i.e. that the replayed
decode / target-verify graphs produce aux states of the configured layers and the accept length recovers.  Also the
CUDA-only code around the capture: ``kernel_warmup`` / flashinfer autotune ``_dummy_run`` (it also calls the setter
with no arguments, before graph capture; the patch sets the configured ids again after it), ``torch.compile``'d
capture, and NPU graph runners.
"""

from __future__ import annotations

import ast
import logging
import sys
import textwrap
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..checkpoint import layer_ids as L
from ..checkpoint.formats import SGLANG_EAGLE3
from ..diagnostic import ERROR, Diagnostics
from ..registry import Patch, Saver, expect_attr, expect_source, source_of

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

NAME = "cuda_graph_capture_order"
SETTER = "set_eagle3_layers_to_capture"
_MISSING = object()


def configured_layer_ids(runner) -> list[int] | None:
    """The draft's aux layer ids this target runner will capture, or None (defaults / no aux capture)."""
    if not runner.eagle_use_aux_hidden_state:  # set in every ModelRunner.__init__ (check() reads it there)
        return None
    ids = getattr(runner, "eagle_aux_hidden_state_layer_ids", None)
    return None if ids is None else list(ids)


def _configured_ids_during_graph_capture(wrapped, instance, args, kwargs):
    """``ModelRunner.init_device_graphs`` with the configured aux layer ids in force during capture."""
    ids = configured_layer_ids(instance)
    model = getattr(instance, "model", None)
    setter = getattr(model, SETTER, None)
    if ids is None or setter is None:
        # no aux capture, or the draft asked for the defaults (what the no-arg call gives anyway);
        # a target without the setter fails in sglang's own code (or in kimi_k25_eagle3_delegation)
        return wrapped(*args, **kwargs)

    def set_layers_during_graph_capture(layer_ids=None):
        return setter(list(ids) if layer_ids is None else layer_ids)

    # Re-entered (a subclass calling super().init_device_graphs()), ``setter`` is the outer shadow:
    # the inner call shadows the shadow and puts it back, which changes nothing.
    own = vars(model).get(SETTER, _MISSING)
    # set first: CPUGraphRunner and NPUGraphRunner capture without the no-argument call
    setter(list(ids))
    setattr(model, SETTER, set_layers_during_graph_capture)
    logger.debug("eagle3-patches: device graphs are captured with the configured EAGLE-3 aux layer ids %s", ids)
    try:
        return wrapped(*args, **kwargs)
    finally:
        if own is _MISSING:
            vars(model).pop(SETTER, None)
        else:
            setattr(model, SETTER, own)


def _calls(src: str):
    """(line, col, name, n_args) of every call in ``src`` (comments and strings do not count)."""
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            calls.append((node.lineno, node.col_offset, name, len(node.args) + len(node.keywords)))
    return sorted(calls)


def ids_configured_before_graphs(initialize_src: str, graph_runner_init_src: str | None) -> bool:
    """The upstream fix, read from source: ``ModelRunner.initialize`` configures the aux layer ids
    (``set_eagle3_layers_to_capture(ids)`` or 0.5.11's ``init_aux_hidden_state_capture()``) before
    it calls ``init_device_graphs()``, and the graph runner no longer resets them with a no-arg call."""
    names = [name for _, _, name, _ in _calls(initialize_src)]  # in source order
    if "init_device_graphs" not in names:
        return False
    before_graphs = names[: names.index("init_device_graphs")]
    if not any(name in (SETTER, "init_aux_hidden_state_capture") for name in before_graphs):
        return False
    if graph_runner_init_src is None:
        return True
    return not any(name == SETTER and n == 0 for _, _, name, n in _calls(graph_runner_init_src))


def _source(obj) -> str | None:
    try:
        return source_of(obj)
    except (OSError, TypeError):
        return None


class CudaGraphCaptureOrder(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 30
    summary = "CUDA graphs bake in the configured EAGLE-3 aux layers, not the no-argument defaults"
    module = "sglang.srt.model_executor.model_runner"
    applies_to = SpecifierSet(">=0.5.8,<0.5.11")

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        tv, dv = setup.target, setup.draft
        if (
            setup.checkpoint_only
            or not setup.eagle3
            or not self.covers(setup.version)
            or setup.launch.disable_cuda_graph
            or tv is None
            or not tv.num_layers
            or dv is None
            or dv.format != SGLANG_EAGLE3
            or not dv.aux_ids
        ):
            return out
        default = sorted(set(L.default_capture_points(tv.num_layers)))
        configured = sorted(set(L.capture_points(dv.aux_ids, setup.version)))
        if default != configured:
            out.add(
                ERROR,
                "cuda-graph-capture-order",
                f"sglang {setup.version} captures its CUDA graphs with the default layers (before {default}) before "
                "it sets the "
                f"configured ones (before {configured}): decode batches replayed from graphs feed the draft other "
                "layers than "
                "eager prefill (accept length drops, no error)" + setup.once_eagle3,
                where="CUDA graphs (on by default)",
                found=f"graphs: before layers {default}; eager: before layers {configured}",
                expected="the same layers",
                fix="launch under `eagle3-patches run` (cuda_graph_capture_order), upgrade to sglang >= 0.5.11, or add "
                "--disable-cuda-graph (slow)",
            )
        return out

    def upstream(self, module: ModuleType) -> str | None:
        runner = getattr(module, "ModelRunner", None)
        initialize_src = _source(getattr(runner, "initialize", None))
        if initialize_src is None:
            return None
        graph_runner = getattr(module, "CudaGraphRunner", None)
        if graph_runner is None:
            cgr_module = sys.modules.get("sglang.srt.model_executor.cuda_graph_runner")
            graph_runner = getattr(cgr_module, "CudaGraphRunner", None)
        graph_runner_src = _source(graph_runner.__init__) if graph_runner is not None else None
        if ids_configured_before_graphs(initialize_src, graph_runner_src):
            return (
                "ModelRunner.initialize sets the configured aux layer ids before init_device_graphs() "
                "(sglang >= 0.5.11)"
            )
        return None

    def check(self, module: ModuleType) -> None:
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_attr(module.ModelRunner, "init_device_graphs")
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(module.ModelRunner.initialize, "init_device_graphs()", f"{SETTER}(")
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(module.ModelRunner.__init__, "eagle_aux_hidden_state_layer_ids", "eagle_use_aux_hidden_state")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ModelRunner, "init_device_graphs", _configured_ids_during_graph_capture)


PATCH = CudaGraphCaptureOrder()
