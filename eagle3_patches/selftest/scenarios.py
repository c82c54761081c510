"""What several checks make sglang do, each function run inside an isolated process (``run_isolated``); a
scenario only one check runs is in that check's module (:mod:`.checks`), beside it.

A scenario drives real sglang objects (``ServerArgs``, ``ModelRunner``, ``TpModelWorker``, the EAGLE
worker) on the tiny checkpoints through :mod:`eagle3_patches.testing.sglang_harness` and returns what
it observed as plain data; it judges nothing (:mod:`.checks` does).  The same function serves the
stock run (no patch applied in its process) and the patched run (the patch set applied before sglang
is imported, as ``eagle3-patches run`` does), and the repository's behavioural tests call it too.

``overrides`` are server arguments for the device the selftest runs on (``device="cuda"``, the user's
attention backend and dtype, CUDA graphs on); empty on CPU, where the harness's CPU defaults apply.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``("ok", fn(...))``, or ``(exception type name, message)`` when it raised."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the observation
        return type(exc).__name__, str(exc)


def patch_states() -> dict[str, str]:
    import eagle3_patches

    return {n: s.state.value for n, s in eagle3_patches.status().items()}


def apply_patch_set(patches: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """Apply the patch set (default selection, or ``patches``) in this process now, with ``env`` added to the
    settings; the patches land on the sglang modules already imported.  Returns every patch's state."""
    import eagle3_patches
    from eagle3_patches import settings

    os.environ.update(env or {})
    settings.reload()
    eagle3_patches.apply(patches)
    return patch_states()


def stock_then_patched(
    fn: Callable[..., Any], *args: Any, patches: list[str] | None = None, env: dict[str, str] | None = None
) -> dict:
    """``fn(*args)`` on stock sglang, then the patch set applied in the same process and ``fn(*args)`` again.
    For scenarios whose objects are built per call (flag resolution): the stock observation is made before
    any patch exists in the process."""
    stock = fn(*args)
    states = apply_patch_set(patches, env)
    return {"stock": stock, "patched": fn(*args), "states": states}


# --------------------------------------------------------------------------- the EAGLE worker at fc
def eagle_prefill_fc_widths(target: str, draft: str, revert_first: bool = False, overrides: dict | None = None) -> dict:
    """The real target ``TpModelWorker`` and EAGLE worker, one prefill of two prompts: the widths at the
    target's output and at the draft's ``fc``.  ``revert_first``: every patch reverted before sglang builds
    anything (the process's patches applied, then their originals put back)."""
    import eagle3_patches
    from eagle3_patches.testing import sglang_harness as h

    if revert_first:
        eagle3_patches.revert()
    sa = h.eagle3_server_args(target, draft, **(overrides or {}))
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)
    result, _ = h.eagle_prefill(tw, dw, PROMPTS)
    model = tw.model_runner.model
    lm = getattr(model, "language_model", model).model
    return {
        "fc_inputs": fc_inputs,
        "target_width": tuple(result.logits_output.hidden_states.shape),
        "layers_to_capture": list(lm.layers_to_capture),
        "state": eagle3_patches.status()["kimi_k25_eagle3_delegation"].state.value,
    }


def wrapper_eagle3_prefill(target: str, draft: str, overrides: dict | None = None) -> dict:
    """A multimodal wrapper target (Kimi-VL, Qwen3-VL) with an EAGLE-3 draft: one text prefill through the real
    TpModelWorker + EAGLE worker; the widths at ``fc`` and the layers the target captured."""
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, **(overrides or {}))
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)
    model = tw.model_runner.model
    h.eagle_prefill(tw, dw, [[5, 6, 7, 8, 9]])
    captured = next(m.layers_to_capture for m in model.modules() if getattr(m, "layers_to_capture", None))
    return {"class": type(model).__name__, "fc_inputs": fc_inputs, "layers_to_capture": list(captured)}


