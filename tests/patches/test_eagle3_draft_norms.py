"""eagle3_draft_norms: an EAGLE-3.1-style draft gives the same draft-layer outputs on the pinned release with the
patch as on sglang 0.5.23, which reads its norms natively; stock 0.5.9 serves it without them.

The outputs: ``fc``'s output, the midlayer's (hidden, residual), the hidden state the draft hands to its next step,
and the logits, of real draft ``ModelRunner`` objects fed the same prefill and the same target states.  The same
function runs here and, as this file run as a script, in the 0.5.23 environment of ``tools/matrix.py``
(``.matrix/venv-0.5.23``), which writes its outputs to a safetensors file.

The midlayer's attention contributes nothing: its ``o_proj`` is zero and, in both runs, its output is replaced by
zeros of the same shape (a forward hook).  sglang 0.5.23's extend attention, run on CPU under the triton
interpreter in this harness, reads uninitialised memory: its output differs from one run to the next and is at
times NaN, which a zero ``o_proj`` does not cancel.  Every other part of the layer is deterministic; with the
attention's output zero, the comparison is exact and still covers every norm (all of them sit outside the
attention).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_patches.checkpoint.releases import NEWEST_KNOWN
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import only_release

pytestmark = pytest.mark.sglang
PATCHES = ["eagle3_draft_strict_loading", "eagle3_draft_norms"]
ROOT = Path(__file__).resolve().parents[2]
NEWEST = ".".join(map(str, NEWEST_KNOWN))
NEWEST_PYTHON = ROOT / ".matrix" / f"venv-{NEWEST}" / "bin" / "python"
#: the target states fed to the draft: wide enough that the norms change them (RMS far from 1)
STATE_SCALE = 3.0
TOKENS = 5
OUTPUTS = ("fc", "mid_hidden", "mid_residual", "to_logits", "handed_on", "logits")

#: the drafts: (config fields, how the fc norms' weights are named)
DRAFTS = {
    "eagle31": ({"fc_norm": True, "norm_output": True, "norm_before_fc": True}, "fc_norm"),
    "legacy_names": ({"use_aux_norm": True, "eagle_config": {"norm_before_fc": True}}, "aux_norm"),
}


def norm_draft_tensors(spec: tm.TinyDraftSpec, fc_names: str) -> dict:
    """The tiny draft's tensors plus ``input_norm`` and ``fc_norm`` weights far from 1 (a skipped norm shows), and a
    zero ``o_proj`` (the module docstring says why)."""
    import torch

    gen = torch.Generator().manual_seed(11)
    k, th = len(spec.aux_ids), spec.target_hidden
    t = tm.eagle3_draft_tensors(spec)

    def weight(n: int):
        return (1.0 + 0.5 * torch.randn(n, generator=gen)).to(torch.bfloat16)

    t["input_norm.weight"] = weight(k * th)
    names = ("aux_norm_low", "aux_norm_mid", "aux_norm_high") if fc_names == "aux_norm" else None
    for i in range(k):
        t[f"{names[i] if names else f'fc_norm.{i}'}.weight"] = weight(th)
    t["norm.weight"] = weight(spec.hidden)
    t["midlayer.self_attn.o_proj.weight"] = torch.zeros_like(t["midlayer.self_attn.o_proj.weight"])
    return t


def build_norm_draft(path: Path, kind: str) -> Path:
    fields, fc_names = DRAFTS[kind]
    cfg_fields = dict(fields)
    eagle = cfg_fields.pop("eagle_config", {})
    spec = tm.TinyDraftSpec(extra_config=cfg_fields)
    config = tm.eagle3_draft_config(spec)
    config["eagle_config"].update(eagle)
    return tm.write_checkpoint(path, config, norm_draft_tensors(spec, fc_names), spec.vocab)


def draft_layer_outputs(target: str, draft: str) -> dict:
    """The draft's outputs for a fixed 5-token prefill and fixed target states (3 x hidden), in float32."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft)
    target_runner = h.model_runner(sa)
    runner = h.draft_runner(sa, target_runner)
    model = runner.model.model
    layer = model.midlayer if hasattr(model, "midlayer") else model.layers[0]
    out: dict = {}
    model.fc.register_forward_hook(lambda m, i, o: out.__setitem__("fc", o))
    layer.register_forward_hook(lambda m, i, o: out.update(mid_hidden=o[0], mid_residual=o[1]))
    layer.self_attn.register_forward_hook(lambda m, i, o: torch.zeros_like(o))  # the module docstring says why
    model.register_forward_hook(lambda m, i, o: out.update(to_logits=o[0], handed_on=o[1][0]))

    batch = h.schedule_batch(h.make_reqs([list(range(5, 5 + TOKENS))]), runner, SpeculativeAlgorithm.EAGLE3)
    batch.prepare_for_extend()
    states = torch.randn(TOKENS, 3 * tm.HIDDEN, generator=torch.Generator().manual_seed(3)) * STATE_SCALE
    batch.spec_info = EagleDraftInput(hidden_states=states.clone())
    batch.capture_hidden_mode = CaptureHiddenMode.LAST
    fb = h.forward_batch(h.worker_batch(batch), runner)
    with torch.no_grad():
        out["logits"] = runner.forward(fb).logits_output.next_token_logits
    assert torch.equal(fb.spec_info.hidden_states, states), "the target states must be left as they came"
    return {k: v.detach().float().cpu().clone() for k, v in out.items()}


