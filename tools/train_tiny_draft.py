"""Train the tiny EAGLE-3 draft on the tiny Kimi-K2.5 target's own greedy continuations.

    .venv/bin/python tools/train_tiny_draft.py [--out DIR] [--dump-dir DIR] [--check]

1. **dump** (skipped when ``--dump-dir`` already holds shards): starts the real
   ``sglang.launch_server`` on the tiny Kimi-K2.5 target, without speculation, under
   ``eagle3-patches run --cpu-profile`` with the opt-in ``hidden_state_dump`` patch
   (``EAGLE3_PATCHES_DUMP_LAYER_IDS=1,2,3``, the draft's ids), and sends fixed random prompts one
   at a time (greedy, ``--max-new-tokens``).  The shards hold the aux hidden states sglang's own
   capture path produced (3 x 64 = 192 wide) and the token ids.  One request at a time keeps the
   batch shapes, hence the float32 values, identical run to run.
2. **train**: a torch re-implementation of sglang 0.5.9's ``LlamaForCausalLMEagle3`` forward
   (``fc`` on the 3 x H aux states -> ``midlayer(cat(input_layernorm(embed), hidden_norm(h)))`` with
   causal attention and neox RoPE -> ``norm`` -> ``lm_head`` over the draft vocabulary), the
   embedding shared with the target (frozen, as sglang's ``set_embed`` does), trained with
   test-time training over 3 steps: step 1 gets ``fc(aux_t)`` and token ``x_{t+1}``; step k > 1
   gets the draft's own pre-norm output of step k-1 (H wide, fc skipped, as in sglang's draft
   decode) and token ``x_{t+k}``, attending to step-1 keys up to t plus its own chain.  Labels are
   the target's greedy tokens (prompt tokens are not labels).  The draft vocabulary is the 256
   most frequent labels (``d2t`` offsets / ``t2d`` as SpecForge writes them).  Deterministic: fixed
   seeds, one thread, full-batch Adam.
3. writes the trained tensors to ``eagle3_patches/testing/data/tiny_kimi_k25_eagle3_draft.safetensors``
   (or ``--out``), which :func:`eagle3_patches.testing.tiny_models.build_trained_eagle3_draft`
   turns into a servable draft directory; ``--check`` instead compares with the committed file
   bit for bit.

It prints the held-out accuracy per step with the real aux states and with the aux states of
other positions (the draft's predictions depend on ``fc`` applied to the 3 x H states).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3_patches.acceptance.draft_reference import SPEC_V2, DraftForward, DraftShape  # noqa: E402
from eagle3_patches.testing import tiny_models  # noqa: E402

STEPS = 3
DATA_FILE = ROOT / "eagle3_patches" / "testing" / "data" / "tiny_kimi_k25_eagle3_draft.safetensors"


def prompts(n: int, seed: int = 1234) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(4, tiny_models.VOCAB) for _ in range(rng.randrange(4, 13))] for _ in range(n)]


# --------------------------------------------------------------------------- 1. dump
def dump(target: str, dump_dir: Path, n_prompts: int, max_new_tokens: int, log_dir: Path, concurrency: int) -> None:
    from eagle3_patches.testing.server import Server

    env = {
        "EAGLE3_PATCHES_ENABLE": "hidden_state_dump",
        "EAGLE3_PATCHES_DUMP_DIR": str(dump_dir),
        "EAGLE3_PATCHES_DUMP_LAYER_IDS": ",".join(map(str, tiny_models.DRAFT_AUX_IDS)),
    }
    server = Server(
        target,
        ["--disable-radix-cache"],
        log_path=log_dir / "dump-server.log",
        env=env,
        attention_backend="torch_native",
    )
    t0 = time.time()
    outputs = []
    try:
        server.start()
        print(
            f"[dump] server ready in {time.time() - t0:.0f} s; {n_prompts} prompts x {max_new_tokens} tokens",
            flush=True,
        )
        from concurrent.futures import ThreadPoolExecutor

        ps = prompts(n_prompts)

        def one(p):
            return {"prompt": p, "output": server.generate(p, max_new_tokens)["output_ids"]}

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for i, out in enumerate(pool.map(one, ps)):
                outputs.append(out)
                if (i + 1) % 32 == 0:
                    print(f"[dump] {i + 1}/{n_prompts} ({time.time() - t0:.0f} s)", flush=True)
        time.sleep(2.5)  # the dump's idle flush (1 s)
    finally:
        server.stop()
    (dump_dir / "requests.json").write_text(json.dumps(outputs))
    print(
        f"[dump] done in {time.time() - t0:.0f} s: {len(glob.glob(str(dump_dir / '*.safetensors')))} shards", flush=True
    )


def load_sequences(dump_dir: Path):
    """[(tokens [L], aux [L, 3H], n_prompt)] with the last generated token appended to tokens."""
    import torch
    from safetensors import safe_open

    rows: dict[int, dict[int, tuple[int, torch.Tensor]]] = {}
    meta = None
    for shard in sorted(glob.glob(str(dump_dir / "*.safetensors"))):
        with safe_open(shard, "pt") as f:
            meta = f.metadata()
            ids, pos, seq, hid = (f.get_tensor(k) for k in ("input_ids", "positions", "seq_ids", "hidden_states"))
        for i in range(ids.shape[0]):
            rows.setdefault(int(seq[i]), {}).setdefault(int(pos[i]), (int(ids[i]), hid[i]))
    requests = json.loads((dump_dir / "requests.json").read_text())
    index = {tuple(req["prompt"] + req["output"]): i for i, req in enumerate(requests)}
    found = {}
    for sid in sorted(rows):
        r = rows[sid]
        L = max(r) + 1
        assert sorted(r) == list(range(L)), f"sequence {sid} has holes"
        tokens = tuple(r[p][0] for p in range(L))
        i = index.get(tokens)
        if i is None:  # the last generated token may not have been fed back
            i = next((j for k, j in index.items() if k[:L] == tokens and len(k) == L + 1), None)
        assert i is not None, "a dumped sequence matches no served request"
        found[i] = torch.stack([r[p][1] for p in range(L)]).float()
    assert len(found) == len(requests), f"{len(requests) - len(found)} requests missing from the dump"
    seqs = []
    for i, req in enumerate(requests):  # request order: independent of the scheduling order
        full = req["prompt"] + req["output"]
        seqs.append((torch.tensor(full, dtype=torch.int64), found[i], len(req["prompt"])))
    assert meta is not None and json.loads(meta["layer_ids"]) == list(tiny_models.DRAFT_AUX_IDS), meta
    return seqs, meta


# --------------------------------------------------------------------------- 2. the draft in torch
class Draft(DraftForward):
    """The forward the offline accept-length measurement runs (``eagle3_patches.acceptance.draft_reference``),
    over freshly initialised trainable parameters."""

    def __init__(self, embed, draft_vocab: int, spec: tiny_models.TinyDraftSpec, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        h, k, inter = spec.hidden, len(spec.aux_ids), spec.intermediate_size
        nh = spec.num_heads

        def p(*shape, std):
            return (torch.randn(*shape, generator=g) * std).requires_grad_(True)

        def ones(n):
            return torch.ones(n).requires_grad_(True)

        params = {
            "fc.weight": p(h, k * spec.target_hidden, std=(k * h) ** -0.5),
            "midlayer.self_attn.q_proj.weight": p(h, 2 * h, std=(2 * h) ** -0.5),
            "midlayer.self_attn.k_proj.weight": p(h, 2 * h, std=(2 * h) ** -0.5),
            "midlayer.self_attn.v_proj.weight": p(h, 2 * h, std=(2 * h) ** -0.5),
            "midlayer.self_attn.o_proj.weight": p(h, h, std=h**-0.5),
            "midlayer.mlp.gate_proj.weight": p(inter, h, std=h**-0.5),
            "midlayer.mlp.up_proj.weight": p(inter, h, std=h**-0.5),
            "midlayer.mlp.down_proj.weight": p(h, inter, std=inter**-0.5),
            "midlayer.input_layernorm.weight": ones(h),
            "midlayer.post_attention_layernorm.weight": ones(h),
            "midlayer.hidden_norm.weight": ones(h),
            "norm.weight": ones(h),
            "lm_head.weight": p(draft_vocab, h, std=h**-0.5),
        }
        super().__init__(params, embed, DraftShape(hidden=h, num_heads=nh, num_kv_heads=nh, head_dim=h // nh))

    def forward_seq(self, tokens, aux, steps: int = STEPS, dropout: float = 0.0, gen=None):
        # the committed draft was trained with the chain at t + k - 1 (the spec v2 worker's positions); kept, so that
        # --check reproduces it bit for bit
        return super().forward_seq(tokens, aux, steps, dropout, gen, worker=SPEC_V2)

    def tensors(self, hot):
        import torch

        t = {k: v.detach().clone().contiguous() for k, v in self.params.items()}
        t["d2t"] = (hot - torch.arange(hot.shape[0])).to(torch.int64)
        t2d = torch.zeros(tiny_models.VOCAB, dtype=torch.bool)
        t2d[hot] = True
        t["t2d"] = t2d
        return t


# --------------------------------------------------------------------------- 2b. training
def train(
    seqs,
    embed,
    *,
    draft_vocab: int,
    iters: int,
    seed: int = 0,
    held_out: int = 8,
    aux_dropout: float = 0.5,
    weight_decay: float = 0.05,
    lr: float = 3e-3,
):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    spec = tiny_models.TinyDraftSpec()
    # labels: target greedy tokens only (positions >= n_prompt)
    counts = torch.zeros(tiny_models.VOCAB, dtype=torch.int64)
    for toks, _, n_prompt in seqs:
        counts.index_add_(0, toks[n_prompt:], torch.ones(len(toks) - n_prompt, dtype=torch.int64))
    order = torch.sort(-counts * tiny_models.VOCAB + torch.arange(tiny_models.VOCAB)).indices  # by count, ties by id
    hot = torch.sort(order[:draft_vocab]).values
    t2d_index = torch.full((tiny_models.VOCAB,), -100, dtype=torch.int64)
    t2d_index[hot] = torch.arange(draft_vocab)
    covered = counts[hot].sum().item() / max(1, counts.sum().item())
    print(
        f"[train] {len(seqs)} sequences, {int(counts.sum())} greedy labels, {int((counts > 0).sum())} distinct; "
        f"draft vocab {draft_vocab} covers {covered:.1%} of them",
        flush=True,
    )

    train_seqs, test_seqs = seqs[held_out:], seqs[:held_out]
    draft = Draft(embed, draft_vocab, spec, seed=seed)
    opt = torch.optim.AdamW(list(draft.params.values()), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, iters) / iters)))

    def labels(toks, n_prompt, step, n):
        tgt = torch.full((n,), -100, dtype=torch.int64)
        have = t2d_index[toks[step + 1 : step + 1 + n]]
        tgt[: have.shape[0]] = have
        idx = torch.arange(n) + step + 1
        tgt[idx < n_prompt] = -100  # prompt tokens are not the target's predictions
        return tgt

    gen = torch.Generator().manual_seed(seed + 1)

    def loss_of(batch):
        total, count = 0.0, 0
        for toks, aux, n_prompt in batch:
            for step, logits in enumerate(draft.forward_seq(toks, aux, dropout=aux_dropout, gen=gen), start=1):
                tgt = labels(toks, n_prompt, step, logits.shape[0])
                if (tgt >= 0).any():
                    total = total + F.cross_entropy(logits, tgt, ignore_index=-100, reduction="sum") * (
                        0.8 ** (step - 1)
                    )
                    count += int((tgt >= 0).sum())
        return total / max(count, 1)

    t0 = time.time()
    for it in range(iters):
        opt.zero_grad()
        loss = loss_of(train_seqs)
        loss.backward()
        opt.step()
        sched.step()
        if it % 50 == 0 or it == iters - 1:
            print(f"[train] iter {it:4d} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)

    @torch.no_grad()
    def accuracy(batch, shuffle_aux=False):
        hits, n = [0] * STEPS, [0] * STEPS
        g = torch.Generator().manual_seed(99)
        for toks, aux, n_prompt in batch:
            if shuffle_aux:
                aux = aux[torch.randperm(aux.shape[0], generator=g)]
            for step, logits in enumerate(draft.forward_seq(toks, aux), start=1):
                tgt = labels(toks, n_prompt, step, logits.shape[0])
                m = tgt >= 0
                hits[step - 1] += int((logits.argmax(-1)[m] == tgt[m]).sum())
                n[step - 1] += int(m.sum())
        return [h / max(c, 1) for h, c in zip(hits, n)]

    for name, batch in (("train", train_seqs), ("held-out", test_seqs)):
        acc, shuf = accuracy(batch), accuracy(batch, shuffle_aux=True)
        print(
            f"[train] {name:8s} accuracy per step {[f'{a:.2f}' for a in acc]}; with the aux states of other "
            f"positions {[f'{a:.2f}' for a in shuf]}",
            flush=True,
        )
    return draft.tensors(hot)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=str(ROOT / ".eagle3-demo"), help="where the tiny target and the dumps live")
    ap.add_argument("--dump-dir", default=None, help="shards from hidden_state_dump (made here when empty)")
    ap.add_argument("--out", default=str(DATA_FILE))
    ap.add_argument("--prompts", type=int, default=480)
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight while dumping")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--aux-dropout", type=float, default=0.5)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--draft-vocab", type=int, default=320)
    ap.add_argument("--check", action="store_true", help="compare with the committed draft bit for bit; write nothing")
    args = ap.parse_args(argv)

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    work = Path(args.work)
    target = tiny_models.build_kimi_k25(work / "tiny-kimi-k25")
    dump_dir = Path(args.dump_dir or work / "dumps" / f"kimi-k25-p{args.prompts}-n{args.max_new_tokens}")
    if not glob.glob(str(dump_dir / "*.safetensors")) or not (dump_dir / "requests.json").exists():
        dump_dir.mkdir(parents=True, exist_ok=True)
        for old in glob.glob(str(dump_dir / "*.safetensors")):
            Path(old).unlink()
        dump(str(target), dump_dir, args.prompts, args.max_new_tokens, work, args.concurrency)
    else:
        print(f"[dump] reusing {dump_dir}")
    seqs, meta = load_sequences(dump_dir)
    print(
        f"[dump] capture convention: {meta['convention']}; layer outputs {meta['captured_layer_outputs']}, "
        f"sglang {meta['sglang_version']}, width {meta['aux_width']}"
    )
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("language_model.model.embed_tokens.weight").float()
    tensors = train(
        seqs,
        embed,
        draft_vocab=args.draft_vocab,
        iters=args.iters,
        aux_dropout=args.aux_dropout,
        weight_decay=args.weight_decay,
    )
    if args.check:
        ref = load_file(args.out)
        same = ref.keys() == tensors.keys() and all(torch.equal(ref[k], tensors[k]) for k in ref)
        print(f"[check] {'identical to' if same else 'DIFFERENT from'} {args.out}")
        return 0 if same else 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_file(
        tensors,
        args.out,
        metadata={
            "format": "pt",
            "trained_by": "tools/train_tiny_draft.py",
            "dump": json.dumps(dict(meta, written=None)),
        },
    )
    print(f"[train] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
