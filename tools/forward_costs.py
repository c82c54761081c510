"""Where a speculative cycle's time goes, timed on sglang's real workers (the CPU demo's breakdown:
``tools/demo_cpu.py``).

Run :func:`measure` in an isolated process with the patches (``run_isolated(measure, target, draft, patches="all")``):
one request through the real target ``TpModelWorker`` and ``EAGLEWorker`` (:func:`.sglang_harness.eagle_workers`,
with the demo's flags: 3 steps, topk 1, the triton backend with the servers' KV splits), each decode cycle's three
parts timed by wrapping the worker's own methods: the draft's steps (``draft``), the target's verify forward
(``verify``) and the draft's extend over the accepted tokens (``forward_draft_extend_after_decode``); and a plain
decode step of the same target (its own runner's ``forward``, no speculation).  The v1 worker's method names:
sglang <= 0.5.12.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from eagle3_patches.testing import server, tiny_models

#: the v1 EAGLEWorker's parts of a decode cycle, as the demo names them
PARTS = {"draft": "draft steps", "verify": "target verify", "forward_draft_extend_after_decode": "draft extend"}


def _timed(obj: Any, name: str, into: list[float]) -> None:
    original = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    setattr(obj, name, timed)


def measure(target: str, draft: str, cycles: int = 6, prompt_tokens: int = 8) -> dict[str, float]:
    """Median seconds of each part of an EAGLE3 decode cycle (:data:`PARTS`), of the whole ``cycle``, and of a
    ``plain_decode`` step of the target, over ``cycles`` cycles after the first (which compiles kernels)."""
    import logging
    import warnings

    import torch

    from eagle3_patches.testing import sglang_harness as h

    # the figures are this process's output: sglang's start-up warnings and the interpreter's numpy warnings are not
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)

    flags = server.CPU_FLAGS  # the demo's servers' kernel setting, which changes what a decode step costs
    splits = int(flags[flags.index("--triton-attention-num-kv-splits") + 1])
    sa = h.eagle3_server_args(target, draft, triton_attention_num_kv_splits=splits)
    target_worker, eagle_worker = h.eagle_workers(sa)
    times: dict[str, list[float]] = {name: [] for name in (*PARTS, "cycle", "plain_decode")}
    for name in PARTS:
        _timed(eagle_worker, name, times[name])
    prompt = [4 + (7 * i) % (tiny_models.VOCAB - 4) for i in range(prompt_tokens)]
    batch = h.eagle_prefill_batch(target_worker, [prompt], max_new_tokens=8 * (cycles + 2))
    h.eagle_step(eagle_worker, batch)
    for name in PARTS:
        times[name].clear()  # the prefill's draft extend is not a decode cycle's
    for _ in range(cycles + 1):
        batch.prepare_for_decode()
        start = time.perf_counter()
        h.eagle_step(eagle_worker, batch)
        times["cycle"].append(time.perf_counter() - start)

    runner = target_worker.model_runner
    step = h.prefill(runner, [prompt])
    for _ in range(cycles + 1):
        start = time.perf_counter()
        with torch.no_grad():
            step = h.decode(runner, step)
        times["plain_decode"].append(time.perf_counter() - start)
    return {name: statistics.median(values[1:]) for name, values in times.items() if len(values) > 1}
