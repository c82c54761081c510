"""hidden_state_dump (opt-in): served rows only; nothing recorded, and nothing copied to the host,
while sglang captures CUDA graphs.

On a GPU, a device-to-host copy inside ``torch.cuda.graph`` fails ("operation not permitted when
stream is capturing") on rank 0 and hangs the other ranks.  Recreated on CPU with sglang's real
``ModelRunner.init_device_graphs`` -> ``CudaGraphRunner`` (init, ``capture_one_batch_size``: its
static buffers, ``ForwardBatch`` and warm-up runs) where only the CUDA calls are replaced: the
graph capture itself runs the batch eagerly inside a mode under which every device-to-host copy
raises, as it does in a real capture.  Served forwards afterwards (eager prefill and decode) are
recorded, with their final states (``EAGLE3_PATCHES_DUMP_FINAL_STATES``): the rows the target's
lm_head turns into the logits sglang sampled from.
"""

from __future__ import annotations

import pytest
from support.releases import requires_patch

from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

pytestmark = [pytest.mark.sglang, requires_patch("hidden_state_dump")]
IDS = [1, 2, 3]


def _dump_around_graph_capture(target: str, dump_dir: str) -> dict:
    import logging
    import sys

    import sglang.srt.model_executor.cuda_graph_runner as cgr
    import sglang.srt.model_executor.model_runner as mr
    import torch
    from torch.overrides import TorchFunctionMode

    from eagle3_patches.instruments import hidden_state_dump as dump
    from eagle3_patches.testing import sglang_harness as h

    host_copies_refused: list[str] = []

    class NoDeviceToHostCopies(TorchFunctionMode):
        """What a CUDA stream capture allows the patch set: no tensor leaves the device.  Only copies made by
        eagle3_patches' own code are refused; sglang's CPU-only paths (the native MoE) make their own, which
        its GPU paths do not."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            to_host = func in (torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy) or (
                func is torch.Tensor.to and any(str(a) == "cpu" for a in (*args[1:], kwargs.get("device")))
            )
            if to_host and sys._getframe(1).f_globals.get("__name__", "").startswith("eagle3_patches."):
                host_copies_refused.append(getattr(func, "__name__", str(func)))
                raise RuntimeError("operation not permitted when stream is capturing")
            return func(*args, **kwargs)

    class CudaGraphRunnerOnCpu(cgr.CudaGraphRunner):
        """The real CudaGraphRunner; the CUDA graph object and its capture context are the stand-ins."""

        def _create_device_graph(self):
            return None

        def _capture_graph(self, graph, pool, stream, run_once_fn):
            with NoDeviceToHostCopies():
                return run_once_fn()

        def capture(self) -> None:  # without graph_capture()'s CUDA stream and the memory probes
            self.stream = None
            for bs in reversed(self.capture_bs):
                self.graphs[bs], self.output_buffers[bs] = self.capture_one_batch_size(
                    bs, self.model_runner.model.forward
                )

    warnings = h.eagle3_log(logging.WARNING)

    mr.CPUGraphRunner = CudaGraphRunnerOnCpu  # the GPU path's runner in the cpu slot of init_device_graphs
    cgr.set_global_graph_memory_pool(object())  # CPU torch has no graph pool handle
    sa = h.server_args(target, attention_backend="triton", dtype="float32", cuda_graph_bs=[1, 2])
    sa.enable_torch_compile = True  # the only way past `if device == "cpu" and not enable_torch_compile: return`
    runner = h.model_runner(sa)
    out = {
        "captured": sorted(runner.graph_runner.graphs),
        "host_copies_refused": host_copies_refused,
        "rows_after_capture": dump._DUMPER.n_rows if dump._DUMPER else 0,
    }
    runner.graph_runner = None  # served steps run eagerly here (replays of real graphs never reach Python)
    runner._dummy_run(batch_size=2)  # sglang's own warm-up forward on a made-up batch (flashinfer MoE autotune)
    out["rows_after_dummy_run"] = dump._DUMPER.n_rows if dump._DUMPER else 0
    step = h.prefill(runner, [[5, 6, 7, 8], [9, 10, 11]])
    out["prefill_logits"] = step.logits_output.next_token_logits.float().tolist()  # of each prompt's last token
    h.decode(runner, step)
    dump._DUMPER.flush()
    out["warnings"] = [r.getMessage() for r in warnings]
    return out


def test_nothing_recorded_or_copied_to_the_host_during_graph_capture(tiny, tmp_path):
    dump_dir = tmp_path / "dump"
    env = {
        "EAGLE3_PATCHES_DUMP_DIR": str(dump_dir),
        "EAGLE3_PATCHES_DUMP_LAYER_IDS": ",".join(map(str, IDS)),
        "EAGLE3_PATCHES_DUMP_FINAL_STATES": "1",
    }
    out = run_isolated(
        _dump_around_graph_capture, str(tiny["deepseek_v3"]), str(dump_dir), patches=["hidden_state_dump"], env=env
    )
    assert out["captured"] == [1, 2]  # sglang's capture really ran, for each batch size
    assert out["host_copies_refused"] == []  # the dump made no device-to-host copy inside the capture
    assert out["rows_after_capture"] == 0  # nor recorded the capture's warm-up or captured runs
    assert out["rows_after_dummy_run"] == 0  # nor sglang's dummy run
    assert any("--disable-cuda-graph" in w for w in out["warnings"])  # and said what it will miss

    from safetensors.torch import load_file

    shards = sorted(dump_dir.glob("shard-*.safetensors"))
    rows = [load_file(str(s)) for s in shards]
    ids = [int(i) for r in rows for i in r["input_ids"]]
    assert len(ids) == 4 + 3 + 2  # the served prefill (two prompts) and one decode step, nothing else
    assert ids[:7] == [5, 6, 7, 8, 9, 10, 11]
    assert {r["hidden_states"].shape[-1] for r in rows} == {len(IDS) * tm.HIDDEN}
    decoded = [int(d) for r in rows for d in r["decoded"]]
    assert decoded == [0] * 7 + [1, 1]  # prefill rows 0, the decode step's rows 1: what measure-accept measures on
    # the final states: one H-wide row per token, the target's final normed state (its lm_head gives the logits
    # sglang sampled the next token from), what measure-accept --temperature turns into the target's distribution
    import torch

    from eagle3_patches.acceptance.measure import load_target_head

    final = torch.cat([r["final_hidden_states"] for r in rows]).float()
    assert final.shape == (9, tm.HIDDEN)
    head = load_target_head(tiny["deepseek_v3"], torch.zeros(()))
    logits = head.logits(final[[3, 6]])  # each prompt's last row
    assert torch.allclose(logits, torch.tensor(out["prefill_logits"]), atol=1e-4)
    assert logits.argmax(-1).tolist() == ids[7:]  # the decode step's tokens: sglang's greedy choices
