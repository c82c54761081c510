"""The probe's diagnosis: what each record of the EAGLE-3 path says, and the first hop where it goes wrong.

The probe (:mod:`.eagle3_probe`) writes one record per process, hop and forward mode.  The hops, in the
order the data flows:

* ``target_output``: ``logits_output.hidden_states`` of the target forward: ``k x H`` wide when
  the target captures its ``k`` aux layers (``H`` = the target's hidden size), ``H`` wide (the
  final normed state) when it captures nothing;
* ``draft_input``: ``spec_info.hidden_states`` entering the draft forward, and whether the
  draft's ``fc`` ran on it.  In the draft's extend modes (``extend`` after prefill,
  ``draft_extend`` after verify) these are the target's states and must match
  ``fc.in_features``; in ``decode`` they are the draft's own ``H``-wide states and ``fc`` is
  skipped by design.
* ``draft_image_rows``: once per process, the draft's prefill of a batch with images (mode ``extend``): for each
  sequence, whether the embedding row the draft's first layer gets at its last position is the embedding of the
  token there (the token just sampled), and which sequences carry images.

:func:`analyse` judges records in a server (the probe's own log line, the watchdog's diagnosis) and offline
(``eagle3-patches probe-report``, :mod:`eagle3_patches.probe_report`, which reads the files).  Never imports
sglang or torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..diagnostic import ERROR, Diagnostic

#: the record schema: its version, and the two hops the probe records
SCHEMA = 1
TARGET = "target_output"
DRAFT = "draft_input"
IMAGE_ROWS = "draft_image_rows"

#: modes in which the target's stored states are handed to the draft
TARGET_FEEDING_MODES = frozenset({"extend", "mixed", "target_verify"})
#: draft modes whose input is the target's states (fc must run on them)
DRAFT_FED_MODES = frozenset({"extend", "mixed", "draft_extend", "draft_extend_v2"})

#: the order the data flows through one prefill and one decode step
PATH_ORDER = {
    (TARGET, "extend"): 0,
    (TARGET, "mixed"): 0,
    (DRAFT, "extend"): 1,
    (DRAFT, "mixed"): 1,
    (DRAFT, "decode"): 2,
    (TARGET, "target_verify"): 3,
    (DRAFT, "draft_extend"): 4,
    (DRAFT, "draft_extend_v2"): 4,
    (TARGET, "decode"): 5,
}

SPEC_FIX_EAGLE3 = "launch with --speculative-algorithm EAGLE3"


def hop_of(problem: Diagnostic) -> tuple[str, str]:
    """(hop, mode) of a probe diagnostic."""
    return problem.context["hop"], problem.context["mode"]


# ---------------------------------------------------------------------- judging one record
def judge(rec: dict, context: dict | None = None) -> list[Diagnostic]:
    """What is wrong with one probe record.

    ``context``: the other records of the same process, ``{(hop, mode): record}``, used for the
    expected width (the draft's ``fc.in_features``) and for the cause of a draft-side symptom.
    """
    context = context or {}
    hop = rec.get("hop")
    problems: list[Diagnostic] = []
    if hop == TARGET:
        p = _judge_target(rec, context)
        if p:
            problems.append(p)
    elif hop == DRAFT:
        p = _judge_draft(rec, context)
        if p:
            problems.append(p)
    elif hop == IMAGE_ROWS:
        p = _judge_image_rows(rec)
        if p:
            problems.append(p)
    stats = rec.get("stats") or {}
    if stats.get("nan") or stats.get("inf"):
        bad = " and ".join(k.upper() if k == "nan" else "Inf" for k in ("nan", "inf") if stats.get(k))
        where = "at the target's output" if hop == TARGET else "entering the draft"
        problems.append(
            _problem(
                rec,
                "nan",
                f"{bad} in the hidden states {where}",
                found=f"{bad} in a [{rec.get('tokens')}, {rec.get('width')}] {rec.get('dtype')} tensor",
                expected="finite values",
                cause="the states are already broken here: if the target output of the same mode is finite, they went "
                "wrong in between; a bfloat16 model under the Triton interpreter (CPU) gives NaN; otherwise check the "
                "weights (eagle3-patches doctor)",
                fix="on CPU run float32 (--dtype float32); compare with the target_output record of the same mode",
            )
        )
    return problems


def _draft_record(context: dict) -> dict | None:
    for mode in ("extend", "draft_extend", "mixed", "draft_extend_v2", "decode"):
        r = context.get((DRAFT, mode))
        if r and r.get("fc_in_features"):
            return r
    return None


def _target_record(context: dict, mode: str | None = None) -> dict | None:
    for m in ([mode] if mode else []) + ["extend", "mixed", "target_verify"]:
        r = context.get((TARGET, m))
        if r:
            return r
    return None


def _expected_target_width(rec: dict, context: dict) -> tuple[int | None, str]:
    draft = _draft_record(context)
    if draft and draft.get("fc_in_features"):
        return int(draft["fc_in_features"]), "the draft's fc.in_features"
    exp = rec.get("expected_width")
    if exp:
        return int(exp), rec.get("expected_from") or "len(aux ids) x hidden"
    return None, ""


def _judge_target(rec: dict, context: dict) -> Diagnostic | None:
    if rec.get("mode") not in TARGET_FEEDING_MODES:
        return None
    width, hidden = rec.get("width"), rec.get("hidden_size")
    expected, source = _expected_target_width(rec, context)
    if width is None or not expected or width == expected:
        return None
    cause, fix, doctor = _target_cause(rec, expected)
    states = _states(width, hidden)
    return _problem(
        rec,
        "width",
        f"the target stored {width}-wide hidden states for the draft instead of {expected}",
        found=f"width {width} ({states})",
        expected=f"{expected} ({source}"
        + (f" = {expected // hidden} x hidden {hidden})" if hidden and expected % hidden == 0 else ")"),
        cause=cause,
        fix=fix,
        doctor=doctor,
    )


def _states(width: int | None, hidden: int | None) -> str:
    if width is None or not hidden:
        return "?"
    if width % hidden == 0:
        n = width // hidden
        return f"{n} x hidden {hidden}" if n != 1 else f"= hidden {hidden}: one layer's width"
    return f"{width / hidden:.2f} x hidden {hidden}"


def _target_cause(rec: dict, expected: int) -> tuple[str, str, list[str]]:
    width, hidden = rec.get("width"), rec.get("hidden_size") or 0
    algo = (rec.get("algorithm") or "").upper()
    capture = rec.get("capture_aux_hidden_states")
    layers = rec.get("layers_to_capture") or []
    k = expected // hidden if hidden and expected % hidden == 0 else None
    if not capture or not layers:
        if algo in ("EAGLE", "NEXTN"):
            return (
                f"target not capturing: --speculative-algorithm {algo} with an EAGLE-3 draft; sglang sets up the aux "
                "capture only for EAGLE3, so the target hands over its final normed H-wide state, the draft's fc is "
                "skipped and its lm_head is replaced by the target's (accept length ~1.0)",
                SPEC_FIX_EAGLE3
                + " (eagle3_algorithm_guard refuses EAGLE with an EAGLE-3 draft at start unless disabled)",
                ["algorithm-eagle-with-eagle3-draft"],
            )
        if rec.get("use_aux_hidden_state") is False:
            return (
                "target not capturing: the draft config sets eagle_config.use_aux_hidden_state to false",
                "set eagle_config.use_aux_hidden_state to true in the draft's config.json",
                ["aux-disabled"],
            )
        if algo == "EAGLE3":
            model = rec.get("model") or "the target"
            return (
                "target not capturing although the algorithm is EAGLE3: set_eagle3_layers_to_capture never reached "
                "the "
                f"language model that runs the layers of {model} (a wrapper such as Kimi-K2.5's "
                "KimiK25ForConditionalGeneration on sglang 0.5.9 without delegation, or a hand-written delegation that "
                "sets the flag on the wrapper only)",
                "launch under `eagle3-patches run` (kimi_k25_eagle3_delegation), or use sglang >= 0.5.10 for Kimi-K2.5",
                ["kimi-k25-delegation"],
            )
        return (
            f"target not capturing: --speculative-algorithm {algo or 'none'} does not make the target capture aux "
            "layers",
            SPEC_FIX_EAGLE3,
            ["algorithm-eagle-with-eagle3-draft"],
        )
    if hidden and width is not None and width % hidden == 0:
        got = width // hidden
        if k is not None and len(layers) != k and got == len(layers):
            return (
                f"the target captures {len(layers)} layers ({layers}) but the draft's fc takes {k} states: the draft "
                "config's aux layer ids do not belong to this fc.weight",
                "list as many ids in eagle_config.eagle_aux_hidden_state_layer_ids as fc.weight was trained on "
                "(and target_hidden_size = the target's hidden size)",
                ["aux-ids-count", "fc-width"],
            )
        return (
            f"{got} of {len(layers)} configured states captured (layers_to_capture {layers}): a layer id the forward "
            "never reaches (out of range), duplicate ids, pipeline parallel (only the last stage captures) or "
            "two-batch "
            "overlap (the overlapped layers capture nothing)",
            "run `eagle3-patches doctor --target T --draft D -- <launch flags>` and keep aux_capture_validation on",
            ["aux-ids-out-of-range", "aux-ids-duplicate", "pipeline-parallel", "two-batch-overlap"],
        )
    return (
        "the stored width is not a multiple of the hidden size: the captured states were split or gathered on the "
        "way (TP / a2a MoE gather)",
        "report it with `eagle3-patches status` output and the launch flags",
        [],
    )


def _judge_image_rows(rec: dict) -> Diagnostic | None:
    wrong = [i for i, ok in enumerate(rec.get("last_rows") or []) if ok is False]
    if not wrong:
        return None
    return _problem(
        rec,
        "image-rows",
        f"the draft's prefill of a batch with images: the last position of sequence(s) {wrong} of "
        f"{len(rec['last_rows'])} is not fed the embedding of the token there",
        cause="sglang hands the draft the target's merged embedding rows and re-embeds only some last positions "
        "(the release's faults: `eagle3-patches doctor` names them as eagle3-image-draft-rows)",
        fix="upgrade sglang, or keep eagle3-patches' eagle3_image_draft_rows on (it refuses such a launch)",
        doctor=["eagle3-image-draft-rows"],
    )


def _judge_draft(rec: dict, context: dict) -> Diagnostic | None:
    mode = rec.get("mode")
    width, fc_in, embed = rec.get("width"), rec.get("fc_in_features"), rec.get("embed_width")
    if width is None:
        return None
    if mode in DRAFT_FED_MODES:
        if not fc_in or width == fc_in:
            return None
        target = _target_record(context, mode)
        if embed and width == embed and rec.get("fc_applied") is not True:
            target_problem = _judge_target(target, context) if target else None
            if target_problem:
                first_hop, first_mode = hop_of(target_problem)
                cause = f"{target_problem.cause} (first visible at {first_hop} in {first_mode})"
                fix, doctor = target_problem.fix, target_problem.related
            else:
                cause = (
                    "the target handed over one layer's width: --speculative-algorithm EAGLE with an EAGLE-3 draft, or "
                    "a target that does not capture its aux layers (run the probe on the target too)"
                )
                fix, doctor = SPEC_FIX_EAGLE3, ("algorithm-eagle-with-eagle3-draft",)
            if rec.get("error"):
                what = (
                    f"{width}-wide states (one layer's width) entered the draft and its forward raised "
                    f"{rec['error'].split(':', 1)[0]} (eagle3_fc_guard stops the silent fc skip)"
                )
            else:
                what = (
                    f"the silent skip: {width}-wide states entered the draft and its fc was skipped "
                    "(sglang applies fc only when the width differs from the embedding width)"
                )
            return _problem(
                rec,
                "width",
                what,
                found=f"width {width} = the embedding width, fc " + ("not reached" if rec.get("error") else "skipped"),
                expected=f"{fc_in} = fc.in_features, fc applied",
                cause=cause,
                fix=fix + "; eagle3_fc_guard turns this silent skip into an error at the first request",
                doctor=doctor,
            )
        return _problem(
            rec,
            "width",
            f"{width}-wide states entered the draft whose fc takes {fc_in}",
            found=f"width {width}"
            + (
                f", fc {'applied' if rec.get('fc_applied') else 'skipped'}" if rec.get("fc_applied") is not None else ""
            ),
            expected=f"{fc_in} = fc.in_features",
            cause="the number of aux layer ids x the target's hidden size does not match the draft's fc.weight "
            "(a draft trained for another target or another layer count), or target_hidden_size is wrong",
            fix="check the draft against the target with `eagle3-patches doctor`",
            doctor=["fc-width", "aux-ids-count", "target-hidden-size"],
        )
    if mode == "decode" and embed and width != embed:
        return _problem(
            rec,
            "width",
            f"{width}-wide states entered a draft decode step; the draft's own states are {embed} wide",
            found=f"width {width}",
            expected=f"{embed} (the draft's hidden size)",
            cause="the draft's previous step did not hand over its own hidden states",
            fix="report it with `eagle3-patches status` output",
        )
    return None


def _problem(rec: dict, kind: str, what: str, *, doctor: Iterable[str] = (), **kw: Any) -> Diagnostic:
    """One probe finding (code ``probe-width`` / ``probe-nan``); ``doctor``: the doctor codes that check
    for the cause.
    """
    hop, mode, pid, rank = rec.get("hop", "?"), rec.get("mode", "?"), rec.get("pid"), rec.get("tp_rank")
    return Diagnostic.make(
        ERROR,
        f"probe-{kind}",
        what,
        where=f"{hop} in {mode} (pid {pid}, tp rank {rank})",
        related=tuple(doctor),
        context={"hop": hop, "mode": mode, "pid": pid, "tp_rank": rank, "kind": kind},
        **kw,
    )


# ---------------------------------------------------------------------- one line per record
def summarize(rec: dict) -> str:
    """The record in one line (the probe's log line uses it too)."""
    hop, mode = rec.get("hop"), rec.get("mode")
    head = f"[pid {rec.get('pid')} tp {rec.get('tp_rank')}] {hop} {mode}"
    stats = _fmt_stats(rec.get("stats"))
    dtype = rec.get("dtype") or "?"
    if hop == IMAGE_ROWS:
        rows = rec.get("last_rows")
        right = "n/a" if rows is None else f"{sum(1 for r in rows if r)} of {len(rows)}"
        return (
            f"{head}: {rec.get('sequences')} sequence(s), {sum(rec.get('with_images') or [])} with images; last rows "
            f"that are the token's embedding: {right}"
        )
    if hop == TARGET:
        if rec.get("width") is None:
            return f"{head}: {rec.get('algorithm') or 'no speculation'}, no hidden states stored"
        ids = rec.get("aux_ids_configured")
        cap = (
            f"aux ids {ids if ids is not None else 'sglang defaults'} -> layers_to_capture "
            f"{rec.get('layers_to_capture')}, "
            f"{rec.get('captured_states')} state(s) captured"
            if rec.get("capture_aux_hidden_states")
            else "capture off (final normed state)"
        )
        exp = rec.get("expected_width")
        return (
            f"{head}: {rec.get('algorithm') or 'no speculation'}, {cap}; stored width {rec.get('width')}"
            + (f" (expected {exp})" if exp else "")
            + f", {dtype}, {stats}"
        )
    fc = rec.get("fc_applied")
    if rec.get("fc_in_features") is None:
        fc_txt = "no fc"
    else:
        fc_txt = "fc ?" if fc is None else ("fc applied" if fc else "fc skipped")
        fc_txt += f" (fc {rec.get('fc_in_features')} -> {rec.get('fc_out_features')}"
        fc_txt += f"; {rec['fc_observed']})" if rec.get("fc_observed") else ")"
    err = f"; raised {rec['error']}" if rec.get("error") else ""
    return f"{head}: {rec.get('algorithm')}, width {rec.get('width')}, {dtype}, {stats}; {fc_txt}{err}"


def _fmt_stats(stats: dict | None) -> str:
    if not stats:
        return "no statistics"

    def num(v: Any) -> str:
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"

    flags = ", ".join(k.upper() if k == "nan" else "Inf" for k in ("nan", "inf") if stats.get(k)) or "no NaN"
    return f"mean {num(stats.get('mean'))} std {num(stats.get('std'))} absmax {num(stats.get('absmax'))} {flags}"


# ---------------------------------------------------------------------- the report
@dataclass
class ProcessSummary:
    pid: Any
    tp_rank: Any
    algorithm: Any
    records: list[dict]
    problems: list[Diagnostic]

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "tp_rank": self.tp_rank,
            "algorithm": self.algorithm,
            "records": [{"hop": r.get("hop"), "mode": r.get("mode"), "summary": summarize(r)} for r in self.records],
            "problems": [p.as_dict() for p in self.problems],
        }


@dataclass
class ProbeReport:
    files: list[str]
    records: list[dict]
    processes: list[ProcessSummary]
    problems: list[Diagnostic]
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> Diagnostic | None:
        return self.problems[0] if self.problems else None

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "exit_code": self.exit_code,
            "files": self.files,
            "records": len(self.records),
            "first_wrong_hop": self.first.as_dict() if self.first else None,
            "problems": [p.as_dict() for p in self.problems],
            "processes": [p.as_dict() for p in self.processes],
            "notes": self.notes,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def verdict(self) -> str:
        """``OK: ...``, or ``FIRST WRONG HOP: hop in mode`` and that problem (the report's conclusion)."""
        first = self.first
        if first is None:
            return "OK: every hop has the width the draft expects and finite values."
        return f"FIRST WRONG HOP: {' in '.join(hop_of(first))}\n{first.render('  ')}"

    def format(self) -> str:
        lines = [
            f"eagle3-patches probe-report: {len(self.records)} record(s) from {len(self.processes)} process(es) "
            f"in {len(self.files)} file(s)"
        ]
        for proc in self.processes:
            lines.append("")
            lines.append(f"process pid {proc.pid} (tp rank {proc.tp_rank}), --speculative-algorithm {proc.algorithm}")
            wrong = {hop_of(p) for p in proc.problems}
            for r in proc.records:
                key = (r.get("hop"), r.get("mode"))
                label = "WRONG" if key in wrong else "ok"
                tail = ""
                if (
                    label == "ok"
                    and r.get("hop") == DRAFT
                    and r.get("mode") == "decode"
                    and r.get("fc_applied") is False
                ):
                    tail = " -- by design: a decode step feeds the draft its own states"
                lines.append(f"  {label:<6} {summarize(r).split('] ', 1)[-1]}{tail}")
        for note in self.notes:
            lines.append(f"note: {note}")
        lines.append("")
        lines.append(self.verdict())
        others = self.problems[1:]
        if others:
            lines.append("")
            lines.append(f"also wrong ({len(others)}):")
            for p in others:
                lines.append(f"  {p.where}: {p.what}")
        return "\n".join(lines)


def _order(rec_or_problem: Any) -> tuple:
    if isinstance(rec_or_problem, Diagnostic):
        hop, mode, kind = rec_or_problem.context["hop"], rec_or_problem.context["mode"], rec_or_problem.context["kind"]
    else:
        hop, mode, kind = rec_or_problem.get("hop"), rec_or_problem.get("mode"), ""
    return (PATH_ORDER.get((hop, mode), 9), 0 if kind == "width" else 1)


def _rank_key(v: Any) -> tuple:
    return (0, v) if isinstance(v, int) else (1, str(v))


def analyse(records: Iterable[dict], files: Iterable[str] = (), notes: Iterable[str] = ()) -> ProbeReport:
    records = list(records)
    by_pid: dict[Any, list[dict]] = {}
    for r in records:
        by_pid.setdefault(r.get("pid"), []).append(r)
    processes: list[ProcessSummary] = []
    for pid, recs in by_pid.items():
        context: dict = {}
        for r in recs:
            context.setdefault((r.get("hop"), r.get("mode")), r)  # the first record of a (hop, mode) wins
        ordered = sorted(context.values(), key=_order)
        problems = sorted((p for r in ordered for p in judge(r, context)), key=_order)
        algo = next((r.get("algorithm") for r in ordered if r.get("algorithm")), None)
        processes.append(ProcessSummary(pid, ordered[0].get("tp_rank"), algo, ordered, problems))
    processes.sort(key=lambda p: (_rank_key(p.tp_rank), _rank_key(p.pid)))
    problems = sorted((p for proc in processes for p in proc.problems), key=_order)
    # stable sort: processes in rank order within the same path position
    return ProbeReport(list(files), records, processes, problems, [*notes, *_rank_notes(processes)])


def _rank_notes(processes: list[ProcessSummary], tolerance: float = 0.02) -> list[str]:
    """TP ranks that ran the same batch should capture the same (replicated) states."""
    notes = []
    for mode in ("extend", "target_verify"):
        recs = [
            r
            for p in processes
            for r in p.records
            if r.get("hop") == TARGET
            and r.get("mode") == mode
            and (r.get("stats") or {}).get("std") is not None
            and r.get("width") is not None
        ]
        by_shape: dict[tuple, list[dict]] = {}
        for r in recs:
            by_shape.setdefault((r.get("tokens"), r.get("width")), []).append(r)
        for group in by_shape.values():
            if len({r.get("tp_rank") for r in group}) < 2:
                continue
            stds = [r["stats"]["std"] for r in group]
            lo, hi = min(stds), max(stds)
            if hi > 0 and (hi - lo) / hi > tolerance:
                ranks = ", ".join(f"rank {r.get('tp_rank')}: std {r['stats']['std']:.4g}" for r in group)
                notes.append(
                    f"the TP ranks stored different states at target_output {mode} for the same batch shape ({ranks}); "
                    "captured states are normally replicated across ranks: per-rank partial sums point to flashinfer "
                    "all-reduce fusion (doctor: tp-allreduce-fusion; eagle3-patches' tp_allreduce_fusion_capture), "
                    "unless the ranks ran different batches (dp-attention)"
                )
    return notes
