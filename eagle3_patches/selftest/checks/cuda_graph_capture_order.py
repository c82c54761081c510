"""cuda_graph_capture_order: CUDA graphs capture the configured aux layers (a CPU recreation; real graphs on a
GPU)."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import device_scenarios as ds
from ..base import Check, Context, Finding, describe_error
from ._shared import CONFIGURED


def graph_capture_order(ctx: Context) -> Finding:
    args = (ctx.path("deepseek_v3"), ctx.path("draft"))
    stock = ctx.observe(graph_capture_sequence, *args, False)
    patched = ctx.observe(graph_capture_sequence, *args, True)
    obs = {"stock": stock, "patched": patched}
    if stock[0] != "ok" or patched[0] != "ok":
        return Finding(False, describe_error(stock if stock[0] != "ok" else patched), None, observations=obs)
    s, p = stock[1], patched[1]
    bug = s["at_capture"] != [s["eager"]]
    stock_text = f"graphs captured layers {s['at_capture']}, eager runs capture {s['eager']}"
    fixed = (
        p["at_capture"] == [CONFIGURED]
        and p["eager"] == CONFIGURED
        and p["at_recapture"] == CONFIGURED
        and p["eager_after_recapture"] == CONFIGURED
        and not p["shadow_left"]
    )
    patched_text = (
        f"graphs captured layers {p['at_capture']}, eager {p['eager']}, after a re-capture "
        f"{p['at_recapture']} / {p['eager_after_recapture']} (configured {CONFIGURED})"
    )
    return Finding(fixed, patched_text, bug, stock_text, p["state"], p["reason"], observations=obs)


def graph_replay(ctx: Context) -> Finding:
    args = (ctx.path("deepseek_v3"), ctx.path("draft"), ctx.overrides())
    stock = ctx.observe(ds.graph_replay_vs_eager, *args)
    patched = ctx.observe(ds.graph_replay_vs_eager, *args, patches="all")

    def verdict(seen) -> tuple[bool | None, str]:
        if seen[0] != "ok":
            return None, describe_error(seen)
        out = seen[1]
        then = f"; then {out['error']}" if out["error"] else ""
        if not out["compared"]:
            return None, f"no target forward ran as a CUDA graph replay{then}"
        differ = [c for c in out["compared"] if c["graph_layers"] != c["eager_layers"]]
        first = (differ or out["compared"])[0]
        worst = max(max(c["relative_difference"], default=0.0) for c in out["compared"])
        return bool(differ), (
            f"{len(out['compared'])} graph replays ({first['mode']}, {out['attention_backend']}, "
            f"{out['dtype']}) vs eager on the same batch: the replay's aux states are the outputs of "
            f"layers {first['graph_layers']}, the eager ones of {first['eager_layers']} "
            f"({len(differ)} replays differ; largest relative difference {worst:.3g}){then}"
        )

    bug, stock_text = verdict(stock)
    differs, patched_text = verdict(patched)
    widths = sorted({s[-1] for s in patched[1]["fc_inputs"]}) if patched[0] == "ok" else []
    fixed = differs is False and widths == [3 * HIDDEN] and not patched[1]["error"]
    if patched[0] == "ok":
        patched_text += f"; fc inputs {widths} wide"
    return Finding(
        fixed,
        patched_text,
        bug,
        stock_text,
        *patched.patch("cuda_graph_capture_order"),
        observations={"stock": stock, "patched": patched},
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "cuda_graph_capture_order",
        "CUDA graphs are captured with the configured aux layers (CPU recreation)",
        graph_capture_order,
        patch="cuda_graph_capture_order",
        needs=("cpu",),
        instead="cuda_graph_replay",
        runs_on="<0.5.11",
        outside="fixed upstream in 0.5.11 (the ids are set before graph capture); the CPU "
        "recreation drives 0.5.8-0.5.10's call sequence, on a GPU `cuda_graph_replay` observes any release",
    ),
    Check(
        "cuda_graph_replay",
        "CUDA graphs on: aux states from graph replay equal the eager ones for the same batch",
        graph_replay,
        patch="cuda_graph_capture_order",
        needs=("cuda",),
    ),
)


# the scenario, run in an isolated process (``ctx.observe``)
def graph_capture_sequence(target: str, draft: str, patched: bool) -> dict:
    """The real target ``ModelRunner`` (EAGLE3) built through sglang's GPU graph path on CPU: which layers
    are in force when graph capture starts, and for eager runs afterwards; again after a re-capture (the
    weight-update path).  ``patched``: the patch set applied (lazily, before sglang is imported).

    There is no CUDA graph on CPU, so only the graph capture itself is replaced:
    ``init_device_graphs`` skips graphs for device ``cpu`` unless torch.compile is on, and its ``cpu``
    slot is ``CPUGraphRunner``; ``enable_torch_compile`` is set on the built ``ServerArgs`` and a subclass
    of the real ``CudaGraphRunner`` whose ``capture()`` records ``layers_to_capture`` takes that slot."""
    import eagle3_patches
    from eagle3_patches.patches import cuda_graph_capture_order as cgo

    if patched:
        eagle3_patches.apply()  # lazy: lands when sglang's modules are imported below
    reg = eagle3_patches.get_registry()

    import sglang.srt.model_executor.model_runner as mr
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    from eagle3_patches.testing import sglang_harness as h

    def layers(model) -> list[int]:
        lm = getattr(model, "language_model", model)  # Kimi-K2.5 wraps a DeepseekV3ForCausalLM
        return list(lm.model.layers_to_capture)

    at_capture: list[list[int]] = []

    class CudaGraphRunnerOnCpu(CudaGraphRunner):
        """The real CudaGraphRunner; only the CUDA graph capture itself is replaced by a record."""

        def capture(self) -> None:
            at_capture.append(layers(self.model_runner.model))

    mr.CPUGraphRunner = CudaGraphRunnerOnCpu  # the GPU path's runner in the cpu slot of init_device_graphs
    sa = h.eagle3_server_args(target, draft)
    sa.enable_torch_compile = True  # the only way past `if device == "cpu" and not enable_torch_compile: return`

    status = reg.status()[cgo.NAME]
    out: dict = {"state": status.state.value, "reason": status.reason, "upstream": cgo.PATCH.upstream(mr)}
    original = reg.get_original(mr.ModelRunner, "init_device_graphs")
    out["wrapped"] = mr.ModelRunner.__dict__["init_device_graphs"] is not original

    runner = h.model_runner(sa)
    out["configured_ids"] = runner.eagle_aux_hidden_state_layer_ids
    out["graph_runner"] = type(runner.graph_runner).__name__
    out["at_capture"] = list(at_capture)
    out["eager"] = layers(runner.model)
    out["shadow_left"] = cgo.SETTER in vars(runner.model)

    runner.init_device_graphs()  # update_weights_from_disk with recapture captures the graphs again
    out["at_recapture"] = at_capture[-1]
    out["eager_after_recapture"] = layers(runner.model)

    if out["wrapped"]:
        reg.revert([cgo.NAME])
        out["revert_identity"] = mr.ModelRunner.__dict__["init_device_graphs"] is original
        out["original_is_sglangs"] = original.__code__.co_filename == mr.__file__
    return out
