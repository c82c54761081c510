"""eagle3_draft_norms: an EAGLE-3.1-style draft gives the same draft-layer outputs on the pinned release with the
patch as on sglang 0.5.23, which reads its norms natively; stock 0.5.9 serves it without them.

The outputs: ``fc``'s output, the midlayer's (hidden, residual), the hidden state the draft hands to its next step,
and the logits, of real draft ``ModelRunner`` objects fed the same prefill and the same target states.  The same
function runs here and, as this file run as a script, in the 0.5.23 environment of ``tools/matrix.py``
(``.matrix/venv-0.5.23``), which records its outputs in ``tests/patches/data/eagle3_draft_norms-0.5.23.safetensors``:
the pinned release with the patch is compared with that record, and the newest release itself (CI's mode (c), the
matrix) with the same record, so neither side needs the other's environment.  When the newest checked release
changes, ``PYTHONPATH=tests python tests/patches/test_eagle3_draft_norms.py --record`` run in its environment writes
the new record.

The midlayer's attention contributes nothing: its ``o_proj`` is zero and, in both runs, its output is replaced by
zeros of the same shape (a forward hook).  sglang 0.5.23's extend attention, run on CPU under the triton
interpreter in this harness, reads uninitialised memory: its output differs from one run to the next and is at
times NaN, which a zero ``o_proj`` does not cancel.  Every other part of the layer is deterministic; with the
attention's output zero, the comparison is exact and still covers every norm (all of them sit outside the
attention).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.releases import only_release

from eagle3_patches.checkpoint.releases import NEWEST_CHECKED
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang
PATCHES = ["eagle3_draft_strict_loading", "eagle3_draft_norms"]
ROOT = Path(__file__).resolve().parents[2]
NEWEST = str(NEWEST_CHECKED)
#: the newest checked release's outputs (the module docstring says how they are recorded)
RECORD = ROOT / "tests" / "patches" / "data" / f"eagle3_draft_norms-{NEWEST}.safetensors"
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


@pytest.fixture(scope="module")
def norm_drafts(tiny_root) -> dict[str, Path]:
    return {kind: build_norm_draft(tiny_root / f"norm-draft-{kind}", kind) for kind in DRAFTS}


@pytest.fixture(scope="module")
def patched(tiny, norm_drafts) -> dict[str, dict]:
    return {
        kind: run_isolated(draft_layer_outputs, str(tiny["deepseek_v3"]), str(path), patches=PATCHES)
        for kind, path in norm_drafts.items()
    }


def recorded() -> dict[str, dict]:
    """The newest release's outputs, as :data:`RECORD` holds them: ``{kind: {output: tensor}}``."""
    from safetensors.torch import load_file

    if not RECORD.exists():
        script = Path(__file__).relative_to(ROOT)
        pytest.fail(f"{RECORD} is missing: run `PYTHONPATH=tests python {script} --record` with sglang {NEWEST}")
    flat = load_file(str(RECORD))
    return {kind: {k: flat[f"{kind}/{k}"] for k in OUTPUTS} for kind in DRAFTS}


def newest_outputs(target: Path, root: Path) -> dict[str, dict]:
    """:func:`draft_layer_outputs` of every kind of draft on the installed sglang, stock."""
    drafts = {kind: build_norm_draft(root / f"norm-draft-{kind}", kind) for kind in DRAFTS}
    return {kind: run_isolated(draft_layer_outputs, str(target), str(d), patches=None) for kind, d in drafts.items()}


def _differing(a: dict, b: dict) -> list[str]:
    import torch

    return [k for k in OUTPUTS if not torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-5)]


@pytest.mark.parametrize("kind", list(DRAFTS))
def test_patched_outputs_equal_the_newest_releases(patched, kind):
    """The proof: the same draft gives the same draft-layer outputs with the backport as on sglang 0.5.23 (its
    recorded outputs)."""
    newest = recorded()[kind]
    assert set(patched[kind]) == set(OUTPUTS) == set(newest)
    assert _differing(patched[kind], newest) == [], {
        k: (patched[kind][k] - newest[k]).abs().max().item() for k in OUTPUTS
    }


