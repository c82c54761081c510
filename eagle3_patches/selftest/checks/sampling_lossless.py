"""sampling_lossless: on the user's GPU, EAGLE-3 speculation at temperature > 0 generates what the target without
speculation generates, in distribution (sglang's own verify kernels: tree speculative sampling, top-k / top-p
renormalisation, CUDA graphs on).

A check of sglang itself, not of a patch: sampling-verify bugs are silent (temperature or top-p ignored in verify,
NaN draft probabilities accepted, probabilities read after a CUDA-graph pool reused them: each gives a healthy server
and wrong tokens), and no greedy check sees them.  Two real servers of the tiny Kimi-K2.5 (one with EAGLE3 and the
trained draft, one without speculation) answer the same :data:`SAMPLES` copies of one prompt at each of Kimi-K2.5's
served temperatures, and at 0.3; :func:`eagle3_patches.acceptance.lossless.compare` tests the first
:data:`TOKENS` tokens (false-alarm rate :data:`~eagle3_patches.acceptance.lossless.ALPHA`).  The repository runs the
same comparison on CPU servers (tests/e2e/test_sampling.py), where the CPU profile's sampling kernels stand in for
the GPU's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ...acceptance import lossless
from ...testing.server import Server, ServerError, held_out_prompts, mean_accept_length, speculative_flags
from ..base import Check, Context, Finding

SAMPLES = 512
#: the tokens compared, of each sequence; the prompt; the sampling settings (the repository's CPU test reads them too)
TOKENS = 4
#: the prefixes compared start at two tokens: the first token is each server's prefill sample, by the same sampler
FROM_LENGTH = 2
PROMPT = held_out_prompts(1, seed=99)[0][:3]
SETTINGS = {
    # Kimi-K2.5's thinking and instant modes; top-k 4 keeps each position's distribution to a few tokens
    "temperature 1.0, top-k 4": {"temperature": 1.0, "top_k": 4, "max_new_tokens": TOKENS},
    "temperature 0.6, top-p 0.95, top-k 4": {"temperature": 0.6, "top_p": 0.95, "top_k": 4, "max_new_tokens": TOKENS},
    # a temperature far from 1: a verify that ignores the request's temperature samples visibly otherwise here
    "temperature 0.3, top-k 4": {"temperature": 0.3, "top_k": 4, "max_new_tokens": TOKENS},
}


def _answers(ctx: Context, target: str, args: list[str], name: str, logs: Path) -> dict[str, list[dict]]:
    server = Server(target, args, log_path=logs / f"{name}.log", device="cuda")
    try:
        server.start(timeout=300)
        return {s: server.generate_batch([PROMPT] * SAMPLES, TOKENS, p) for s, p in SETTINGS.items()}
    except (ServerError, OSError) as exc:
        raise ServerError(f"{name} server: {exc}\n{server.log_tail()}") from exc
    finally:
        server.stop()


def sampled_like_no_speculation(ctx: Context) -> Finding:
    target, draft = ctx.path("kimi_k25"), ctx.path("trained_draft")
    with tempfile.TemporaryDirectory(prefix="eagle3-selftest-sampling-") as tmp:
        try:
            plain = _answers(ctx, target, [], "no-speculation", Path(tmp))
            eagle3 = _answers(ctx, target, speculative_flags(draft), "eagle3", Path(tmp))
        except ServerError as exc:
            return Finding(False, f"a server did not answer: {exc}")
    lines, same = [], True
    for setting in SETTINGS:
        result = lossless.compare(
            [r["output_ids"] for r in eagle3[setting]],
            [r["output_ids"] for r in plain[setting]],
            TOKENS,
            from_length=FROM_LENGTH,
        )
        same = same and result.same_distribution
        lines.append(f"{setting}: accept length {mean_accept_length(eagle3[setting]):.2f}, {result.describe()}")
    return Finding(same, "; ".join(lines), observations={"settings": list(SETTINGS), "samples": SAMPLES})


CHECKS: tuple[Check, ...] = (
    Check(
        "sampling_lossless",
        "EAGLE3 at temperature 1.0, 0.6 and 0.3 samples what no speculation samples (sglang's verify kernels, CUDA "
        "graphs)",
        sampled_like_no_speculation,
        needs=("cuda",),
    ),
)
