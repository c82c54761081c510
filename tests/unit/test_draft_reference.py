"""The offline measurement's draft forward (:mod:`eagle3_patches.acceptance.draft_reference`) without sglang: its
logits against what sglang 0.5.9's real EAGLE worker computed for the same drafts (``tests/data``, recorded and kept
current by ``tests/sglang/test_draft_reference_sglang.py``), the pieces checked by hand (RMSNorm, RoPE), what
``draft_shape`` makes of a config, and the training-only dropout."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3_patches.acceptance.draft_reference import DraftForward, DraftShape, draft_shape, rms, rope
from eagle3_patches.acceptance.measure import load_draft

#: written by tests/sglang/test_draft_reference_sglang.py --regenerate.  Per draft: ``{name}.{tensor}`` (bf16
#: weights), ``{name}.logits.{i}`` [steps, draft vocab] (sglang's logits at base t = len(prompt i) - 1, steps 1..3),
#: ``{name}.hot`` (sglang's hot_token_id), ``{name}.positions`` (where sglang ran each step).  Shared:
#: ``target.embed``, ``tokens.{i}`` (prompt, the target's token, the two chain tokens), ``aux.{i}`` (the target
#: states of the prompt).  The configs are in the metadata.
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "draft_reference_sglang.safetensors"
STEPS = 3
RTOL, ATOL = 1e-4, 1e-5
NAMES = ("gqa_d2t", "linear_rope", "defaults")


@pytest.fixture(scope="module")
def golden() -> tuple[dict, dict]:
    with safe_open(str(GOLDEN), "pt") as f:
        configs = json.loads(f.metadata()["configs"])
    return load_file(str(GOLDEN)), configs


def _weights(tensors: dict, name: str) -> dict:
    out = {}
    for key, value in tensors.items():
        if key.startswith(f"{name}.") and not key.startswith((f"{name}.logits.", f"{name}.hot", f"{name}.positions")):
            out[key[len(name) + 1 :]] = value.float() if value.dtype == torch.bfloat16 else value
    return out


def _forward(golden, name: str) -> DraftForward:
    tensors, configs = golden
    shape, why = draft_shape(configs[name])
    assert why == ""
    params = {k: v for k, v in _weights(tensors, name).items() if k != "d2t"}
    return DraftForward(params, tensors["target.embed"], shape)


def _checkpoint(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _prompts(tensors: dict) -> list[int]:
    return sorted(int(k.split(".")[1]) for k in tensors if k.startswith("aux."))


# ---------------------------------------------------------------------- the forward against sglang's
def test_the_golden_file_holds_every_draft(golden):
    assert set(golden[1]) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_forward_gives_sglangs_logits_at_every_step(golden, name, tmp_path):
    """Steps 1, 2 and 3 at each prompt's last position, as ``measure-accept`` loads the draft (the target's
    embedding, the d2t map); the target token each step predicts is sglang's."""
    tensors, configs = golden
    _checkpoint(tmp_path / "target", {}, {"model.embed_tokens.weight": tensors["target.embed"]})
    draft = _checkpoint(tmp_path / name, configs[name], _weights(tensors, name))
    forward, hot, _ = load_draft(draft, tmp_path / "target")
    expected_hot = tensors.get(f"{name}.hot", torch.arange(configs[name]["draft_vocab_size"]))
    assert torch.equal(hot, expected_hot)
    for i in _prompts(tensors):
        tokens, aux = tensors[f"tokens.{i}"], tensors[f"aux.{i}"]
        t = aux.shape[0] - 1
        aux = torch.cat([aux, torch.zeros(len(tokens) - aux.shape[0], aux.shape[1])])  # no state past the prompt
        with torch.no_grad():
            ours = torch.stack([logits[t] for logits in forward.forward_seq(tokens, aux, STEPS)])
        theirs = tensors[f"{name}.logits.{i}"]
        torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL, msg=lambda m, i=i: f"{name}, prompt {i}: {m}")
        assert hot[ours.argmax(-1)].tolist() == hot[theirs.argmax(-1)].tolist()