def newest_outputs(target: Path, draft: Path, out: Path) -> dict:
    """:func:`draft_layer_outputs` on stock sglang NEWEST, in its matrix environment (this file as a script)."""
    from safetensors.torch import load_file

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [str(NEWEST_PYTHON), __file__, str(target), str(draft), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(str(out))


@pytest.fixture(scope="module")
def norm_drafts(tiny_root) -> dict[str, Path]:
    return {kind: build_norm_draft(tiny_root / f"norm-draft-{kind}", kind) for kind in DRAFTS}


@pytest.fixture(scope="module")
def patched(tiny, norm_drafts) -> dict[str, dict]:
    return {
        kind: run_isolated(draft_layer_outputs, str(tiny["deepseek_v3"]), str(path), patches=PATCHES)
        for kind, path in norm_drafts.items()
    }


@pytest.fixture(scope="module")
def newest(tiny, norm_drafts, tmp_path_factory) -> dict[str, dict]:
    if not NEWEST_PYTHON.exists():
        pytest.skip(f"no sglang {NEWEST} environment at {NEWEST_PYTHON} (python tools/matrix.py --ci builds it)")
    tmp = tmp_path_factory.mktemp("newest-outputs")
    return {
        kind: newest_outputs(tiny["deepseek_v3"], path, tmp / f"{kind}.safetensors")
        for kind, path in norm_drafts.items()
    }


def _differing(a: dict, b: dict) -> list[str]:
    import torch

    return [k for k in OUTPUTS if not torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-5)]


@pytest.mark.parametrize("kind", list(DRAFTS))
def test_patched_outputs_equal_the_newest_releases(patched, newest, kind):
    """The proof: the same draft gives the same draft-layer outputs with the backport as on sglang 0.5.23."""
    assert set(patched[kind]) == set(OUTPUTS) == set(newest[kind])
    assert _differing(patched[kind], newest[kind]) == [], {
        k: (patched[kind][k] - newest[kind][k]).abs().max().item() for k in OUTPUTS
    }


@pytest.mark.stock
@only_release("<0.5.12", "0.5.12 reads fc_norm and norm_output itself")
def test_stock_serves_the_draft_without_its_norms(tiny, norm_drafts, patched):
    """Stock 0.5.9 (strict loading off: it would refuse the norms' weights) loads the draft and drops the norms:
    every output differs from the patched one."""
    stock = run_isolated(draft_layer_outputs, str(tiny["deepseek_v3"]), str(norm_drafts["eagle31"]), patches=None)
    assert _differing(stock, patched["eagle31"]) == list(OUTPUTS)


def test_norm_output_hands_on_the_normed_state(patched):
    """With norm_output the state handed on is the normed one; without it, sglang's pre-norm state."""
    import torch

    assert torch.equal(patched["eagle31"]["handed_on"], patched["eagle31"]["to_logits"])
    assert not torch.allclose(patched["legacy_names"]["handed_on"], patched["legacy_names"]["to_logits"])


if __name__ == "__main__":  # the newest release's side of the proof, run by newest_outputs in its environment
    from safetensors.torch import save_file

    save_file(run_isolated(draft_layer_outputs, sys.argv[1], sys.argv[2], patches=None), sys.argv[3])
