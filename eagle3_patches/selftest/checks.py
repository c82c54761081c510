"""The checks, one function each: what it makes stock and patched sglang do, and what counts as the bug and
as the fix.  The repository's behavioural tests call the same functions (``tests/patches``,
``tests/selftest``), so CI proves every CPU check on every change.

Every patch has at least one check, or a reason in :data:`NO_CHECK` (``tests/selftest/test_selftest.py`` makes
sure of it).  The CPU
checks run on any machine (on a CUDA device they run on the device, with the user's attention backend and
dtype); the ``cuda`` ones need a GPU: real CUDA graphs, real quantization kernels, NCCL.
"""

from __future__ import annotations

from ..testing.tiny_models import DRAFT_AUX_IDS, HIDDEN, NUM_LAYERS
from . import device_scenarios as ds
from . import scenarios as sc
from .base import Check, Finding, describe_error
from .checkpoints import LAYER_CHECK_IDS

CONFIGURED = [i + 1 for i in DRAFT_AUX_IDS]  # what sglang's target captures for them (before layer id + 1)
TOKENS = sum(len(p) for p in sc.PROMPTS)


# --------------------------------------------------------------------------- the EAGLE worker at fc
def kimi_fc_width(ctx) -> Finding:
    """Stock and patched: the real TpModelWorker + EAGLE worker on the tiny Kimi-K2.5, one prefill."""
    args = (ctx.path("kimi_k25"), ctx.path("draft"))
    stock = ctx.observe(sc.eagle_prefill_fc_widths, *args, overrides=ctx.overrides())
    patched = ctx.observe(sc.eagle_prefill_fc_widths, *args, overrides=ctx.overrides(), patches="all")
    want = [(TOKENS, 3 * HIDDEN)]

    if stock[0] == "ok":
        bug = stock[1]["fc_inputs"] != want
        stock_text = f"fc received {stock[1]['fc_inputs']} (target captured layers {stock[1]['layers_to_capture']})"
    else:
        missing = any(m in stock[1] for m in ("set_eagle3_layers_to_capture", "get_embed_and_head"))
        bug = True if missing and stock[0] == "AttributeError" else None
        stock_text = f"the EAGLE worker did not start: {describe_error(stock)}"
    if patched[0] != "ok":
        return Finding(False, f"the EAGLE worker did not start: {describe_error(patched)}", bug, stock_text,
                       observations={"stock": stock, "patched": patched})
    p = patched[1]
    fixed = p["fc_inputs"] == want and p["target_width"] == want[0] and p["layers_to_capture"] == CONFIGURED
    text = (f"target captured layers {p['layers_to_capture']} -> [{p['target_width'][0]}, {p['target_width'][1]}]; "
            f"fc received {p['fc_inputs']} (want {want}: 3 x hidden {HIDDEN})")
    return Finding(fixed, text, bug, stock_text, *patched.patch("kimi_k25_eagle3_delegation"),
                   {"stock": stock, "patched": patched})


def fc_skip(ctx) -> Finding:
    """--speculative-algorithm EAGLE with the EAGLE-3 draft: nothing captured; is fc skipped in silence?  One process:
    stock first, then the same workers with the patch set applied.  The algorithm guard, which would refuse the
    flag before any worker exists, is disabled (a fork-path install has it in sglang's source)."""
    seen = ctx.observe(sc.eagle_without_capture, ctx.path("deepseek_v3"), ctx.path("draft"), ctx.overrides(), True,
                       env={"EAGLE3_PATCHES_DISABLE": "eagle3_algorithm_guard"})  # also where it is in sglang's source
    if seen[0] != "ok":
        return Finding(False, f"the EAGLE worker did not start: {describe_error(seen)}", None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    bug = s["error"] is None and s["fc_inputs"] == []
    stock_text = ("H-wide states reached the draft; fc never ran, nothing raised" if bug else
                  f"fc inputs {s['fc_inputs']}, error {s['error'] or 'none'}")
    fixed = (p["error"] == "Eagle3CaptureError" and "--speculative-algorithm EAGLE3" in p["message"]
             and p["fc_inputs"] == [])
    patched_text = (f"refused: {describe_error((p['error'], p['message']))}" if p["error"] else
                    f"nothing raised; fc inputs {p['fc_inputs']}")
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("eagle3_fc_guard"), observations=seen[1])