@pytest.mark.stock
@only_release(f"=={NEWEST}", "the record is of the newest checked release")
def test_the_newest_release_gives_the_recorded_outputs(tiny, tmp_path):
    """The other half of the proof, where the newest release is installed: its stock draft ModelRunner gives the
    outputs the pinned release's test compares with."""
    fresh, record = newest_outputs(tiny["deepseek_v3"], tmp_path), recorded()
    assert {kind: _differing(fresh[kind], record[kind]) for kind in DRAFTS} == {kind: [] for kind in DRAFTS}


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


@pytest.mark.stock
def test_a_draft_that_sets_none_of_the_fields_runs_exactly_as_on_stock(tiny):
    """The tiny draft (no norm field set, no norm weights) through the real draft ModelRunner: with the patch (and
    the strict loader) every output equals stock sglang's, bit for bit."""
    import torch

    target, draft = str(tiny["deepseek_v3"]), str(tiny["draft"])
    patched = run_isolated(draft_layer_outputs, target, draft, patches=PATCHES)
    stock = run_isolated(draft_layer_outputs, target, draft, patches=None)
    assert [k for k in OUTPUTS if not torch.equal(patched[k], stock[k])] == []


# --------------------------------------------------------------------------- the patch on a module of sglang's shape
# In-process, no sglang: a module shaped like 0.5.9's llama_eagle3.py (the names and code the patch's check() expects,
# a LlamaModel whose forward runs fc on states wider or narrower than the draft's hidden, as sglang's does) with
# check() and patch() run on it as the registry runs them.  The forward records what reaches fc.
FAKE_LLAMA_EAGLE3 = """
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size_in = config.target_hidden_size
        self.embed_tokens = nn.Embedding(16, config.hidden_size)
        self.fc = nn.Linear(3 * self.hidden_size_in, config.hidden_size, bias=False)
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc_inputs = []

    def forward(self, input_ids, positions, forward_batch, input_embeds=None):
        embeds = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        hidden_states = forward_batch.spec_info.hidden_states
        if hidden_states.shape[-1] != embeds.shape[-1]:
            self.fc_inputs.append(hidden_states)
            hidden_states = self.fc(hidden_states)
        return self.norm(hidden_states + embeds), [hidden_states + embeds]


class LlamaForCausalLMEagle3(nn.Module):
    def load_weights(self, weights):
        self.loaded = [name for name, _ in weights]
"""
FAKE_HIDDEN = 8
FAKE_TOKENS = 5


def _fake_module(tmp_path, name: str, source: str = FAKE_LLAMA_EAGLE3):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_patched(tmp_path):
    """The fake module with the patch landed (check() passes, patch() wraps), restored afterwards."""
    from eagle3_patches.patches.eagle3_draft_norms import PATCH
    from eagle3_patches.registry import Saver

    module = _fake_module(tmp_path, "fake_llama_eagle3")
    assert PATCH.upstream(module) is None
    PATCH.check(module)
    saver = Saver()
    PATCH.patch(module, saver)
    yield module
    saver.restore()


def _rms(x, weight):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _fake_draft(module, fields: dict, target_hidden: int = FAKE_HIDDEN):
    """The fake draft LlamaModel built from a config setting ``fields`` (nothing else of the norms), its norm
    weights set far from 1 so a skipped or misplaced norm shows."""
    import types

    import torch

    config = types.SimpleNamespace(
        hidden_size=FAKE_HIDDEN, target_hidden_size=target_hidden, rms_norm_eps=1e-6, **fields
    )
    model = module.LlamaModel(config)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + torch.rand(p.shape, generator=gen))
    return model


#: how the draft's LlamaModel is called: sglang's LlamaForCausalLM passes input_embeds too; a module call may leave
#: it out, or name forward_batch
CALLS = ("input_embeds passed", "input_embeds left out", "forward_batch by keyword")


