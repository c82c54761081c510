"""What the draft runs with: the context length and RoPE it is served at, and what it inherits from the target's
flags (quantization, attention backend) unless told otherwise.  A draft that loads and passes every structural
check is still accepted less often when it runs past the length it was trained at, with another position
encoding than in training, or with numerics its checkpoint was not made for.

As sglang 0.5.9 does it (``configs/model_config.py``, ``speculative/eagle_worker.py``, ``server_args.py``,
``model_executor/model_runner.py``; later releases were not read for this):

* the draft worker is given the target's context length (``--context-length``, else the target's derived one);
  when that exceeds the draft's own derived length (``get_context_length``: the first of
  :data:`CONTEXT_LENGTH_KEYS` times the ``rope_scaling`` factor, unless the scaling names its original length
  or is llama3's), sglang refuses to start, unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``: then the
  draft's ``max_position_embeddings`` is overwritten and it runs past its trained length, with a warning only;
* ``--quantization`` is copied to the draft unless ``--speculative-draft-model-quantization`` is given
  (``unquant``: none);
* the draft's attention backend is ``--speculative-draft-attention-backend``, else the target's.
"""

from __future__ import annotations

from typing import Any

from .. import settings
from ..checkpoint import expected_accept
from ..checkpoint.releases import ADAPTIVE_STEPS_FROM, env_bool
from ..checkpoint.safe_io import CheckpointError
from ..diagnostic import ERROR, INFO, WARNING
from ..sglang_version import base_release
from .context import Context, launch_environ

#: sglang's ``CONTEXT_LENGTH_KEYS``: the first one a config sets is its length
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
#: sglang's default when a config sets none of them
DEFAULT_CONTEXT_LENGTH = 2048
#: the environment variable that lets sglang start a draft past its length
ALLOW_LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
#: attention backends that serve MLA models only: the draft (Llama attention) cannot run on them
MLA_ONLY_BACKENDS = ("flashmla", "cutlass_mla", "trtllm_mla")


def rope_scaling(config: dict) -> dict | None:
    """The config's RoPE scaling (``rope_scaling``, or transformers 5's ``rope_parameters``); None for none, the
    default type, or a factor of 1 (no scaling at all)."""
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if isinstance(value, dict):
            kind = value.get("rope_type", value.get("type"))
            if (kind in (None, "default") and "factor" not in value) or value.get("factor", 1) in (1, 1.0):
                return None
            return value
    return None


def rope_theta(config: dict) -> Any:
    params = config.get("rope_parameters")
    return config.get("rope_theta", params.get("rope_theta") if isinstance(params, dict) else None)


def derived_context_length(config: dict) -> int:
    """The context length sglang derives from a (text) config, as ``get_context_length`` does."""
    scaling = rope_scaling(config) or {}
    factor = scaling.get("factor", 1)
    if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
        factor = 1
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1024:
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return int(factor * value)
    return DEFAULT_CONTEXT_LENGTH


def _target_text(ctx: Context) -> dict:
    tv = ctx.target_view
    text = tv.config.get("text_config") if tv.text_prefix else None
    return text if isinstance(text, dict) else tv.config


def _draft_layer(ctx: Context) -> dict:
    dv = ctx.draft_view
    inner = dv.config.get("transformer_layer_config") if dv.layer_prefix else None
    return inner if isinstance(inner, dict) else dv.config


def _describe_rope(config: dict) -> str:
    scaling = rope_scaling(config)
    kind = (scaling.get("rope_type") or scaling.get("type")) if scaling else None
    shown = f"{str(kind)[:40]} x{str(scaling.get('factor'))[:40]}" if scaling else "none"
    return f"rope_scaling {shown}, rope_theta {str(rope_theta(config))[:40]}"  # a checkpoint's values: bounded