# --------------------------------------------------------------------------- flag resolution (launcher)
def algorithm_guard(ctx) -> Finding:
    kimi, draft = ctx.path("kimi_k25"), ctx.path("draft")
    cases = {"EAGLE": (kimi, draft, "EAGLE"), "EAGLE3": (kimi, draft, "EAGLE3")}
    seen = ctx.observe(sc.stock_then_patched, sc.launcher_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    bug = stock["EAGLE"] == ("ok", "EAGLE")
    stock_text = ("--speculative-algorithm EAGLE with the EAGLE-3 draft accepted as EAGLE" if bug
                  else f"EAGLE with the EAGLE-3 draft: {describe_error(stock['EAGLE'])}")
    refused = patched["EAGLE"]
    fixed = (refused[0] == "Eagle3ConfigError" and "--speculative-algorithm EAGLE3" in refused[1]
             and patched["EAGLE3"] == ("ok", "EAGLE3"))
    patched_text = f"EAGLE refused ({describe_error(refused)}); EAGLE3 resolves to {patched['EAGLE3'][1]}"
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("eagle3_algorithm_guard"), observations=seen[1])


def capability_outcomes(cases: dict, overrides: dict) -> dict:
    """Child side of :func:`target_capability`: the launcher outcomes, and which capture hooks each target's
    sglang class lacks."""
    return {"outcomes": sc.launcher_outcomes(cases, overrides),
            "missing": {name: sc.missing_capture_hooks(target) for name, (target, _, _) in cases.items()}}


def target_capability(ctx) -> Finding:
    draft = ctx.path("draft")
    cases = {"no_capture": (ctx.path("no_capture_target"), draft, "EAGLE3"), "kimi": (ctx.path("kimi_k25"), draft, "EAGLE3"),
             "deepseek": (ctx.path("deepseek_v3"), draft, "EAGLE3")}
    seen = ctx.observe(sc.stock_then_patched, capability_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    missing = stock["missing"]["no_capture"]
    if not missing:
        bug, stock_text = None, "GPT2LMHeadModel has the EAGLE-3 capture hooks on this release: no tiny target lacks them"
    else:
        bug = stock["outcomes"]["no_capture"][0] == "ok"
        stock_text = (f"the launcher accepted EAGLE3 with a GPT2LMHeadModel target (no {', '.join(missing)}): every rank "
                      "would fail later" if bug else f"refused: {describe_error(stock['outcomes']['no_capture'])}")
    refused = patched["outcomes"]["no_capture"]
    # Eagle3TargetError; the fork-path diff (sglang's own source, no eagle3_patches import) names its class Eagle3ConfigError
    ours = refused[0] in ("Eagle3TargetError", "Eagle3ConfigError") and str(refused[1]).startswith("eagle3-patches:")
    fixed = ((ours and all(m in refused[1] for m in missing)) if missing else True) and all(
        patched["outcomes"][n] == ("ok", "EAGLE3") for n in ("kimi", "deepseek"))
    patched_text = (f"no-capture target refused in the launcher ({describe_error(refused)}); " if missing else "") + (
        f"Kimi-K2.5 and DeepSeek-V3 targets: {patched['outcomes']['kimi'][0]}, {patched['outcomes']['deepseek'][0]}")
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("eagle3_target_capability"), observations=seen[1])