@pytest.mark.parametrize(("length", "steps", "rows"), [(6, 3, [5, 4, 3]), (4, 5, [3, 2, 1]), (2, 3, [1]), (3, 1, [2])])
def test_each_step_gives_logits_for_the_bases_whose_token_exists(golden, length, steps, rows):
    """Step 1 for every base t in 0..L-2; step k > 1 for the L - k bases whose x_{t+k} exists; no step without one."""
    forward = _forward(golden, "gqa_d2t")
    tokens = torch.arange(4, 4 + length)
    aux = torch.randn(length, forward.params["fc.weight"].shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = forward.forward_seq(tokens, aux, steps)
    assert [tuple(x.shape) for x in out] == [(n, 24) for n in rows]


# ---------------------------------------------------------------------- the pieces, by hand
def _rms_by_hand(row: list[float], w: list[float], eps: float) -> list[float]:
    scale = 1 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
    return [v * scale * wi for v, wi in zip(row, w)]


@pytest.mark.parametrize("eps", [None, 1e-6, 0.5])
def test_rms_norm_normalises_each_row_over_its_last_dimension(eps):
    """x / sqrt(mean(x^2) + eps) * w per row; the default eps is 1e-6 (a row of RMS 1e-3 shows it)."""
    x = torch.tensor([[3.0, 4.0], [1e-3, -1e-3]])
    w = torch.tensor([1.0, 2.0])
    got = rms(x, w) if eps is None else rms(x, w, eps)
    expected = torch.tensor([_rms_by_hand(row, w.tolist(), 1e-6 if eps is None else eps) for row in x.tolist()])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def _rope_by_hand(x: list[float], pos: float, theta: float, factor: float) -> list[float]:
    """neox: dims i and i + d/2 rotate together by (pos / factor) * theta^(-2i/d)."""
    d = len(x)
    out = [0.0] * d
    for i in range(d // 2):
        angle = pos / factor * theta ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[i] = x[i] * c - x[i + d // 2] * s
        out[i + d // 2] = x[i + d // 2] * c + x[i] * s
    return out


@pytest.mark.parametrize(
    ("kwargs", "positions", "theta", "factor"),
    [
        ({}, [0, 3, 100000], 10000.0, 1.0),  # the defaults; at 100000 theta 9999 would turn dims 1/3 by 0.05
        ({"theta": 50.0}, [0, 3, 7], 50.0, 1.0),
        ({"theta": 50.0, "factor": 2.0}, [0, 3, 7], 50.0, 2.0),  # linear scaling: position / factor
        ({"factor": 4.0}, [0, 5, 9], 10000.0, 4.0),
    ],
)
def test_rope_rotates_pairs_by_the_position_over_the_factor(kwargs, positions, theta, factor):
    x = torch.tensor([[[0.3, -1.2, 0.7, 2.0], [1.0, 0.5, -0.25, 0.0]]]).repeat(len(positions), 1, 1)  # [T, 2 heads, 4]
    got = rope(x, torch.tensor(positions), **kwargs)
    expected = torch.tensor(
        [[_rope_by_hand(head, p, theta, factor) for head in x[0].tolist()] for p in positions], dtype=torch.float32
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-3 if max(positions) > 1000 else 1e-5)


# ---------------------------------------------------------------------- draft_shape
MINIMAL = {"hidden_size": 64, "num_attention_heads": 4}


def test_a_config_without_the_optional_fields_gets_the_dataclass_defaults():
    """What train_tiny_draft builds directly (``DraftShape(h, nh, nh, h // nh)``) is what a config without the
    fields gets: llama's defaults (one layer, silu, kv heads = heads, head_dim = hidden / heads, eps 1e-6,
    theta 10000, no RoPE scaling)."""
    shape, why = draft_shape(MINIMAL)
    assert why == ""
    assert shape == DraftShape(64, 4, 4, 16) == DraftShape(64, 4, 4, 16, 1e-6, 10000.0, 1.0)
    assert (shape.eps, shape.rope_theta, shape.rope_linear_factor) == (1e-6, 10000.0, 1.0)


def test_every_field_is_read():
    config = dict(MINIMAL, num_key_value_heads=1, head_dim=32, rms_norm_eps=0.25, rope_theta=0.5)
    config.update(num_hidden_layers=1, hidden_act="silu", bias=False, rope_scaling={"type": "linear", "factor": 0.5})
    assert draft_shape(config) == (DraftShape(64, 4, 1, 32, 0.25, 0.5, 0.5), "")


def test_the_shape_cannot_change_under_a_forward():
    shape = DraftShape(64, 4, 4, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.eps = 0.1  # type: ignore[misc]
    assert len({shape, DraftShape(64, 4, 4, 16)}) == 1


WHOLE = "hidden_size and num_attention_heads must be positive whole numbers"
DIVIDE = "num_key_value_heads must divide num_attention_heads, head_dim must be positive"
RANGE = "rms_norm_eps must be in (0, 1) and rope_theta positive"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"hidden_size": None}, WHOLE),
        ({"num_attention_heads": None}, WHOLE),
        ({"hidden_size": 0}, WHOLE),
        ({"num_attention_heads": 0}, WHOLE),
        ({"hidden_size": -64}, WHOLE),
        ({"hidden_size": True}, WHOLE),
        ({"hidden_size": 64.0}, WHOLE),
        ({"num_attention_heads": "4"}, WHOLE),
        ({"num_key_value_heads": 0}, DIVIDE),
        ({"num_key_value_heads": 3}, DIVIDE),
        ({"num_key_value_heads": None}, DIVIDE),
        ({"head_dim": 0}, DIVIDE),
        ({"head_dim": None}, DIVIDE),
        ({"head_dim": 16.0}, DIVIDE),
        ({"hidden_size": 3, "num_attention_heads": 4}, DIVIDE),  # head_dim 3 // 4 = 0
        ({"head_dim": 1}, "head_dim 1 is odd (RoPE rotates pairs)"),
        ({"head_dim": 3}, "head_dim 3 is odd (RoPE rotates pairs)"),
        ({"num_hidden_layers": 0}, "num_hidden_layers 0: only one draft layer is implemented"),
        ({"num_hidden_layers": 2}, "num_hidden_layers 2: only one draft layer is implemented"),
        ({"hidden_act": "swish"}, "hidden_act 'swish': only silu is implemented"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu': only silu is implemented"),
        ({"bias": True}, "bias: true (an fc with a bias) is not implemented"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling type 'yarn': only none and linear are implemented",
        ),
        (
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "rope_scaling type 'dynamic': only none and linear are implemented",
        ),
        (
            {"rope_scaling": {"type": "linear", "factor": 0}},
            "rope_scaling type 'linear': only none and linear are implemented",
        ),
        (
            {"rope_scaling": {"type": "linear", "factor": -1.0}},
            "rope_scaling type 'linear': only none and linear are implemented",
        ),
        ({"rope_scaling": {"type": "linear"}}, "rope_scaling type 'linear': only none and linear are implemented"),
        ({"rms_norm_eps": 0}, RANGE),
        ({"rms_norm_eps": 1}, RANGE),
        ({"rms_norm_eps": 1.5}, RANGE),
        ({"rms_norm_eps": -0.5}, RANGE),
        ({"rms_norm_eps": None}, RANGE),
        ({"rms_norm_eps": "1e-6"}, RANGE),
        ({"rope_theta": 0}, RANGE),
        ({"rope_theta": -0.5}, RANGE),
        ({"rope_theta": None}, RANGE),
        ({"rope_theta": "10000"}, RANGE),
    ],
)
def test_a_config_the_forward_cannot_run_is_refused_with_the_reason(change, reason):
    assert draft_shape(dict(MINIMAL, **change)) == (None, reason)


@pytest.mark.parametrize("field", ["norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "norm_before_residual"])
@pytest.mark.parametrize("where", ["top", "eagle_config"])
def test_each_eagle31_norm_field_is_refused_naming_it(field, where):
    config = dict(MINIMAL, **({field: True} if where == "top" else {"eagle_config": {field: True}}))
    assert draft_shape(config) == (None, f"{field}: the EAGLE-3.1 norms are not implemented by this measurement")
    assert draft_shape(dict(MINIMAL, **{field: False}))[1] == ""


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"num_key_value_heads": 1}, {"num_kv_heads": 1}),  # multi-query
        ({"num_key_value_heads": 2, "head_dim": 8}, {"num_kv_heads": 2, "head_dim": 8}),
        (
            {"hidden_size": 1, "num_attention_heads": 1, "head_dim": 2},
            {"hidden": 1, "num_heads": 1, "num_kv_heads": 1, "head_dim": 2},
        ),
        ({"num_hidden_layers": 1, "hidden_act": "silu"}, {}),
        ({"rope_scaling": None}, {}),
        ({"rope_scaling": {"rope_type": "default"}}, {}),
        ({"rope_scaling": {"type": "linear", "factor": 2}}, {"rope_linear_factor": 2.0}),
        ({"rope_scaling": {"type": "linear", "factor": 0.5}}, {"rope_linear_factor": 0.5}),
        ({"rope_scaling": {"rope_type": "linear", "type": "yarn", "factor": 4.0}}, {"rope_linear_factor": 4.0}),
        ({"rms_norm_eps": 0.999, "rope_theta": 0.5}, {"eps": 0.999, "rope_theta": 0.5}),
        ({"rms_norm_eps": 1e-5, "rope_theta": 500000}, {"eps": 1e-5, "rope_theta": 500000.0}),
    ],
)
def test_a_config_the_forward_runs_gives_its_shape(change, expected):
    shape, why = draft_shape(dict(MINIMAL, **change))
    assert why == "" and shape == dataclasses.replace(DraftShape(64, 4, 4, 16), **expected)


