"""cuda_graph_capture_order

Bug: CUDA graphs are captured with the no-argument ``set_eagle3_layers_to_capture()`` defaults
``[2, n//2, n-3]`` before the draft's configured aux layer ids are applied, and bake those in.
Releases: sglang >=0.5.8,<0.5.11 (0.5.11 sets the ids before ``init_device_graphs()`` and
drops the no-argument call from ``CudaGraphRunner``).
Upstream probe: in ``ModelRunner.initialize``'s source the configured call
(``set_eagle3_layers_to_capture(`` or ``init_aux_hidden_state_capture(``) comes before
``init_device_graphs()``, and ``CudaGraphRunner.__init__`` no longer calls
``set_eagle3_layers_to_capture()`` without arguments.

Symptom: decode / target-verify graphs capture the default layers while eager prefill captures
the configured ids + 1; for Kimi-K2.5's [2, 30, 58] the two disagree by one layer and the
accept length drops with no error.  Re-capturing graphs after a weight update
(``update_weights_from_disk``) also leaves the defaults in force for eager runs.

The patch wraps ``ModelRunner.init_device_graphs``: when the runner uses aux hidden states
and the draft configured layer ids, it calls the model's ``set_eagle3_layers_to_capture(ids)``
first and, for the duration of the graph capture only, shadows that method on the model
instance so that a no-argument call means "the configured ids".  The shadow is removed
afterwards.  It only ever goes through the model's own ``set_eagle3_layers_to_capture``, so it
works for any target (``DeepseekV3ForCausalLM``, Kimi-K2.5's wrapper delegating to its
``language_model``, Llama, Qwen ...).
"""

from __future__ import annotations

import ast
import logging
import sys
import textwrap
from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, Diagnostics
from ..registry import Patch, Saver, expect_attr, expect_source, source_of

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
    order = 30
    summary = "CUDA graphs bake in the configured EAGLE-3 aux layers, not the no-argument defaults"
    module = "sglang.srt.model_executor.model_runner"
    applies_to = SpecifierSet(">=0.5.8,<0.5.11")

    def preflight(self, setup) -> Diagnostics:
        from ..checkpoint import layer_ids as L
        from ..checkpoint.formats import SGLANG_EAGLE3

        out = Diagnostics()
        tv, dv = setup.target, setup.draft
        if (setup.checkpoint_only or not setup.eagle3 or not self.covers(setup.version) or setup.launch.disable_cuda_graph
                or tv is None or not tv.num_layers or dv is None or dv.format != SGLANG_EAGLE3 or not dv.aux_ids):
            return out
        default = sorted(set(L.default_capture_points(tv.num_layers)))
        configured = sorted(set(L.capture_points(dv.aux_ids, setup.version)))
        if default != configured:
            out.add(
                ERROR,
                "cuda-graph-capture-order",
                f"sglang {setup.version} captures its CUDA graphs with the default layers (before {default}) before it sets the "
                f"configured ones (before {configured}): decode batches replayed from graphs feed the draft other layers than "
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
        expect_attr(module.ModelRunner, "init_device_graphs")
        expect_source(module.ModelRunner.initialize, "init_device_graphs()", f"{SETTER}(")
        expect_source(module.ModelRunner.__init__, "eagle_aux_hidden_state_layer_ids", "eagle_use_aux_hidden_state")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ModelRunner, "init_device_graphs", _configured_ids_during_graph_capture)


PATCH = CudaGraphCaptureOrder()