def fusion(ctx) -> Finding:
    seen = ctx.observe(sc.fusion_decisions, ctx.path("kimi_k25"), ctx.path("deepseek_v3"), ctx.path("draft"),
                       not ctx.on_gpu, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    out = seen[1]
    where = "an H200 (sm90) stood in for this machine's GPU" if out["stand_in_gpu"] else "this GPU's own hardware facts"
    stock_on = [n for n, d in out["stock"].items() if d["fusion"]]
    if stock_on:
        bug, stock_text = True, f"EAGLE3 at TP 2 ({where}): all-reduce fusion on for {', '.join(stock_on)}"
    else:
        bug, stock_text = None, f"sglang did not enable the fusion ({where}): the bug cannot show here"
    p = out["patched"]
    off = [c for c in p if "eagle3_tp2" in c]
    silent = ["kimi_none_tp2", "kimi_eagle_tp2", "kimi_eagle_tp2_explicit"]
    fixed = (all(not p[c]["fusion"] for c in off)
             and all(len(p[c]["logs"]) == 1 and "all-reduce fusion turned off" in p[c]["logs"][0][1] for c in off if stock_on)
             and all(p[c]["logs"] == [] for c in silent) and out["revert_identity"])
    patched_text = (f"fusion off with one warning for {', '.join(off)}; left alone (no log) for TP 2 without "
                    "EAGLE-3 and for EAGLE")
    if not fixed:
        patched_text = f"decisions: { {c: (p[c]['fusion'], len(p[c]['logs'])) for c in p} }"
    return Finding(fixed, patched_text, bug, stock_text, out["state"], out["reason"], observations=out)


# --------------------------------------------------------------------------- the draft's loader
#: the drafts the strict-loading check loads, and what a bad one must be refused for (a needle of the message)
STRICT_DRAFTS = ("layers0_draft", "midlayer_draft", "full_vocab_draft", "unknown_key_draft", "missing_tensor_draft",
                 "d2t_absolute_draft", "d2t_twice_draft")
REFUSED_FOR = {"unknown_key_draft": "input_norm.weight", "missing_tensor_draft": "mlp.down_proj.weight",
               "d2t_absolute_draft": "absolute target ids", "d2t_twice_draft": "arange subtracted twice"}


def strict_loading(ctx) -> Finding:
    """Every draft of :data:`STRICT_DRAFTS` into a real draft ``ModelRunner``, stock and patched."""
    paths = {n: ctx.path(n) for n in STRICT_DRAFTS}
    target = ctx.path("deepseek_v3")
    stock = ctx.observe(sc.load_drafts_to_host, target, list(paths.values()), ctx.overrides())
    patched = ctx.observe(sc.load_drafts_to_host, target, list(paths.values()), ctx.overrides(), patches="all")
    obs = {"stock": stock, "patched": patched, "paths": paths}
    if stock[0] != "ok" or patched[0] != "ok":
        failed = stock if stock[0] != "ok" else patched
        return Finding(False, f"the draft runner could not be built: {describe_error(failed)}", None, observations=obs)
    s, p = dict(zip(STRICT_DRAFTS, stock[1])), dict(zip(STRICT_DRAFTS, patched[1]))
    obs.update(stock_by_name=s, patched_by_name=p)

    def exact(result: dict, name: str) -> bool:
        return result["ok"] and sc.bit_exact_mismatches(result["params"], paths[name]) == []

    bugs = []
    if s["layers0_draft"]["ok"] and not exact(s["layers0_draft"], "layers0_draft"):
        left = len(sc.bit_exact_mismatches(s["layers0_draft"]["params"], paths["layers0_draft"]))
        bugs.append(f"a layers.0.* draft loaded with {left} parameters left at their initial values")
    silent = [n for n in REFUSED_FOR if s[n]["ok"]]
    if silent:
        bugs.append(f"{len(silent)} of {len(REFUSED_FOR)} bad drafts (unknown tensor, missing tensor, d2t holding target "
                    "ids, d2t offset twice) loaded without a word")
    stock_text = "; ".join(bugs) or "layers.0.* loaded bit-exactly and every bad draft was refused"
    not_refused = [n for n, needle in REFUSED_FOR.items()
                   if p[n]["ok"] or p[n]["type"] != "Eagle3ConfigError" or needle not in p[n]["message"]]
    inexact = [n for n in ("layers0_draft", "midlayer_draft") if not exact(p[n], n)]
    full_vocab = p["full_vocab_draft"]["ok"] and p["full_vocab_draft"]["hot_token_id"] is None
    fixed = not not_refused and not inexact and full_vocab
    patched_text = (f"layers.0.* and midlayer.* drafts {'bit-exact' if not inexact else 'NOT bit-exact: ' + ', '.join(inexact)}"
                    f"; full-vocabulary draft {'loads' if full_vocab else 'does NOT load'}; bad drafts "
                    f"{'refused, naming the tensor' if not not_refused else 'NOT refused: ' + ', '.join(not_refused)}")
    return Finding(fixed, patched_text, bool(bugs), stock_text, *patched.patch("eagle3_draft_strict_loading"),
                   observations=obs)


# --------------------------------------------------------------------------- layer ids at the target
CAPTURE_CASES = {"good": [1, 2, 3], "last": [1, 2, NUM_LAYERS - 1], "duplicate": [1, 1, 3]}


def aux_validation(ctx) -> Finding:
    """One process: the cases on stock sglang, then on the same model with the patch set applied (the setter and
    the forward are what the fix changes)."""
    seen = ctx.observe(sc.capture_outcomes, ctx.path("deepseek_v3"), CAPTURE_CASES, ctx.overrides(), True)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    lost = [n for n in ("last", "duplicate") if s[n][0] == "ok" and s[n][1][-1] < 3 * HIDDEN]
    bug = bool(lost)
    stock_text = (f"ids {CAPTURE_CASES['last']} and {CAPTURE_CASES['duplicate']} on a {NUM_LAYERS}-layer target: "
                  f"{s['last'][1]} and {s['duplicate'][1]}, no error" if bug else f"last {s['last']}, duplicate {s['duplicate']}")
    fixed = (p["good"] == ("ok", (5, 3 * HIDDEN)) and p["last"][0] == "Eagle3ConfigError"
             and "cannot be captured" in p["last"][1] and p["duplicate"][0] == "Eagle3ConfigError")
    patched_text = (f"valid ids capture {p['good'][1]}; {CAPTURE_CASES['last']}: {describe_error(p['last'])}; "
                    f"{CAPTURE_CASES['duplicate']}: {p['duplicate'][0]}")
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("aux_capture_validation"), observations=seen[1])