# ---------------------------------------------------------------------- dropout (training only)
class _Recording(DraftForward):
    """Keeps what step 1's residual was: the fc output after dropout."""

    def finish(self, attn, residual):
        self.residuals.append(residual.detach().clone())
        return super().finish(attn, residual)


def _recording(golden) -> tuple[_Recording, torch.Tensor, torch.Tensor, torch.Tensor]:
    plain = _forward(golden, "gqa_d2t")
    forward = _Recording(plain.params, plain.embed, plain.shape)
    forward.residuals = []
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(64, (9,), generator=g)
    aux = torch.randn(9, plain.params["fc.weight"].shape[1], generator=g)
    return forward, tokens, aux, aux[:-1] @ plain.params["fc.weight"].T


def test_no_dropout_is_the_identity_and_draws_nothing(golden):
    forward, tokens, aux, fc = _recording(golden)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    with torch.no_grad():
        default = forward.forward_seq(tokens, aux, 1)
        zero = forward.forward_seq(tokens, aux, 1, dropout=0.0, gen=gen)
    assert torch.equal(forward.residuals[0], fc) and torch.equal(forward.residuals[1], fc)
    assert torch.equal(default[0], zero[0])
    assert torch.equal(gen.get_state(), state)


def test_dropout_keeps_each_value_drawn_at_or_above_p_scaled_by_one_over_one_minus_p(golden):
    """Inverted dropout on fc's output: the mask is ``rand >= p`` from the given generator (an element drawn exactly
    at p is kept), the kept values are scaled by 1 / (1 - p)."""
    forward, tokens, aux, fc = _recording(golden)
    draws = torch.rand(fc.shape, generator=torch.Generator().manual_seed(7))
    p = float(draws.flatten()[(draws.flatten() - 0.3).abs().argmin()])  # a value the generator draws
    with torch.no_grad():
        forward.forward_seq(tokens, aux, 1, dropout=p, gen=torch.Generator().manual_seed(7))
    keep = draws >= p
    assert 0 < int((~keep).sum()) < keep.numel()
    torch.testing.assert_close(forward.residuals[0], fc * keep.float() / (1 - p), rtol=1e-6, atol=0)