def _fake_forward(model, width: int, call: str = CALLS[0]):
    """The draft's forward on FAKE_TOKENS states ``width`` wide, called as ``call`` says: (the states it was handed,
    what fc received, (to_logits, handed on), the batch's states afterwards)."""
    import types

    import torch

    states = 3.0 * torch.randn(FAKE_TOKENS, width, generator=torch.Generator().manual_seed(1))
    fb = types.SimpleNamespace(spec_info=types.SimpleNamespace(hidden_states=states))
    ids, pos = torch.arange(FAKE_TOKENS), torch.arange(FAKE_TOKENS)
    model.fc_inputs.clear()
    with torch.no_grad():
        if call == "forward_batch by keyword":
            out = model(ids, pos, forward_batch=fb)
        else:
            out = model(ids, pos, fb, None) if call == "input_embeds passed" else model(ids, pos, fb)
    return states, list(model.fc_inputs), (out[0], out[1][0]), fb.spec_info.hidden_states


def _expected_fc_input(model, states, fields: dict):
    """sglang 0.5.23's order: input_norm over the concatenated states, then fc_norm on each aux state."""
    import torch

    x = states
    if fields.get("norm_before_fc") or fields.get("eagle_config", {}).get("norm_before_fc"):
        x = _rms(x, model.input_norm.weight)
    if fields.get("fc_norm") or fields.get("use_aux_norm"):
        x = torch.cat([_rms(c, n.weight) for c, n in zip(x.chunk(3, dim=-1), model.fc_norm)], dim=-1)
    return x


#: draft config fields -> the parameters the patch adds for them (the checkpoint names the same draft must carry)
FAKE_DRAFTS = {
    "none": ({}, []),
    "norm_before_fc": ({"norm_before_fc": True}, ["input_norm.weight"]),
    "eagle_config.norm_before_fc": ({"eagle_config": {"norm_before_fc": True}}, ["input_norm.weight"]),
    "fc_norm": ({"fc_norm": True}, ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]),
    "use_aux_norm": ({"use_aux_norm": True}, ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]),
    "norm_output": ({"norm_output": True}, []),
    "all set false": ({"norm_before_fc": False, "fc_norm": False, "use_aux_norm": False, "norm_output": False}, []),
}
STOCK_PARAMETERS = ["embed_tokens.weight", "fc.weight", "norm.weight"]


@pytest.mark.parametrize("target_hidden", [FAKE_HIDDEN, 2], ids=["3x-hidden", "narrower-than-hidden"])
@pytest.mark.parametrize("draft", list(FAKE_DRAFTS))
def test_each_field_adds_its_norm_in_0_5_23s_order_and_no_other(fake_patched, draft, target_hidden):
    """Per field the draft's config sets: the parameters added (none for a draft that sets none, which then loads
    and runs as on stock), what reaches fc (wider target states, or narrower ones: sglang runs fc on any width but
    the draft's hidden), the state handed on (the normed one with norm_output), the batch's states left as they
    came; however the forward is called (:data:`CALLS`)."""
    import torch

    fields, added = FAKE_DRAFTS[draft]
    model = _fake_draft(fake_patched, fields, target_hidden)
    assert sorted(n for n, _ in model.named_parameters()) == sorted(STOCK_PARAMETERS + added)
    for call in CALLS:
        states, fc_inputs, (to_logits, handed_on), after = _fake_forward(model, 3 * target_hidden, call)
        assert len(fc_inputs) == 1 and torch.equal(fc_inputs[0], _expected_fc_input(model, states, fields))
        assert after is states
        assert torch.equal(handed_on, to_logits) == bool(fields.get("norm_output")), draft


@pytest.mark.parametrize("draft", list(FAKE_DRAFTS))
def test_the_drafts_own_hidden_state_is_left_alone(fake_patched, draft):
    """A draft step fed the draft's own hidden state (as wide as its hidden: fc does not run) gets no norm."""
    model = _fake_draft(fake_patched, FAKE_DRAFTS[draft][0])
    for call in CALLS:
        states, fc_inputs, _, after = _fake_forward(model, FAKE_HIDDEN, call)
        assert fc_inputs == [] and after is states