def layer_ids(ctx) -> Finding:
    seen = ctx.observe(sc.captured_layers, ctx.path("deepseek_v3"), ctx.path("layer_ids_marked_draft"),
                       ctx.path("layer_ids_unmarked_draft"), ctx.overrides(), patches="all")
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    out = seen[1]
    ids = list(LAYER_CHECK_IDS)
    bug = out["stock"]["outputs_of"] != ids
    stock_text = f"draft ids {ids} (output of layer i) captured the outputs of layers {out['stock']['outputs_of']}"
    fixed = out["patched"]["outputs_of"] == ids and out["patched"]["width"] == len(ids) * HIDDEN
    patched_text = (f"captured exactly the outputs of layers {out['patched']['outputs_of']} "
                    f"({out['patched']['width']} wide; compared with each decoder layer's output)")
    return Finding(fixed, patched_text, bug, stock_text, out["state"], out["reason"], observations=out)


# --------------------------------------------------------------------------- CUDA graph capture order
def graph_capture_order(ctx) -> Finding:
    args = (ctx.path("deepseek_v3"), ctx.path("draft"))
    stock = ctx.observe(sc.graph_capture_sequence, *args, False)
    patched = ctx.observe(sc.graph_capture_sequence, *args, True)
    obs = {"stock": stock, "patched": patched}
    if stock[0] != "ok" or patched[0] != "ok":
        return Finding(False, describe_error(stock if stock[0] != "ok" else patched), None, observations=obs)
    s, p = stock[1], patched[1]
    bug = s["at_capture"] != [s["eager"]]
    stock_text = f"graphs captured layers {s['at_capture']}, eager runs capture {s['eager']}"
    fixed = (p["at_capture"] == [CONFIGURED] and p["eager"] == CONFIGURED and p["at_recapture"] == CONFIGURED
             and p["eager_after_recapture"] == CONFIGURED and not p["shadow_left"])
    patched_text = (f"graphs captured layers {p['at_capture']}, eager {p['eager']}, after a re-capture "
                    f"{p['at_recapture']} / {p['eager_after_recapture']} (configured {CONFIGURED})")
    return Finding(fixed, patched_text, bug, stock_text, p["state"], p["reason"], observations=obs)


# --------------------------------------------------------------------------- ranks
def load_rank(rank: int, world_size: int, port: int, target: str, overrides: dict) -> dict:
    """One TP rank building the target's model runner: did it start, and its rank_consistency state."""
    from eagle3_patches.testing import sglang_harness as h

    sc.to_log()
    overrides = dict(overrides)
    overrides.setdefault("dtype", "float32")
    sa = h.server_args(target, tp_size=world_size, **overrides)
    try:
        h.model_runner(sa, tp_rank=rank, nccl_port=port)
    except Exception as exc:  # noqa: BLE001 - the observation
        return {"rank": rank, "error": type(exc).__name__, "message": str(exc), "states": sc.patch_states()}
    return {"rank": rank, "error": None, "message": "", "states": sc.patch_states()}


