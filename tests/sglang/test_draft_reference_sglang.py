"""The offline measurement's draft forward (:mod:`eagle3_patches.acceptance.draft_reference`) is sglang's: the same
logits as sglang 0.5.9's real ``EAGLEWorker`` running the same draft, step 1 and the draft decode steps 2 and 3.

sglang's side: the real target ``TpModelWorker`` and ``EAGLEWorker`` on a tiny DeepSeek-V3 target (hidden 32,
vocabulary 64) prefill :data:`PROMPTS` (the draft extend: step 1 at the last position of each prompt), then run
the worker's own ``draft()`` (the draft decode: steps 2 and 3), teacher-forced: ``select_top_k_tokens`` hands the
chain the tokens of :data:`CHAIN` instead of the draft's own guesses.  The logits of every draft forward, the
positions it ran at and the target states it was given are recorded.  Our side: ``measure.load_draft`` (the
target's embedding, the d2t map) and ``DraftForward.forward_seq`` over ``prompt + [the target's token] + chain``
with those target states.

The drafts (:data:`DRAFTS`) vary what the forward implements: grouped-query attention, a head_dim other than
hidden / heads, rope_theta, rms_norm_eps (0.1: the eps shows), linear RoPE scaling, max_position_embeddings, a draft
vocabulary smaller than the target's (d2t), and a config without the optional fields (sglang's defaults against
``draft_shape``'s).

What sglang computed is kept, small, in :data:`GOLDEN` (the drafts' weights, the target's embedding, the states, the
logits); ``tests/unit/test_draft_reference.py`` holds the forward against it in a second without sglang.  Here the
golden file is checked against what sglang computes now, so it cannot go stale.  Regenerate it with::

    PYTHONPATH=tests .venv/bin/python tests/sglang/test_draft_reference_sglang.py --regenerate
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.releases import only_release

from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

pytestmark = [
    pytest.mark.sglang,
    only_release(
        "==0.5.9",
        "the forward is sglang 0.5.9's; 0.5.23's EAGLEWorkerV2 runs draft decode step k at position t+k-1, "
        "0.5.9's EAGLEWorker at t+k",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "draft_reference_sglang.safetensors"
TARGET = tm.TinyTargetSpec(hidden=32, vocab=64, num_layers=5)  # aux ids 1, 2, 3 capture before layers 2, 3, 4
AUX = len(tm.DRAFT_AUX_IDS)
#: the prompts: step 1 at base t = len(prompt) - 1 (0, 1, 4, 7)
PROMPTS = [[5], [41, 7], [8, 59, 10, 33, 12], [13, 14, 50, 16, 27, 18, 61, 20]]
#: the tokens fed to draft decode steps 2 and 3 of each prompt (x_{t+2}, x_{t+3})
CHAIN = [[30, 31], [52, 33], [34, 9], [36, 44]]
STEPS = 3
#: float32 on both sides: what is left is the order of float operations
RTOL, ATOL = 1e-4, 1e-5

#: config fields of each draft (beside the common ones of :func:`draft_config`)
DRAFTS: dict[str, dict] = {
    "gqa_d2t": {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,  # not hidden / heads
        "intermediate_size": 48,
        "draft_vocab_size": 24,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100.0,
        "rope_scaling": None,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
    },
    "linear_rope": {
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "intermediate_size": 40,
        "draft_vocab_size": TARGET.vocab,  # no d2t
        "rms_norm_eps": 0.1,
        "rope_theta": 50.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "max_position_embeddings": 32,  # x 2: the server's context length (64)
    },
    "defaults": {  # no num_key_value_heads, head_dim, rms_norm_eps, rope_theta, rope_scaling, hidden_act
        "num_attention_heads": 4,
        "intermediate_size": 48,
        "draft_vocab_size": 32,
        "max_position_embeddings": 2048,
    },
}


def draft_config(name: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": TARGET.hidden,
        "target_hidden_size": TARGET.hidden,
        "vocab_size": TARGET.vocab,
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(tm.DRAFT_AUX_IDS), "use_aux_hidden_state": True},
        **DRAFTS[name],
    }


def draft_tensors(config: dict, seed: int) -> dict:
    """Random weights, bf16-exact (the golden file keeps them as bf16); norms far from 1, d2t a sorted random
    subset of the target's vocabulary where the draft's is smaller."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, nh = config["hidden_size"], config["num_attention_heads"]
    nkv, hd = config.get("num_key_value_heads", nh), config.get("head_dim", h // nh)
    inter, vocab, dvocab = config["intermediate_size"], config["vocab_size"], config["draft_vocab_size"]
    width = AUX * config["target_hidden_size"]

    def rand(*shape, std):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    t = {
        "fc.weight": rand(h, width, std=width**-0.5),
        "midlayer.self_attn.q_proj.weight": rand(nh * hd, 2 * h, std=0.2),
        "midlayer.self_attn.k_proj.weight": rand(nkv * hd, 2 * h, std=0.2),
        "midlayer.self_attn.v_proj.weight": rand(nkv * hd, 2 * h, std=0.2),
        "midlayer.self_attn.o_proj.weight": rand(h, nh * hd, std=0.2),
        "midlayer.mlp.gate_proj.weight": rand(inter, h, std=0.2),
        "midlayer.mlp.up_proj.weight": rand(inter, h, std=0.2),
        "midlayer.mlp.down_proj.weight": rand(h, inter, std=0.2),
        "midlayer.input_layernorm.weight": 1 + rand(h, std=0.3),
        "midlayer.post_attention_layernorm.weight": 1 + rand(h, std=0.3),
        "midlayer.hidden_norm.weight": 1 + rand(h, std=0.3),
        "norm.weight": 1 + rand(h, std=0.3),
        "lm_head.weight": rand(dvocab, h, std=0.5),
    }
    if dvocab < vocab:
        hot = torch.sort(torch.randperm(vocab, generator=g)[:dvocab]).values
        t["d2t"] = hot - torch.arange(dvocab)
    return t


def write_draft(path: Path, config: dict, tensors: dict) -> Path:
    """The draft directory sglang and ``measure.load_draft`` read (weights as float32, the config's dtype)."""
    import torch

    full = {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in tensors.items()}
    return tm.write_checkpoint(path, config, full, config["vocab_size"])


# ---------------------------------------------------------------------------------------------- sglang's side
def sglang_draft_chain(target: str, draft: str) -> dict:
    """In an isolated process: the real EAGLE worker prefills :data:`PROMPTS` and drafts, teacher-forced by
    :data:`CHAIN`.  Per draft forward: its mode, positions, the hidden states it was handed and its logits."""
    import sglang
    import sglang.srt.models.llama_eagle3 as llama_eagle3
    import sglang.srt.speculative.eagle_worker as eagle_worker
    import torch

    from eagle3_patches.testing import sglang_harness as h

    forwards: list[dict] = []
    forward = llama_eagle3.LlamaForCausalLMEagle3.forward

    def recorded(self, input_ids, positions, forward_batch, *args, **kwargs):
        given = forward_batch.spec_info.hidden_states.detach().clone()
        out = forward(self, input_ids, positions, forward_batch, *args, **kwargs)
        forwards.append(
            {
                "mode": forward_batch.forward_mode.name,
                "input_ids": input_ids.tolist(),
                "positions": positions.tolist(),
                "hidden_states": given.float(),
                "logits": out.next_token_logits.detach().float().clone(),
            }
        )
        return out

    select = eagle_worker.select_top_k_tokens

    def teacher_forced(i, *args, **kwargs):
        input_ids, *rest = select(i, *args, **kwargs)
        if i < len(CHAIN[0]):
            input_ids = torch.tensor([chain[i] for chain in CHAIN], dtype=input_ids.dtype)
        return (input_ids, *rest)

    llama_eagle3.LlamaForCausalLMEagle3.forward = recorded
    eagle_worker.select_top_k_tokens = teacher_forced
    sa = h.eagle3_server_args(target, draft, context_length=64, speculative_num_steps=STEPS)
    target_worker, eagle = h.eagle_workers(sa)
    batch = h.eagle_prefill_batch(target_worker, PROMPTS)
    h.eagle_step(eagle, batch)  # the target's prefill and the draft extend (step 1)
    produced = [req.output_ids[-1] for req in batch.reqs]
    batch.prepare_for_decode()
    with torch.no_grad():
        eagle.draft(batch)  # the draft decode (steps 2, 3); no verify
    hot = eagle.hot_token_id
    return {
        "sglang": sglang.__version__,
        "forwards": forwards,
        "produced": produced,
        "hot": None if hot is None else hot.detach().cpu().clone(),
    }


def tokens_of(i: int, produced: list[int]) -> list[int]:
    """The teacher-forced sequence of prompt i: the prompt, the target's token, the chain."""
    return PROMPTS[i] + [produced[i]] + CHAIN[i]


def golden_part(name: str, run: dict) -> dict:
    """The golden tensors of one draft from sglang's run: per prompt i, ``{name}.logits.{i}`` [steps, draft vocab]
    (step k at base t = len(prompt) - 1), ``{name}.positions`` [steps, prompts] and sglang's ``{name}.hot``."""
    import torch

    forwards = run["forwards"]
    assert [f["mode"] for f in forwards] == ["EXTEND"] + ["DECODE"] * (STEPS - 1), [f["mode"] for f in forwards]
    out = {
        f"{name}.positions": torch.tensor(
            [[f["positions"][sum(map(len, PROMPTS[: i + 1])) - 1] for i in range(len(PROMPTS))] for f in forwards[:1]]
            + [f["positions"] for f in forwards[1:]]
        ),
    }
    for i in range(len(PROMPTS)):
        out[f"{name}.logits.{i}"] = torch.stack([f["logits"][i] for f in forwards])
    if run["hot"] is not None:
        out[f"{name}.hot"] = run["hot"].to(torch.int64)
    return out


def shared_part(run: dict) -> dict:
    """What every draft's run shares: the target's states (``aux.{i}``) and the token sequences (``tokens.{i}``)."""
    import torch

    extend = run["forwards"][0]
    states = torch.split(extend["hidden_states"], [len(p) for p in PROMPTS])
    out = {}
    for i, prompt in enumerate(PROMPTS):
        out[f"aux.{i}"] = states[i].contiguous()
        out[f"tokens.{i}"] = torch.tensor(tokens_of(i, run["produced"]))
        start = sum(map(len, PROMPTS[:i]))
        assert extend["input_ids"][start : start + len(prompt)] == tokens_of(i, run["produced"])[1 : len(prompt) + 1]
    return out


def target_embedding(target: Path):
    from safetensors.torch import load_file

    return load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].float()


