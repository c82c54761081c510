"""What image input does to an EAGLE-3 launch that no patch of this library fixes: the breakable prefill CUDA graph's
crash at start (sglang PR #38330).

Read from the wheels (``speculative/eagle_worker_v2.py``, ``model_executor/runner/prefill_cuda_graph_runner.py``,
``model_executor/cuda_graph_config.py``, ``configs/model_config.py``, ``server_args.py`` /
``arg_groups/cuda_graph_hook.py``): from :data:`DRAFT_PREFILL_GRAPH_FROM` the EAGLE-3 draft runs its prefill through
the breakable prefill CUDA graph whenever that graph is on, and the graph captures the Llama draft's own
``embed_tokens`` over every position.  For a multimodal request the image positions hold pad ids above the
vocabulary, so the replay gathers out of bounds (a CUDA device-side assert); sglang's warm-up sends an image, so the
server dies at start, after the target has loaded.  :data:`DRAFT_PREFILL_GRAPH_EMBEDS_FROM` feeds the draft its
embeddings from outside the graph.  The graph is on for the prefill when the launch asks for it
(``--cuda-graph-backend-prefill breakable``; ``--enable-breakable-cuda-graph``, its alias from 0.5.19), which
bypasses sglang's own rule that turns it off for a multimodal target; and by default on CUDA for a target on sglang's
list of multimodal architectures that keep it (Kimi-K2.5 from :data:`KIMI_K25_MM_PREFILL_GRAPH_FROM`), unless the
launch turns CUDA graphs or the prefill graph off, or asks for two-batch overlap or an a2a backend the graph was not
validated with (sglang's other rules that turn it off).  The MLA draft (``models/kimi_k25_eagle3.py``) is not named
by the PR and is not judged here.
"""

from __future__ import annotations

from ..checkpoint.releases import (
    BREAKABLE_GRAPH_ALIAS_FROM,
    DRAFT_PREFILL_GRAPH_EMBEDS_FROM,
    DRAFT_PREFILL_GRAPH_FROM,
    KIMI_K25_MM_PREFILL_GRAPH_FROM,
)
from ..diagnostic import ERROR
from ..patches.eagle3_image_draft_rows import image_input_on
from ..sglang_version import base_release
from .context import Context

CODE = "image-prefill-graph-crash"
BACKEND_FLAG = "--cuda-graph-backend-prefill"
#: the a2a backends sglang keeps the breakable prefill graph with (``disable_breakable_cudagraph_if_incompatible``)
GRAPH_A2A_BACKENDS = ("none", "deepep", "megamoe", "flashinfer")
#: the multimodal architectures of this library's targets that sglang keeps the graph on for, and from which release
GRAPH_BY_DEFAULT = {"KimiK25ForConditionalGeneration": KIMI_K25_MM_PREFILL_GRAPH_FROM}


def breakable_prefill_graph(ctx: Context) -> str | None:
    """Why the prefill runs in the breakable CUDA graph on the release judged (a phrase), or None where it does not."""
    la, v = ctx.launch, base_release(ctx.version)
    if la.cuda_graph_backend_prefill is not None:
        return f"{BACKEND_FLAG} breakable" if la.cuda_graph_backend_prefill.lower() == "breakable" else None
    if la.enable_breakable_cuda_graph and v >= BREAKABLE_GRAPH_ALIAS_FROM:
        return "--enable-breakable-cuda-graph"
    if la.disable_cuda_graph or la.disable_prefill_cuda_graph or la.enable_two_batch_overlap:
        return None
    if la.moe_a2a_backend not in GRAPH_A2A_BACKENDS:
        return None
    arch = ctx.target_view.arch
    first = GRAPH_BY_DEFAULT.get(arch)
    if first is None or v < first:
        return None
    return f"sglang {v}'s default for {arch} on CUDA"


def check_image_prefill_graph(ctx: Context) -> None:
    """EAGLE3 with a Llama-class draft, image input on and the breakable prefill graph: the start-up crash."""
    if ctx.algorithm != "EAGLE3" or ctx.target is None or not image_input_on(ctx):
        return
    v = base_release(ctx.version)
    if not DRAFT_PREFILL_GRAPH_FROM <= v < DRAFT_PREFILL_GRAPH_EMBEDS_FROM:
        return
    if ctx.draft is not None and ctx.draft.mla is not None:
        return
    why = breakable_prefill_graph(ctx)
    if why is None:
        return
    ctx.add(
        ERROR,
        CODE,
        f"sglang {v} fails at start with this launch: the EAGLE-3 draft's prefill runs in the breakable prefill "
        "CUDA graph, which embeds the image positions' pad ids (above the vocabulary) inside the graph; sglang's "
        "warm-up sends an image and the replay dies on a CUDA device-side assert (index out of bounds), after the "
        "target has loaded",
        where=BACKEND_FLAG,
        found=f"the breakable prefill graph on ({why}), image input on ({ctx.target_view.arch}), EAGLE3",
        expected="the prefill graph off for a multimodal EAGLE3 launch, or sglang >= "
        f"{DRAFT_PREFILL_GRAPH_EMBEDS_FROM}",
        fix=f"pass {BACKEND_FLAG} disabled (or --disable-prefill-cuda-graph), or upgrade to sglang >= "
        f"{DRAFT_PREFILL_GRAPH_EMBEDS_FROM}",
    )