def rank_consistency(ctx) -> Finding:
    target = ctx.path("deepseek_v3")
    other = "eagle3_fc_guard"
    stock = ctx.observe_ranks(load_rank, 2, target, ctx.overrides(), patches=["all", "all"],
                              env=[{"EAGLE3_PATCHES_DISABLE": "rank_consistency"},
                                   {"EAGLE3_PATCHES_DISABLE": f"rank_consistency,{other}"}])
    patched = ctx.observe_ranks(load_rank, 2, target, ctx.overrides(), patches=["all", "all"],
                                env=[{}, {"EAGLE3_PATCHES_DISABLE": other}])
    bug = all(r["error"] is None for r in stock)
    stock_text = (f"rank 1 without {other}, rank 0 with it: both ranks started" if bug else
                  "; ".join(f"rank {r['rank']}: {r['error']}" for r in stock))
    fixed = all(r["error"] == "Eagle3ConfigError" and other in r["message"] for r in patched)
    patched_text = ("every rank refused to start, naming the patch that differs" if fixed else
                    "; ".join(f"rank {r['rank']}: {r['error'] or 'started'}" for r in patched))
    return Finding(fixed, patched_text, bug, stock_text, patched[0]["states"].get("rank_consistency"),
                   observations={"stock": stock, "patched": patched})


# --------------------------------------------------------------------------- GPU only
def _tolerance(dtype: str) -> float:
    """Relative difference allowed between two TP layouts of the same computation (summation order)."""
    return 1e-3 if "32" in dtype else 2e-2


def graph_replay(ctx) -> Finding:
    args = (ctx.path("deepseek_v3"), ctx.path("draft"), ctx.overrides())
    stock = ctx.observe(ds.graph_replay_vs_eager, *args)
    patched = ctx.observe(ds.graph_replay_vs_eager, *args, patches="all")

    def verdict(seen) -> tuple[bool | None, str]:
        if seen[0] != "ok":
            return None, describe_error(seen)
        out = seen[1]
        then = f"; then {out['error']}" if out["error"] else ""
        if not out["compared"]:
            return None, f"no target forward ran as a CUDA graph replay{then}"
        differ = [c for c in out["compared"] if c["graph_layers"] != c["eager_layers"]]
        first = (differ or out["compared"])[0]
        worst = max(max(c["relative_difference"], default=0.0) for c in out["compared"])
        return bool(differ), (f"{len(out['compared'])} graph replays ({first['mode']}, {out['attention_backend']}, "
                              f"{out['dtype']}) vs eager on the same batch: the replay's aux states are the outputs of "
                              f"layers {first['graph_layers']}, the eager ones of {first['eager_layers']} "
                              f"({len(differ)} replays differ; largest relative difference {worst:.3g}){then}")

    bug, stock_text = verdict(stock)
    differs, patched_text = verdict(patched)
    widths = sorted({s[-1] for s in patched[1]["fc_inputs"]}) if patched[0] == "ok" else []
    fixed = differs is False and widths == [3 * HIDDEN] and not patched[1]["error"]
    if patched[0] == "ok":
        patched_text += f"; fc inputs {widths} wide"
    return Finding(fixed, patched_text, bug, stock_text, *patched.patch("cuda_graph_capture_order"),
                   observations={"stock": stock, "patched": patched})


def draft_extend_graph(ctx) -> Finding:
    target, draft, no_aux = ctx.path("deepseek_v3"), ctx.path("draft"), ctx.path("no_aux_draft")
    good = ctx.observe(ds.draft_extend_graphs, target, draft, ctx.overrides(), patches="all")
    stock = ctx.observe(ds.draft_extend_graphs, target, no_aux, ctx.overrides())
    refused = ctx.observe(ds.draft_extend_graphs, target, no_aux, ctx.overrides(), patches="all")
    obs = {"good": good, "stock_no_aux": stock, "patched_no_aux": refused}
    if stock[0] != "ok" or good[0] != "ok" or refused[0] != "ok":
        return Finding(False, describe_error(next(x for x in (good, stock, refused) if x[0] != "ok")), None, observations=obs)
    g, s, r = good[1], stock[1], refused[1]
    bug = s["error"] is None and s["fc_inputs"] == []
    stock_text = ("draft-extend graphs captured from an H-wide buffer with use_aux_hidden_state false: fc never ran"
                  if bug else f"use_aux_hidden_state false: {s['error'] or 'captured'}, fc inputs {sorted(set(s['fc_inputs']))}")
    good_ok = g["error"] is None and g["captured"] and {x[-1] for x in g["fc_inputs"]} == {3 * HIDDEN} and g["buffer"] in (None, 3 * HIDDEN)
    ours = r["error"] == "Eagle3CaptureError" and "Capture cuda graph failed" not in r["message"]
    patched_text = (f"draft-extend graphs captured ({g['runner']}, buffer {g['buffer']}, fc inputs "
                    f"{sorted({x[-1] for x in g['fc_inputs']})} wide); use_aux_hidden_state false: "
                    f"{describe_error((r['error'], r['message'])) if r['error'] else 'NOT refused'}")
    if g["error"]:
        patched_text = f"the correct draft's graphs failed: {describe_error((g['error'], g['message']))}"
    return Finding(good_ok and ours, patched_text, bug, stock_text, *refused.patch("eagle3_fc_guard"), observations=obs)