def check_context(ctx: Context) -> None:
    """The context length the draft is served at against its own, and its RoPE against the target's."""
    target, draft = _target_text(ctx), _draft_layer(ctx)
    served = ctx.launch.context_length or derived_context_length(target)
    source = "--context-length" if ctx.launch.context_length else "the target's"
    own = derived_context_length(draft)
    ctx.report.facts["draft_context"] = {"served": served, "served_from": source, "draft": own}
    if served > own:
        allowed = bool(env_bool(launch_environ(ctx.launch).get(ALLOW_LONGER)))
        past = (
            "the draft then runs past the length it was trained at: its positions beyond it were never seen, and "
            "its accept length falls as contexts grow (no error)"
        )
        ctx.add(
            WARNING if allowed else ERROR,
            "draft-context-length",
            (
                f"sglang starts ({ALLOW_LONGER}=1 is set) and overwrites the draft's max_position_embeddings: {past}"
                if allowed
                else f"sglang refuses to start: the draft is given {source} context length and its own is shorter "
                f"(with {ALLOW_LONGER}=1 it starts, and {past})"
            ),
            where=ctx.dcfg(ctx.draft_view.layer_prefix + "max_position_embeddings"),
            found=f"draft {own} (derived as sglang does), served {served} ({source})",
            expected=f"at least {served}",
            fix=f"serve with --context-length {own} or less, or use a draft trained at {served} with the "
            "target's rope_scaling",
        )
    if _describe_rope(draft) != _describe_rope(target):
        # The draft's attention rotates with its own RoPE, in training and in serving alike: unlike the target's is
        # no fault.  What changes the outcome is a served context past the draft's own length, which
        # draft-context-length judges (sglang's refusal, or its overwrite); here a note.
        within = served <= own
        ctx.add(
            INFO,
            "draft-rope",
            "the draft has its own RoPE, not the target's: it rotates with it as it was trained"
            + (
                f", and the served context ({served}) is within its own length ({own})"
                if within
                else f"; the served context ({served}) passes its own length ({own}): see [draft-context-length]"
            ),
            where=ctx.dcfg(ctx.draft_view.layer_prefix + "rope_scaling"),
            found=f"draft: {_describe_rope(draft)}",
            expected=f"the target's: {_describe_rope(target)}, or the draft's own within its length",
            fix="" if within else "keep --context-length within the draft's own length (see [draft-context-length])",
        )


def check_inherited(ctx: Context) -> None:
    """What the draft takes from the target's flags: quantization and attention backend."""
    la, dv = ctx.launch, ctx.draft_view
    own_quant = isinstance(dv.config.get("quantization_config"), dict)
    quant = la.quantization if la.draft_quantization is None else la.draft_quantization
    quant = None if quant == "unquant" else quant
    backend = la.draft_attention_backend or la.attention_backend
    ctx.report.facts["draft_runs_with"] = {
        "quantization": quant,
        "quantization_from": "--speculative-draft-model-quantization"
        if la.draft_quantization is not None
        else ("--quantization (inherited)" if la.quantization else "none given"),
        "attention_backend": backend,
        "attention_backend_from": "--speculative-draft-attention-backend"
        if la.draft_attention_backend
        else ("--attention-backend (inherited)" if la.attention_backend else "sglang's choice for the target"),
        "context_length": ctx.report.facts.get("draft_context", {}).get("served"),
        "dtype": ctx.report.facts.get("draft_dtype", {}).get("dtype"),
        "dtype_from": ctx.report.facts.get("draft_dtype", {}).get("from"),
    }
    if la.draft_quantization is None and la.quantization and not own_quant:
        ctx.add(
            WARNING,
            "draft-quantization-inherited",
            f"the draft is loaded with --quantization {la.quantization} too (sglang copies it to the draft): a draft "
            "saved unquantized then runs with other numerics than it was trained with, or fails to load",
            where="--quantization",
            found=f"--quantization {la.quantization}, no --speculative-draft-model-quantization",
            expected="the draft's own: none (its config.json has no quantization_config)",
            fix="add --speculative-draft-model-quantization unquant",
        )
    if not la.draft_attention_backend and la.attention_backend in MLA_ONLY_BACKENDS:
        ctx.add(
            WARNING,
            "draft-attention-backend",
            f"the draft runs with the target's attention backend {la.attention_backend}, which serves MLA models "
            "only; the EAGLE-3 draft's layer is Llama attention (not verified on a GPU by eagle3-patches: expect a "
            "failure at start or wrong draft attention)",
            where="--attention-backend",
            found=f"--attention-backend {la.attention_backend}, no --speculative-draft-attention-backend",
            expected="a backend for the draft's attention",
            fix="add --speculative-draft-attention-backend fa3 (or flashinfer / triton)",
        )
    runs = ctx.report.facts["draft_runs_with"]
    ctx.add(
        INFO,
        "draft-runs-with",
        f"the draft runs with quantization {runs['quantization'] or 'none'} ({runs['quantization_from']}), "
        + (f"dtype {runs['dtype']} ({runs['dtype_from']}), " if runs["dtype"] else "")
        + f"attention backend {runs['attention_backend'] or 'auto'} ({runs['attention_backend_from']}), "
        f"context length {runs['context_length']}",
    )