def test_dropout_keeps_the_expectation(golden):
    forward, tokens, aux, fc = _recording(golden)
    p = 0.5
    with torch.no_grad():
        for seed in range(20):
            forward.forward_seq(tokens, aux, 1, dropout=p, gen=torch.Generator().manual_seed(seed))
    dropped = torch.stack(forward.residuals)
    assert set(torch.unique((dropped / fc).round(decimals=4)).tolist()) == {0.0, 2.0}
    assert abs(float((dropped / fc).mean()) - 1.0) < 0.05


def test_dropout_is_repeatable_with_its_generator(golden):
    forward, tokens, aux, _ = _recording(golden)
    with torch.no_grad():
        a, b, c = (
            forward.forward_seq(tokens, aux, 2, dropout=0.5, gen=torch.Generator().manual_seed(seed))
            for seed in (3, 3, 4)
        )
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_the_spec_v2_worker_runs_the_chain_one_position_earlier(monkeypatch, golden):
    """Step 1 is the same for both workers; steps k > 1 run at t + k (v1) and t + k - 1 (v2)."""
    from eagle3_patches.acceptance import draft_reference as R

    seen: list = []
    qkv = R.DraftForward.qkv

    def record(self, tokens, hidden, pos):
        seen.append(pos.clone())
        return qkv(self, tokens, hidden, pos)

    monkeypatch.setattr(R.DraftForward, "qkv", record)
    forward, tokens, aux, _ = _recording(golden)
    for worker, offset in (("v1", 0), ("v2", -1)):
        seen.clear()
        forward.forward_seq(tokens, aux, 3, worker=worker)
        base = torch.arange(len(tokens) - 1)
        assert torch.equal(seen[0], base)  # step 1 at t
        for k, pos in enumerate(seen[1:], start=2):
            assert torch.equal(pos, base[: len(tokens) - k] + k + offset)