def dump_graph_capture(ctx) -> Finding:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="eagle3-selftest-dump-") as out_dir:
        env = {"EAGLE3_PATCHES_DUMP_DIR": out_dir, "EAGLE3_PATCHES_DUMP_LAYER_IDS": ",".join(map(str, DRAFT_AUX_IDS))}
        seen = ctx.observe(ds.dump_under_graph_capture, ctx.path("deepseek_v3"), ctx.overrides(), patches="all", env=env)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    out = seen[1]
    if out["error"]:
        return Finding(False, f"the target did not start with the dump on: {describe_error((out['error'], out['message']))}",
                       None, observations=out)
    prompts = 4 + 3
    warned = any("--disable-cuda-graph" in w for w in out["warnings"])
    fixed = (out["graphs"] and out["rows_after_capture"] == 0 and out["rows_after_prefill"] == prompts
             and out["rows_after_decode"] == prompts and warned)
    text = (f"DECODE graphs captured with the dump on; rows after capture {out['rows_after_capture']}, after a served "
            f"prefill {out['rows_after_prefill']} (want {prompts}), after a graph-replayed decode step "
            f"{out['rows_after_decode']}; {'warned' if warned else 'did NOT warn'} that graph replays are not recorded")
    return Finding(fixed, text, None, "an opt-in instrument of this library: nothing to observe on stock sglang",
                   *seen.patch("hidden_state_dump"), observations=out)


def quantized_loading(ctx) -> Finding:
    target = ctx.path("deepseek_v3")
    drafts = [(ctx.path("midlayer_draft"), {"speculative_draft_model_quantization": "fp8"}), ctx.path("fp8_draft")]
    labels = ["online fp8 (--quantization fp8)", "fp8 checkpoint"]
    stock = ctx.observe(sc.load_drafts_to_host, target, drafts, ctx.overrides())
    patched = ctx.observe(sc.load_drafts_to_host, target, drafts, ctx.overrides(), patches="all")
    obs = {"stock": stock, "patched": patched}
    if stock[0] != "ok" or patched[0] != "ok":
        return Finding(False, describe_error(stock if stock[0] != "ok" else patched), None, observations=obs)

    parts, fixed = [], True
    for label, s, p in zip(labels, stock[1], patched[1]):
        ok = (p["ok"] == s["ok"]) and not sc.differing_tensors(s.get("loaded"), p.get("loaded")) and (
            not s["ok"] or not sc.differing_tensors(s["params"], p["params"]))
        fixed &= ok
        parts.append(f"{label}: stock {'loaded' if s['ok'] else s.get('type')}, patched "
                     f"{'loaded, identical' if ok else (p.get('type') or 'loaded, DIFFERENT')}")
    return Finding(fixed, "; ".join(parts), None, "stock sglang serves these drafts; the patch set must load them the same",
                   *patched.patch("eagle3_draft_strict_loading"), observations=obs)


def tp2_nccl(ctx) -> Finding:
    target = ctx.path("deepseek_v3")
    ov = ctx.overrides(disable_cuda_graph=True)
    reference = ctx.observe(ds.tp_capture, 0, 1, 0, target, ov, patches="all")
    if reference[0] != "ok":
        return Finding(False, f"the TP 1 reference did not run: {describe_error(reference)}", None)
    ref = reference[1]["aux"].float()
    tol = _tolerance(ctx.dtype or "bfloat16")

    def compare(ranks: list) -> tuple[bool, str]:
        diffs = [float((r["aux"].float() - ref).abs().max() / ref.abs().max()) for r in ranks]
        same = all(r["aux"].shape == ref.shape for r in ranks) and max(diffs) <= tol
        return same, (f"TP 2 over {ranks[0]['backend'] or 'NCCL'} (fusion {'on' if ranks[0]['fusion'] else 'off'}): aux "
                      f"states vs TP 1, largest relative difference {max(diffs):.3g} (tolerance {tol:g})")

    stock = ctx.observe_ranks(ds.tp_capture, 2, target, ov, patches=[None, None], env=[{}, {}])
    patched = ctx.observe_ranks(ds.tp_capture, 2, target, ov, patches=["all", "all"], env=[{}, {}])
    stock_same, stock_text = compare(stock)
    fixed, patched_text = compare(patched)
    bug = (not stock_same) if stock[0]["fusion"] else None
    if bug is None:
        stock_text += ": sglang did not enable the fusion on this GPU, the bug cannot show here"
    return Finding(fixed, patched_text, bug, stock_text, patched[0]["states"].get("tp_allreduce_fusion_capture"),
                   observations={"reference": reference, "stock": stock, "patched": patched})