def regenerate(root: Path) -> None:
    """Runs sglang on every draft and writes :data:`GOLDEN`."""
    from safetensors.torch import save_file

    target = tm.build_deepseek_v3(root / "target", TARGET)
    tensors: dict = {"target.embed": target_embedding(target)}
    configs = {}
    for seed, name in enumerate(DRAFTS, start=1):
        configs[name] = draft_config(name)
        weights = draft_tensors(configs[name], seed)
        run = run_isolated(sglang_draft_chain, str(target), str(write_draft(root / name, configs[name], weights)))
        shared = shared_part(run)
        for key, value in shared.items():
            assert key not in tensors or bool((tensors[key] == value).all()), f"{key} differs between the runs"
        tensors.update(shared)
        tensors.update({f"{name}.{k}": v.contiguous() for k, v in weights.items()})
        tensors.update(golden_part(name, run))
        sglang_version = run["sglang"]
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(GOLDEN), metadata={"configs": json.dumps(configs, sort_keys=True), "sglang": sglang_version})


def read_golden() -> tuple[dict, dict]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(GOLDEN), "pt") as f:
        meta = f.metadata()
    return load_file(str(GOLDEN)), json.loads(meta["configs"])


# ---------------------------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def golden():
    return read_golden()


@pytest.fixture(scope="module")
def checkpoints(golden, tmp_path_factory) -> dict:
    """The target (tiny_models, deterministic) and each draft written from the golden file's weights."""
    tensors, configs = golden
    root = tmp_path_factory.mktemp("draft-reference")
    target = tm.build_deepseek_v3(root / "target", TARGET)
    drafts = {}
    for name, config in configs.items():
        prefix = f"{name}."
        weights = {
            k[len(prefix) :]: v
            for k, v in tensors.items()
            if k.startswith(prefix) and not k.startswith((f"{name}.logits.", f"{name}.positions", f"{name}.hot"))
        }
        drafts[name] = write_draft(root / name, config, weights)
    return {"target": target, "drafts": drafts}


