"""sglang's EAGLE-3 draft forward (``LlamaForCausalLMEagle3`` of sglang 0.5.9, ``srt/models/llama_eagle3.py``) in
plain torch, over whole sequences at once: what the offline accept-length measurement runs and what
``tools/train_tiny_draft.py`` trains.  One implementation for both, so a draft is measured with the forward it was
trained with, and both with the forward sglang serves it with.

The forward, as sglang's draft worker runs it (``speculative/eagle_worker.py``):

* step 1, at base position t: ``h = fc(aux_t)`` (the target's k aux states, concatenated), the token ``x_{t+1}``
  (the one the target just produced); ``midlayer(cat(input_layernorm(embed(x)), hidden_norm(h)))`` with causal
  attention over the step-1 keys up to t and neox RoPE at position t, the residual ``h``; then
  ``norm(out) @ lm_head`` gives draft-vocabulary logits for ``x_{t+2}``;
* step k > 1: the hidden is the previous step's pre-norm output (H wide: ``fc`` is skipped, as sglang skips it on
  an H-wide input), the token ``x_{t+k}``, at the position the serving worker gives it (:data:`CHAIN_OFFSET`),
  attending to the step-1 keys up to t and to its own chain's keys;
* draft id i means target id ``i + d2t[i]``; the embedding is the target's (sglang's ``set_embed``).

Teacher-forced: step k is fed the true ``x_{t+k}``.  With greedy verification and topk 1 that gives exactly the
accepted count of a verify step (a chain stops counting at its first wrong token, and up to there its tokens are
the true ones).

It runs on the device and in the dtype of the weights it is given (float32 on the CPU is the reference the tests
pin; the norms and the softmax are taken in float32 whatever the dtype, as sglang takes them).  Attention runs in
blocks of query rows (:func:`attend`) and the logits are reduced block by block (:meth:`DraftForward.predict`), so
memory grows linearly with a sequence, not with its square.  A sequence that fits one block gives, in float32, the
logits of one dense softmax over [heads, L, L] scores bit for bit, and for a draft without grouped-query attention
the same gradients too (what ``tools/train_tiny_draft.py --check`` relies on).

Not implemented, refused by :func:`draft_shape` with the reason: RoPE scaling other than none and ``linear``,
activations other than SiLU, more than one draft layer, the EAGLE-3.1 norm fields, an ``fc`` with a bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: sglang's two draft workers, as ``SGLANG_ENABLE_SPEC_V2`` picks them
SPEC_V1, SPEC_V2 = "v1", "v2"
#: where each worker runs draft step k > 1, relative to t + k: the spec v1 worker (``EAGLEWorker.draft_forward``,
#: observed on sglang 0.5.9) starts from ``seq_lens`` (t + 1) and advances one before each forward, so t + k; the
#: spec v2 worker (``EAGLEWorkerV2``, observed on 0.5.23, the only worker there) runs it at t + k - 1
CHAIN_OFFSET = {SPEC_V1: 0, SPEC_V2: -1}
#: the draft config fields whose meaning this forward does not implement (another forward would be measured)
UNIMPLEMENTED_FIELDS = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "norm_before_residual")
#: the midlayer's tensors, as the sglang-format checkpoint names them
MIDLAYER = (
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.hidden_norm.weight",
)
REQUIRED = ("fc.weight", *MIDLAYER, "norm.weight")
MLP_UP = "midlayer.mlp.up_proj.weight"
#: the most elements one block of attention scores or of logits holds (one block of rows at a time): memory grows
#: linearly with the sequence length, not with its square
BLOCK_ELEMENTS = 1 << 26
#: from this many query rows on, attention on the CPU runs as torch's fused causal kernel (its running softmax
#: holds no block of scores, and it is tens of times faster than the blocks there: a 32k-position sequence in
#: seconds, not many minutes); its rows agree with the blocks' to float32 rounding, not bit for bit
FUSED_FROM = 8192


@dataclass(frozen=True)
class DraftShape:
    """What the forward needs from the draft's config."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_linear_factor: float = 1.0