# --------------------------------------------------------------------------- multimodal wrapper targets
def _wrapper(patch: str, targets: tuple[str, ...]):
    def check(ctx) -> Finding:
        """Each tiny target of the patch's classes through the real EAGLE worker, stock and patched."""
        want, bugs, stock_text, fixed_all, texts, state = [(5, 3 * HIDDEN)], [], [], True, [], (None, "")
        for name in targets:
            args = (ctx.path(name), ctx.path("draft"), ctx.overrides())
            stock = ctx.observe(sc.wrapper_eagle3_prefill, *args)
            patched = ctx.observe(sc.wrapper_eagle3_prefill, *args, patches=[patch])
            missing = stock[0] != "ok" and any(h in str(stock[1]) for h in ("set_eagle3_layers_to_capture", "get_embed_and_head"))
            bugs.append(missing)
            stock_text.append(f"{name}: " + ("fails at start without set_eagle3_layers_to_capture" if missing else
                                             describe_error(stock) if stock[0] != "ok" else f"fc {stock[1]['fc_inputs']}"))
            ok = patched[0] == "ok" and patched[1]["fc_inputs"] == want and patched[1]["layers_to_capture"] == CONFIGURED
            fixed_all &= ok
            texts.append(f"{name}: " + (f"fc received {patched[1]['fc_inputs']} from layers {patched[1]['layers_to_capture']}"
                                        if patched[0] == "ok" else describe_error(patched)))
            state = patched.patch(patch)
        return Finding(fixed_all, "; ".join(texts), all(bugs), "; ".join(stock_text), *state)

    return check


def speculators_served(ctx) -> Finding:
    """The speculators fixture (written by the real speculators library) as the draft itself, and converted."""
    target = ctx.path("deepseek_v3")
    drafts = [ctx.path("speculators_draft"), ctx.path("speculators_converted")]
    stock = ctx.observe(sc.load_drafts_to_host, target, drafts[:1], ctx.overrides())
    patched = ctx.observe(sc.load_drafts_to_host, target, drafts, ctx.overrides(), patches="all")
    bug = stock[0] != "ok" or not stock[1][0]["ok"]
    stock_text = ("sglang cannot read the speculators config" if bug else "sglang loaded the speculators draft")
    if patched[0] != "ok":
        return Finding(False, describe_error(patched), bug, stock_text)
    direct, converted = patched[1]
    diff = sc.differing_tensors(direct.get("params"), converted.get("params")) if direct["ok"] and converted["ok"] else None
    fixed = diff == []
    text = ("served directly: the same parameters as the converted draft, bit for bit" if fixed else
            f"direct {direct.get('message') or 'loaded'}; differs from converted in {diff}")
    return Finding(fixed, text, bug, stock_text, *patched.patch("speculators_draft_config"))