def test_the_older_fc_norm_weight_names_load_as_fc_norm(fake_patched):
    model = fake_patched.LlamaForCausalLMEagle3()
    names = ["model.aux_norm_low.weight", "model.aux_norm_mid.weight", "model.aux_norm_high.weight", "fc.weight"]
    model.load_weights([(n, None) for n in names])
    expected = ["model.fc_norm.0.weight", "model.fc_norm.1.weight", "model.fc_norm.2.weight", "fc.weight"]
    assert model.loaded == expected
    model.load_weights(weights=[(n, None) for n in names])
    assert model.loaded == expected


def _init_without_eps(source: str) -> str:
    return source.replace("RMSNorm(config.hidden_size, eps=config.rms_norm_eps)", "RMSNorm(config.hidden_size)")


#: a release whose llama_eagle3.py the patch was not written for -> (the edit, the end of check()'s refusal)
FOREIGN_RELEASES = {
    "LlamaModel.__init__ inherited": ("del module.LlamaModel.__init__", "LlamaModel.__init__ does not exist"),
    "LlamaModel.__init__ without rms_norm_eps": (_init_without_eps, "no longer contains 'rms_norm_eps'"),
    "fc applied elsewhere": (
        lambda src: src.replace("self.fc(hidden_states)", "self.fc.forward(hidden_states)"),
        "LlamaModel.forward no longer contains 'self.fc(hidden_states)'",
    ),
    "no RMSNorm": ("del module.RMSNorm", "RMSNorm does not exist"),
    "load_weights inherited": (
        "del module.LlamaForCausalLMEagle3.load_weights",
        "LlamaForCausalLMEagle3.load_weights does not exist",
    ),
}


@pytest.mark.parametrize("case", list(FOREIGN_RELEASES))
def test_check_refuses_a_llama_eagle3_it_was_not_written_for(tmp_path, case):
    """Each thing the patch relies on, gone or changed: check() refuses (the registry's not-applicable, sglang left
    untouched) naming what is missing, instead of wrapping code it was not written for."""
    from eagle3_patches.patches.eagle3_draft_norms import PATCH
    from eagle3_patches.registry import NotApplicable

    edit, refusal = FOREIGN_RELEASES[case]
    name = "foreign_" + "".join(c if c.isalnum() else "_" for c in case)
    if callable(edit):
        module = _fake_module(tmp_path, name, edit(FAKE_LLAMA_EAGLE3))
    else:
        module = _fake_module(tmp_path, name)
        exec(edit, {"module": module})
    with pytest.raises(NotApplicable) as refused:
        PATCH.check(module)
    assert str(refused.value).endswith(refusal), str(refused.value)


def test_the_upstream_probe_says_nothing_of_a_module_without_source():
    """A module whose source cannot be read (no file): the probe does not claim a fix upstream, check() refuses."""
    import types

    from eagle3_patches.patches.eagle3_draft_norms import PATCH
    from eagle3_patches.registry import NotApplicable

    module = types.ModuleType("llama_eagle3_without_source")
    assert PATCH.upstream(module) is None
    with pytest.raises(NotApplicable, match="LlamaModel does not exist"):
        PATCH.check(module)


if __name__ == "__main__":  # PYTHONPATH=tests python tests/patches/test_eagle3_draft_norms.py --record, sglang NEWEST
    import tempfile

    from safetensors.torch import save_file
    from support.releases import sglang_version

    if sys.argv[1:] != ["--record"] or str(sglang_version()) != NEWEST:
        sys.exit(f"usage: python {sys.argv[0]} --record  (in the environment of sglang {NEWEST})")
    with tempfile.TemporaryDirectory() as tmp:
        target = tm.build_all(Path(tmp))["deepseek_v3"]
        outputs = newest_outputs(target, Path(tmp))
    RECORD.parent.mkdir(exist_ok=True)
    save_file({f"{kind}/{k}": t.contiguous() for kind, out in outputs.items() for k, t in out.items()}, str(RECORD))
    print(f"wrote {RECORD}")