@pytest.fixture(scope="module")
def sglang_runs(checkpoints) -> dict:
    runs: dict = {}

    def run(name: str) -> dict:
        if name not in runs:
            runs[name] = run_isolated(sglang_draft_chain, str(checkpoints["target"]), str(checkpoints["drafts"][name]))
        return runs[name]

    return run


def test_the_golden_file_holds_the_drafts_of_this_test(golden):
    _, configs = golden
    assert configs == {name: draft_config(name) for name in DRAFTS}, "regenerate the golden file (module docstring)"


@pytest.mark.parametrize("name", list(DRAFTS))
def test_the_draft_forward_gives_sglangs_logits_at_every_step(name, checkpoints, sglang_runs):
    """The decisive comparison: sglang's real draft extend and draft decode against ``DraftForward`` as
    ``measure-accept`` loads it; the draft-to-target map is sglang's; the predicted target tokens agree."""
    import torch

    from eagle3_patches.acceptance.measure import load_draft

    run = sglang_runs(name)
    sg = golden_part(name, run)
    shared = shared_part(run)
    forward, hot, _ = load_draft(checkpoints["drafts"][name], checkpoints["target"])
    if f"{name}.hot" in sg:
        assert torch.equal(hot, sg[f"{name}.hot"])
    else:
        assert torch.equal(hot, torch.arange(TARGET.vocab))
    for i, prompt in enumerate(PROMPTS):
        t = len(prompt) - 1
        tokens = shared[f"tokens.{i}"]
        aux = torch.cat([shared[f"aux.{i}"], torch.zeros(len(tokens) - len(prompt), AUX * TARGET.hidden)])
        with torch.no_grad():
            ours = torch.stack([logits[t] for logits in forward.forward_seq(tokens, aux, STEPS)])
        theirs = sg[f"{name}.logits.{i}"]
        torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL, msg=lambda m, i=i: f"{name}, prompt {i}: {m}")
        assert hot[ours.argmax(-1)].tolist() == hot[theirs.argmax(-1)].tolist()