# --------------------------------------------------------------------------- the list
CHECKS: tuple[Check, ...] = (
    Check("kimi_k25_eagle3_delegation", "real TpModelWorker + EAGLE worker on the tiny Kimi-K2.5: [tokens, 3 x hidden] reaches fc",
          kimi_fc_width, patch="kimi_k25_eagle3_delegation"),
    Check("layer_id_convention", "the configured aux layer ids capture exactly those layers' outputs", layer_ids,
          patch="layer_id_convention"),
    Check("eagle3_algorithm_guard", "--speculative-algorithm EAGLE with an EAGLE-3 draft is refused at start",
          algorithm_guard, patch="eagle3_algorithm_guard"),
    Check("eagle3_fc_guard", "H-wide states at the draft (nothing captured) raise instead of skipping fc", fc_skip,
          patch="eagle3_fc_guard"),
    Check("eagle3_target_capability", "EAGLE3 with a target that cannot capture is refused in the launcher",
          target_capability, patch="eagle3_target_capability"),
    Check("eagle3_draft_strict_loading", "a layers.0.* draft loads bit-exactly; unknown / missing tensors and bad d2t are refused",
          strict_loading, patch="eagle3_draft_strict_loading"),
    Check("aux_capture_validation", "uncapturable or duplicate layer ids are refused when they are set", aux_validation,
          patch="aux_capture_validation", runs_on="<0.5.13",
          outside="the ids mean something else from 0.5.13 (layer_id_convention's check covers them)"),
    Check("tp_allreduce_fusion_capture", "TP > 1 + EAGLE3: flashinfer all-reduce fusion is turned off", fusion,
          patch="tp_allreduce_fusion_capture", runs_on="<0.5.14",
          outside="from 0.5.14 sglang captures after the all-reduce, so the fusion flag no longer matters (on two GPUs "
                  "`tp2_nccl` compares the states themselves)"),
    Check("cuda_graph_capture_order", "CUDA graphs are captured with the configured aux layers (CPU recreation)",
          graph_capture_order, patch="cuda_graph_capture_order", needs=("cpu",), instead="cuda_graph_replay",
          runs_on="<0.5.11", outside="fixed upstream in 0.5.11 (the ids are set before graph capture); the CPU "
          "recreation drives 0.5.8-0.5.10's call sequence, on a GPU `cuda_graph_replay` observes any release"),
    Check("rank_consistency", "TP 2: ranks with different patch sets refuse to start instead of serving", rank_consistency,
          patch="rank_consistency", needs=("tp2",)),
    Check("cuda_graph_replay", "CUDA graphs on: aux states from graph replay equal the eager ones for the same batch",
          graph_replay, patch="cuda_graph_capture_order", needs=("cuda",)),
    Check("draft_extend_cuda_graph", "draft-extend CUDA graphs capture 3 x hidden into fc; use_aux_hidden_state false "
          "is refused in our words", draft_extend_graph, patch="eagle3_fc_guard", needs=("cuda",)),
    Check("hidden_state_dump_graph_capture", "the opt-in hidden-state dump under CUDA-graph capture: capture works, "
          "served rows only", dump_graph_capture, patch="hidden_state_dump", needs=("cuda",), runs_on="<0.5.13",
          outside="the dump is written for sglang 0.5.8-0.5.12's capture path (its own releases)"),
    Check("quantized_draft_loading", "fp8 drafts load as stock sglang loads them, real kernels", quantized_loading,
          patch="eagle3_draft_strict_loading", needs=("cuda",)),
    Check("tp2_nccl", "TP 2 over NCCL: aux states equal TP 1", tp2_nccl, patch="tp_allreduce_fusion_capture",
          needs=("cuda", "2gpu")),
    Check("kimi_vl_eagle3_delegation", "Kimi-VL (tiny) through the real EAGLE worker: [tokens, 3 x hidden] reaches fc",
          _wrapper("kimi_vl_eagle3_delegation", ("kimi_vl",)), patch="kimi_vl_eagle3_delegation"),
    Check("qwen3_vl_eagle3_capture", "Qwen3-VL dense and MoE (tiny) through the real EAGLE worker: 3 x hidden reaches fc",
          _wrapper("qwen3_vl_eagle3_capture", ("qwen3_vl", "qwen3_vl_moe")), patch="qwen3_vl_eagle3_capture",
          runs_on="<0.5.11", outside="sglang 0.5.11 captures on Qwen3-VL itself"),
    Check("speculators_draft_config", "a speculators-format draft served directly loads the parameters of its conversion",
          speculators_served, patch="speculators_draft_config"),
)

BY_NAME = {c.name: c for c in CHECKS}

#: patches and instruments without a check of their own, and why
NO_CHECK = {"eagle3_probe": "an opt-in diagnostic that fixes nothing; tests/probe covers it in the repository",
            "accept_watchdog": "it reports at run time and changes nothing; tests/unit and tests/e2e cover it in the repository"}


def uncovered() -> dict[str, str]:
    """Every patch and instrument of the library no check observes, with the reason the report gives."""
    import eagle3_patches

    covered = {c.patch for c in CHECKS}
    return {name: NO_CHECK.get(name, "no selftest check observes this patch yet (eagle3_patches/selftest/checks.py)")
            for name in eagle3_patches.known_names() if name not in covered}