def eagle_without_capture(target: str, draft: str, overrides: dict | None = None, then_patched: bool = False) -> dict:
    """``--speculative-algorithm EAGLE`` with the EAGLE-3 draft: the target captures nothing and hands the
    draft H-wide states.  Did ``fc`` run, did anything raise?  ``then_patched``: the same workers again after
    the patch set was applied in this process (the draft's forward is what the fix changes):
    ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, algorithm="EAGLE", **(overrides or {}))
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)

    def prefill() -> dict:
        before = len(fc_inputs)
        try:
            h.eagle_prefill(tw, dw, PROMPTS[:1])
        except Exception as exc:  # noqa: BLE001
            return {"error": type(exc).__name__, "message": str(exc), "fc_inputs": fc_inputs[before:]}
        return {"error": None, "message": "", "fc_inputs": fc_inputs[before:]}

    stock = prefill()
    if not then_patched:
        return stock
    apply_patch_set()
    return {"stock": stock, "patched": prefill()}


# --------------------------------------------------------------------------- flag resolution (launcher)
def launcher_outcomes(cases: dict[str, tuple], overrides: dict | None = None) -> dict[str, tuple[str, Any]]:
    """Per case ``(target, draft, algorithm)``, or ``(target, draft, algorithm, flags)`` with server arguments of
    its own: the server arguments resolved as the launcher resolves them, before any rank starts.
    ``("ok", resolved algorithm)`` or ``(exception type, message)``."""
    from eagle3_patches.testing import sglang_harness as h

    def resolve(target: str, draft: str, algorithm: str, flags: dict | None = None) -> str:
        return h.launcher_server_args(
            h.eagle3_server_args, target, draft, algorithm=algorithm, **(overrides or {}), **(flags or {})
        ).speculative_algorithm

    return {name: outcome(resolve, *case) for name, case in cases.items()}


# --------------------------------------------------------------------------- layer ids at the target


def layer_output_hooks(model) -> dict:
    """Forward hooks on every decoder layer of ``model`` (Kimi-K2.5: of its language model): the dict they fill,
    layer index -> that layer's output (``hidden_states + residual``) in the last eager forward."""
    import torch

    lm = getattr(model, "language_model", model)
    outputs: dict[int, torch.Tensor] = {}

    def hook(i):
        def record(module, args, kwargs, out):
            hs, res = out[0], out[1]
            if isinstance(res, torch.Tensor) and res.shape == hs.shape:  # (hidden_states, residual)
                value = hs + res  # the layer's output
            else:  # sglang >= 0.5.23: (contribution, topk_indices); the residual lives in the batch's stream
                forward_batch = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
                value = forward_batch.residual_stream.snapshot(hs)
            outputs[i] = value.detach().clone()

        return record

    for i, layer in enumerate(lm.model.layers):
        layer.register_forward_hook(hook(i), with_kwargs=True)
    return outputs


def nearest_layers(aux, outputs: dict, hidden: int) -> list[int | None]:
    """Per aux state (chunk of ``hidden`` columns of ``aux``): the decoder layer whose output it is closest to."""
    found = []
    for chunk in aux.float().split(hidden, dim=-1):
        diffs = {i: float((chunk - out.float()).abs().max()) for i, out in outputs.items() if out.shape == chunk.shape}
        found.append(min(diffs, key=lambda i: diffs[i]) if diffs else None)
    return found


# --------------------------------------------------------------------------- the draft's loader
def bit_exact_mismatches(loaded: dict, path) -> list[str]:
    """The draft parameters (as sglang holds them, q/k/v and gate/up fused) that differ bit for bit from the
    checkpoint file at ``path`` (``midlayer.*`` or ``layers.0.*`` names).  Runs in the parent."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    t = {
        name.replace("layers.0.", "midlayer."): v.float()
        for name, v in load_file(str(Path(path) / "model.safetensors")).items()
    }
    a, m = "midlayer.self_attn.", "midlayer.mlp."
    expected = {
        "model.midlayer.self_attn.qkv_proj.weight": torch.cat(
            [t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]
        ),
        "model.midlayer.mlp.gate_up_proj.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
    }
    for name in (
        "midlayer.self_attn.o_proj.weight",
        "midlayer.mlp.down_proj.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "fc.weight",
        "norm.weight",
    ):
        expected[f"model.{name}"] = t[name]
    expected["lm_head.weight"] = t["lm_head.weight"]

    def param(name: str) -> str:  # sglang >= 0.5.12 names the decoder layer layers.0 instead of midlayer
        return name if name in loaded else name.replace("model.midlayer.", "model.layers.0.")

    return [n for n, v in expected.items() if not torch.equal(loaded[param(n)].float().to(v.device), v)]


#: set by the selftest: the file a check's processes write their output to (sglang logs a lot)
LOG_VARIABLE = "EAGLE3_SELFTEST_LOG"


def to_log() -> None:
    """This process's stdout and stderr (file descriptors 1 and 2) appended to the check's log, when the selftest
    gave one."""
    path = os.environ.get(LOG_VARIABLE)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def differing_tensors(a: dict | None, b: dict | None) -> list[str]:
    """The parameters two loads of one draft hold differently, bit for bit (dtype included); a parameter only one
    of them has counts too, and a load that did not happen is ``["(not loaded)"]``.  The embedding is left out:
    no checkpoint fills it, sglang replaces it by the target's, and until then it holds whatever memory it was
    allocated in.  Runs in the parent."""
    import torch

    if a is None or b is None:
        return ["(not loaded)"]

    def raw(t):
        return t.reshape(-1).view(torch.uint8)

    return sorted(set(a) ^ set(b)) + [
        n
        for n in a
        if n in b
        and n != "model.embed_tokens.weight"
        and not (a[n].dtype == b[n].dtype and torch.equal(raw(a[n]), raw(b[n])))
    ]


def observed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """The child side of :meth:`.base.Context.observe`: the scenario's outcome and every patch's state afterwards."""
    import eagle3_patches

    to_log()
    result = outcome(fn, *args, **kwargs)
    status = eagle3_patches.status()
    return {
        "outcome": result,
        "states": {n: s.state.value for n, s in status.items()},
        "reasons": {n: s.reason for n, s in status.items()},
    }


def load_drafts_to_host(target: str, drafts: list, overrides: dict | None = None) -> list[dict]:
    """:func:`eagle3_patches.testing.sglang_harness.load_drafts` with the device's server arguments, every tensor
    returned on the host (a CUDA tensor does not survive the trip back to the parent process)."""
    from eagle3_patches.testing import sglang_harness as h

    return to_host(h.load_drafts(target, drafts, **(overrides or {})))


def to_host(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value