def check_expected(ctx: Context) -> None:
    """The accept length the draft is expected to reach, which the watchdog compares the live one with: the
    launch's ``EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH``, else the draft config's field, and the flags it was
    measured at against the launch's."""
    la = ctx.launch
    if la.speculative_adaptive and base_release(ctx.version) < ADAPTIVE_STEPS_FROM:
        ctx.add(
            ERROR,
            "speculative-adaptive",
            f"sglang {base_release(ctx.version)} has no --speculative-adaptive: launch_server stops at its argument "
            "parsing",
            where="--speculative-adaptive",
            found=f"sglang {base_release(ctx.version)}",
            expected=f"sglang {ADAPTIVE_STEPS_FROM} or later",
            fix=f"drop --speculative-adaptive, or upgrade sglang to {ADAPTIVE_STEPS_FROM} or later",
        )
        return
    off = expected_accept.adaptive_turned_off(
        la.algorithm,
        la.eagle_topk,
        la.enable_dp_attention,
        la.enable_two_batch_overlap,
        multi_layer_eagle=la.enable_multi_layer_eagle,
        pdmux=la.enable_pdmux,
    )
    if la.speculative_adaptive and off:
        ctx.add(
            INFO,
            "speculative-adaptive",
            f"sglang turns --speculative-adaptive off for this launch ({off}) and runs fixed steps: the watchdog "
            "judges the accept length as on any server",
            where="--speculative-adaptive",
        )
    elif la.speculative_adaptive:
        ctx.add(
            INFO,
            "speculative-adaptive",
            "the watchdog judges no accept length on this server, neither the floor near 1.0 nor an expected "
            f"figure: {expected_accept.ADAPTIVE_STEPS}",
            where="--speculative-adaptive",
        )
        return
    var = settings.EXPECTED_ACCEPT_LENGTH
    stated = ctx.settings  # the launch's environment: the command's assignments over the one it inherits
    where = ctx.dcfg(expected_accept.FIELD)
    try:
        figure = expected_accept.from_config(ctx.draft_view.config, where=ctx.dcfg())
    except CheckpointError as exc:
        d = exc.diagnostic
        ctx.add(
            WARNING,
            "expected-accept-length",
            "the draft's expected accept length cannot be read: the watchdog compares the live one with nothing",
            where=where,
            found=d.found,
            expected=d.expected,
            fix=d.fix,
        )
        figure = None
    if stated.expected_accept_length is not None:
        figure = expected_accept.ExpectedAccept(
            stated.expected_accept_length, source=var, temperature=stated.expected_accept_temperature
        )
    elif problems := [p for p in stated.problems if p.startswith(f"{var}=")]:
        ctx.add(
            WARNING,
            "expected-accept-length",
            "the launch's expected accept length is not understood: the watchdog ignores it",
            where=var,
            found=problems[0],
            expected="an accept length above 1 and at most 64",
            fix="the figure the draft's publisher states, or `eagle3-patches measure-accept`'s",
        )
    if figure is None:
        return
    why = figure.not_comparable(la.num_steps, la.eagle_topk, la.num_draft_tokens)
    if why is not None:
        ctx.add(
            WARNING,
            "expected-accept-length",
            "the draft's expected accept length was measured at other flags than this launch's: the watchdog does "
            "not compare the live one with it",
            where=where,
            found=why,
            expected="the figure measured at the flags the server runs with",
            fix="serve at the flags it was measured at, or measure the draft at yours (`eagle3-patches "
            "measure-accept`)",
        )
        return
    ctx.add(
        INFO,
        "expected-accept-length",
        f"the watchdog compares the live accept length with the expected {figure.describe()}",
    )