@pytest.mark.parametrize("name", list(DRAFTS))
def test_sglang_runs_draft_step_k_at_position_t_plus_k(name, sglang_runs):
    """Where the forward's positions come from: step 1 at t, the draft decode's step k at t + k."""
    import torch

    positions = golden_part(name, sglang_runs(name))[f"{name}.positions"]
    base = torch.tensor([len(p) - 1 for p in PROMPTS])
    assert positions.tolist() == [base.tolist()] + [(base + k).tolist() for k in range(2, STEPS + 1)]


@pytest.mark.parametrize("name", list(DRAFTS))
def test_the_golden_file_is_what_sglang_computes(name, golden, checkpoints, sglang_runs):
    """tests/unit/test_draft_reference.py's reference is sglang's output today (else: regenerate it)."""
    import torch

    tensors, _ = golden
    run = sglang_runs(name)
    assert torch.equal(tensors["target.embed"], target_embedding(checkpoints["target"]))
    for key, value in {**shared_part(run), **golden_part(name, run)}.items():
        if value.is_floating_point():
            torch.testing.assert_close(tensors[key], value, rtol=RTOL, atol=ATOL, msg=lambda m, key=key: f"{key}: {m}")
        else:
            assert torch.equal(tensors[key], value), key
    assert {k for k in tensors if k.startswith(f"{name}.hot")} == {k for k in golden_part(name, run) if "hot" in k}


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        regenerate(Path(tmp))
    print(f"wrote {GOLDEN.relative_to(ROOT)}")