def draft_shape(config: dict) -> tuple[DraftShape | None, str]:
    """The shape of an sglang-format EAGLE-3 draft config, or (None, why this forward cannot run it)."""

    def num(key: str, default: Any = None) -> Any:
        value = config.get(key, default)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    hidden, heads = num("hidden_size"), num("num_attention_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or hidden <= 0 or heads <= 0:
        return None, "hidden_size and num_attention_heads must be positive whole numbers"
    kv = num("num_key_value_heads", heads)
    head_dim = num("head_dim", hidden // heads)
    if not isinstance(kv, int) or kv <= 0 or heads % kv or not isinstance(head_dim, int) or head_dim <= 0:
        return None, "num_key_value_heads must divide num_attention_heads, head_dim must be positive"
    if head_dim % 2:
        return None, f"head_dim {head_dim} is odd (RoPE rotates pairs)"
    if config.get("num_hidden_layers", 1) != 1:
        return None, f"num_hidden_layers {config.get('num_hidden_layers')!r}: only one draft layer is implemented"
    act = config.get("hidden_act", "silu")
    if act != "silu":
        return None, f"hidden_act {act!r}: only silu is implemented"
    if config.get("bias"):
        return None, "bias: true (an fc with a bias) is not implemented"
    for key in UNIMPLEMENTED_FIELDS:
        if config.get(key) or (isinstance(config.get("eagle_config"), dict) and config["eagle_config"].get(key)):
            return None, f"{key}: the EAGLE-3.1 norms are not implemented by this measurement"
    factor = 1.0
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "linear" and isinstance(scaling.get("factor"), (int, float)) and scaling["factor"] > 0:
            factor = float(scaling["factor"])
        elif kind not in (None, "default"):
            return None, f"rope_scaling type {kind!r}: only none and linear are implemented"
    eps = num("rms_norm_eps", 1e-6)
    theta = num("rope_theta", 10000.0)
    if eps is None or not 0 < eps < 1 or theta is None or theta <= 0:
        return None, "rms_norm_eps must be in (0, 1) and rope_theta positive"
    return DraftShape(hidden, heads, kv, head_dim, float(eps), float(theta), factor), ""


def rms(x, w, eps: float = 1e-6):
    """RMSNorm as sglang's ``forward_native`` computes it: in float32, cast back to ``x``'s dtype, then ``* w``."""
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, theta: float = 10000.0, factor: float = 1.0):
    """neox-style rotary embedding (sglang's ``get_rope`` default for Llama); x [T, heads, d].  The angles in
    float32, cos and sin in ``x``'s dtype (sglang's cos/sin cache)."""
    import torch

    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    # pragma: no mutate core/NumberReplacer `= 0`: `draft_shape` only gives a factor above 0 (the default 1.0): the
    # division by a factor of 1.0 is the same float
    p = pos.float() if factor == 1.0 else pos.float() / factor
    ang = p[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attend(q, k, v, chain_k, chain_v, scale: float):
    """Softmax attention of the queries ``q`` [n, heads, d]: query t over the step-1 keys ``k`` / values ``v``
    [S >= n, kv heads, d] up to t (causal) and over its own chain's keys ``chain_k`` / values ``chain_v`` (each
    [>= n, kv heads, d], row t for query t).  Grouped-query: query head h reads kv head h // (heads / kv heads).

    In blocks of query rows, each over the keys up to its last row: no block holds more than about ``block``
    scores (:data:`BLOCK_ELEMENTS`), so memory grows linearly with the sequence, not with its square.  The softmax is
    taken in float32."""
    import torch

    n, nh, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    rows = max(1, BLOCK_ELEMENTS // max(1, nh * n))
    ck = torch.stack([c[:n] for c in chain_k]) if chain_k else None  # [J, n, kv heads, d]
    cv = torch.stack([c[:n] for c in chain_v]) if chain_v else None
    fused = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if n >= FUSED_FROM and q.device.type == "cpu" and fused is not None:
        return _attend_fused(fused, q, k[:n], v[:n], ck, cv, scale)
    out = []
    for start in range(0, n, rows):
        end = min(n, start + rows)
        keys = end if end < n else k.shape[0]  # the last block over every key (masked past its rows), as one block is
        qb = q[start:end].view(end - start, nkv, g, d)
        s = torch.einsum("bkgd,skd->kgbs", qb, k[:keys])  # [kv heads, g, rows, keys]
        future = torch.arange(keys, device=q.device)[None, :] > torch.arange(start, end, device=q.device)[:, None]
        if ck is not None:  # each query's own chain keys, after the step-1 keys; a query sees its whole chain
            sc = (qb.unsqueeze(0) * ck[:, start:end].unsqueeze(3)).sum(-1).permute(2, 3, 1, 0)  # [kv, g, rows, J]
            s = torch.cat([s, sc], dim=-1)
            future = torch.cat([future, future.new_zeros(end - start, ck.shape[0])], dim=1)
        w = s.mul(scale).masked_fill(future, float("-inf")).float().softmax(-1).to(q.dtype)
        o = torch.einsum("kgbs,skd->bkgd", w[..., :keys], v[:keys])
        if cv is not None:
            o = o + torch.einsum("kgbj,jbkd->bkgd", w[..., keys:], cv[:, start:end])
        out.append(o.reshape(end - start, nh, d))
    return torch.cat(out) if len(out) > 1 else out[0]


def _attend_fused(fused, q, k, v, ck, cv, scale: float):
    """:func:`attend` by torch's fused causal CPU kernel over the step-1 keys, which also gives each row's
    log-sum-exp of its scores; a query's own chain keys join through that log-sum-exp (the softmax over both key
    sets, in float32)."""
    import torch

    n, nh, d = q.shape
    g = nh // k.shape[1]
    heads = lambda x: x.repeat_interleave(g, dim=-2) if g > 1 else x  # noqa: E731 - kv head h // g for query head h
    out, lse = fused(*(x.transpose(0, 1).unsqueeze(0) for x in (q, heads(k), heads(v))), 0.0, True, scale=scale)
    out, lse = out[0].transpose(0, 1).float(), lse[0].transpose(0, 1).float()  # [n, heads, d], [n, heads]
    if ck is None:
        return out.to(q.dtype)
    qg = q.float().view(n, k.shape[1], g, d)  # the chain keys [J, n, kv heads, d] read per kv head, not repeated
    sc = (torch.einsum("bkgd,jbkd->bkgj", qg, ck.float()) * scale).reshape(n, nh, -1)
    top = torch.maximum(lse, sc.amax(-1))
    main, chain = (lse - top).exp(), (sc - top[..., None]).exp()
    joined = torch.einsum("bkgj,jbkd->bkgd", chain.view(n, k.shape[1], g, -1), cv.float()).reshape(n, nh, d)
    return ((out * main[..., None] + joined) / (main + chain.sum(-1))[..., None]).to(q.dtype)


class DraftForward:
    """The forward over ``params`` (sglang-format names, :data:`REQUIRED` + ``lm_head.weight``), with the
    target's embedding ``embed`` [vocab, H]."""

    def __init__(self, params: dict, embed, shape: DraftShape):
        self.params = params
        self.embed = embed
        self.shape = shape
        self.nh, self.nkv, self.hd = shape.num_heads, shape.num_kv_heads, shape.head_dim

    def _rope(self, x, pos):
        return rope(x, pos, self.shape.rope_theta, self.shape.rope_linear_factor)

    def qkv(self, tokens, hidden, pos):
        import torch

        P, eps = self.params, self.shape.eps
        x = torch.cat(
            [
                rms(self.embed[tokens], P["midlayer.input_layernorm.weight"], eps),
                rms(hidden, P["midlayer.hidden_norm.weight"], eps),
            ],
            dim=-1,
        )
        T = x.shape[0]
        q = self._rope((x @ P["midlayer.self_attn.q_proj.weight"].T).view(T, self.nh, self.hd), pos)
        k = self._rope((x @ P["midlayer.self_attn.k_proj.weight"].T).view(T, self.nkv, self.hd), pos)
        v = (x @ P["midlayer.self_attn.v_proj.weight"].T).view(T, self.nkv, self.hd)
        return q, k, v

    def finish(self, attn, residual):
        """(draft-vocabulary logits, the pre-norm output the next step gets)."""
        import torch.nn.functional as F

        P, eps = self.params, self.shape.eps
        h1 = attn.reshape(attn.shape[0], -1) @ P["midlayer.self_attn.o_proj.weight"].T + residual
        x = rms(h1, P["midlayer.post_attention_layernorm.weight"], eps)
        mlp = (F.silu(x @ P["midlayer.mlp.gate_proj.weight"].T) * (x @ P["midlayer.mlp.up_proj.weight"].T)) @ P[
            "midlayer.mlp.down_proj.weight"
        ].T
        out = mlp + h1  # pre-norm: what sglang's draft hands its next step
        logits = rms(out, P["norm.weight"], eps) @ P["lm_head.weight"].T
        return logits, out

    def forward_seq(self, tokens, aux, steps: int, dropout: float = 0.0, gen=None, worker: str = SPEC_V1) -> list:
        """Per base position t (0..L-2): the logits of steps 1..steps; step k predicts ``tokens[t + k + 1]``; steps
        k > 1 at the positions ``worker`` runs them (:data:`CHAIN_OFFSET`); ``dropout`` on the fc output: training
        only."""
        return self._run(tokens, aux, steps, dropout, gen, worker, lambda logits, step, start: logits)

    def predict(self, tokens, aux, steps: int, worker: str = SPEC_V1) -> list:
        """:meth:`forward_seq`'s argmax (draft ids) per step, without holding a step's [L, draft vocab] logits."""
        return self._run(tokens, aux, steps, 0.0, None, worker, lambda logits, step, start: logits.argmax(-1))

    def reduce(self, tokens, aux, steps: int, head, worker: str = SPEC_V1) -> list:
        """Per step, ``head(logits, step, start)`` of each block of that step's logits (the rows of base positions
        ``start``, ``start + 1``, ...), concatenated: what a caller keeps of the logits without holding a step's
        [L, draft vocab] of them (the acceptance at temperature, :mod:`.sampling`)."""
        return self._run(tokens, aux, steps, 0.0, None, worker, head)

    def _run(self, tokens, aux, steps: int, dropout: float, gen, worker: str, head) -> list:
        """The forward, ``head(logits, step, start)`` applied to each block of rows of logits.  ``tokens`` and
        ``aux`` are moved to the device and dtype of the draft's weights."""
        import torch

        fc = self.params["fc.weight"]
        tokens, aux = tokens.to(fc.device), aux.to(device=fc.device, dtype=fc.dtype)
        L = aux.shape[0]
        base = torch.arange(L - 1, device=fc.device)
        scale = self.hd**-0.5
        rows = max(1, BLOCK_ELEMENTS // max(self.params["lm_head.weight"].shape[0], self.params[MLP_UP].shape[0]))

        def finish(attn, residual, step):  # row by row: the block's logits go through ``head`` before the next block
            kept, outs = [], []
            for i in range(0, attn.shape[0], rows):
                logits, o = self.finish(attn[i : i + rows], residual[i : i + rows])
                kept.append(head(logits, step, i))
                outs.append(o)
            if len(kept) == 1:
                return kept[0], outs[0]
            return torch.cat(kept), torch.cat(outs)

        # step 1: token x_{t+1}, hidden fc(aux_t), position t, causal over step-1 keys
        h = aux[:-1] @ fc.T
        if dropout:  # training only: the draft must not memorise the aux states alone
            keep = (torch.rand(h.shape, generator=gen) >= dropout).float() / (1 - dropout)
            h = h * keep
        q1, k1, v1 = self.qkv(tokens[1:L], h, base)
        result, out = finish(attend(q1, k1, v1, [], [], scale), h, 1)
        results = [result]
        chain_k: list = []
        chain_v: list = []
        for step in range(2, steps + 1):
            n = L - step  # base positions whose step token x_{t+step} exists
            if n <= 0:
                # pragma: no mutate core/ReplaceBreakWithContinue: `n = L - step` only shrinks as the loop goes on: once
                # `n <= 0` every later step skips too
                break
            hid = out[:n]
            q, k, v = self.qkv(tokens[step : step + n], hid, base[:n] + step + CHAIN_OFFSET[worker])
            chain_k = [c[:n] for c in chain_k] + [k]
            chain_v = [c[:n] for c in chain_v] + [v]
            result, out = finish(attend(q, k1, v1, chain_k, chain_v, scale), hid, step)
            results.append(result)
        return results