# ---------------------------------------------------------------------- attention and logits in blocks of rows
def _sequence(forward, length: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(forward.embed.shape[0], (length,), generator=g)
    return tokens, torch.randn(length, forward.params["fc.weight"].shape[1], generator=g)


@pytest.mark.parametrize("name", ["gqa_d2t", "defaults"])  # 4 heads over 2 kv heads, and over 4
@pytest.mark.parametrize("worker", ["v1", "v2"])
@pytest.mark.parametrize("rows", [1, 4, 7])  # 7 divides none of the 22, 21, 20 rows of steps 1-3
def test_blocks_of_rows_give_the_figures_of_one_block(golden, monkeypatch, name, worker, rows):
    """The attention (each block of query rows over the keys up to its last row, the last block over all) and the
    logits (reduced to ids block by block) in blocks give what one block gives: an offset or a mask that slips
    at a block's edge changes a row."""
    from eagle3_patches.acceptance import draft_reference as R

    forward = _forward(golden, name)
    tokens, aux = _sequence(forward, 23)
    with torch.no_grad():
        whole, ids = forward.forward_seq(tokens, aux, 3, worker=worker), forward.predict(tokens, aux, 3, worker)
        monkeypatch.setattr(R, "BLOCK_ELEMENTS", rows * forward.nh * 22)
        blocked, blocked_ids = (
            forward.forward_seq(tokens, aux, 3, worker=worker),
            forward.predict(tokens, aux, 3, worker),
        )
    for step, (a, b) in enumerate(zip(whole, blocked), start=1):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL, msg=lambda m, s=step: f"step {s}: {m}")
    assert [i.tolist() for i in blocked_ids] == [i.tolist() for i in ids] == [a.argmax(-1).tolist() for a in whole]


@pytest.mark.parametrize("name", ["gqa_d2t", "defaults"])  # 4 heads over 2 kv heads, and over 4
@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_the_fused_cpu_attention_of_long_sequences_gives_the_figures_of_one_block(golden, monkeypatch, name, worker):
    """From FUSED_FROM rows on, the CPU's fused causal kernel (each chain's own keys joined through its log-sum-exp)
    gives the logits of the dense softmax: a chain key dropped, a head mapped to the wrong kv head, or a mask that
    lets a row see later keys changes a row."""
    from eagle3_patches.acceptance import draft_reference as R

    forward = _forward(golden, name)
    tokens, aux = _sequence(forward, 23)
    with torch.no_grad():
        whole, ids = forward.forward_seq(tokens, aux, 3, worker=worker), forward.predict(tokens, aux, 3, worker)
        monkeypatch.setattr(R, "FUSED_FROM", 1)
        fused, fused_ids = forward.forward_seq(tokens, aux, 3, worker=worker), forward.predict(tokens, aux, 3, worker)
    for step, (a, b) in enumerate(zip(whole, fused), start=1):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL, msg=lambda m, s=step: f"step {s}: {m}")
    assert [i.tolist() for i in fused_ids] == [i.tolist() for i in ids]


@pytest.mark.parametrize("worker", ["v1", "v2"])
@pytest.mark.parametrize("rows", [None, 3, "fused"])  # one block, blocks of 3 rows, the fused CPU kernel
def test_a_base_position_sees_no_token_or_state_after_its_own(golden, monkeypatch, worker, rows):
    """Step k at base t reads the tokens up to t + k and the states up to t, nothing later (the causal mask and the
    chain's own keys): changing everything from position 12 on leaves the rows before unchanged and changes the
    first row that reads position 12."""
    from eagle3_patches.acceptance import draft_reference as R

    forward = _forward(golden, "gqa_d2t")
    if rows == "fused":
        monkeypatch.setattr(R, "FUSED_FROM", 1)
    elif rows is not None:
        monkeypatch.setattr(R, "BLOCK_ELEMENTS", rows * forward.nh * 19)
    tokens, aux = _sequence(forward, 20)
    later_tokens, later_aux = _sequence(forward, 20, seed=4)
    cut = 12
    changed_tokens, changed_aux = torch.cat([tokens[:cut], later_tokens[cut:]]), torch.cat([aux[:cut], later_aux[cut:]])
    with torch.no_grad():
        before = forward.forward_seq(tokens, aux, 3, worker=worker)
        after = forward.forward_seq(changed_tokens, changed_aux, 3, worker=worker)
    for k, (a, b) in enumerate(zip(before, after), start=1):
        torch.testing.assert_close(b[: cut - k], a[: cut - k], rtol=0, atol=ATOL, msg=lambda m, k=k: f"step {k}: {m}")
        assert not torch.allclose(b[cut - k], a[cut - k], rtol=1e-3, atol=1e-3), f"step {k} at {cut - k} saw nothing"


class _Largest(torch.utils._python_dispatch.TorchDispatchMode):
    """The most elements any tensor an operation produced held."""

    most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("attention", ["blocks", "fused"])
def test_no_tensor_grows_with_the_square_of_the_sequence(golden, monkeypatch, attention):
    """Over 600 tokens no operation of the measurement's forward makes a tensor near [heads, L, L] (1.4M elements
    here, what one block of scores over the whole sequence holds): the largest is a linear one (the aux states,
    600 x their width) or a block; the fused CPU kernel holds no block of scores at all."""
    from eagle3_patches.acceptance import draft_reference as R

    monkeypatch.setattr(R, "BLOCK_ELEMENTS", 1 << 14)
    if attention == "fused":
        monkeypatch.setattr(R, "FUSED_FROM", 1)
    forward = _forward(golden, "gqa_d2t")
    length, width = 600, forward.params["fc.weight"].shape[1]
    tokens, aux = _sequence(forward, length)
    with torch.no_grad(), _Largest() as seen:
        forward.predict(tokens, aux, 3)
    assert seen.most <= max(length * width, 2 * (1 << 14)) < forward.nh * (length - 1) ** 2 // 16
