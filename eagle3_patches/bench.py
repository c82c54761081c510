"""``eagle3-patches bench``: sglang's own serving benchmark, run against a server and a baseline in one go.

What a run measures is sglang's ``bench_serving`` (``python -m sglang.benchmark.serving`` from the release that
moved it there, ``python -m sglang.bench_serving`` before; both take the flags used here, from 0.5.9 on): output
tokens/s, end-to-end latency percentiles, and the accept length sglang reports (its ``/get_server_info``
``avg_spec_accept_length``: the server's own average since it started, warm-up request included; none without
speculation).  Its own progress bar (tqdm) and summary go to stderr.  This module keeps only what that tool
lacks:

* **the baseline in the same run**: each server benchmarked single-stream and at ``concurrency``, then the ratios
  server / baseline (throughput, latency) and what one speculative cycle cost in the baseline's decode steps
  (:func:`cycle_in_plain_steps`), which say whether the accept length pays at these flags on this machine;
* **same outputs**: whether the two servers generated the same texts single-stream (greedy: a speculative server
  that changes outputs is wrong, not fast);
* :func:`expected_speedup`, the walltime analysis of an accept length.

The per-position acceptance is not something a running server reports: ``eagle3-patches measure-accept`` measures
it offline.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import Eagle3Error

#: sglang's benchmark modules, newest home first (``sglang.bench_serving`` is a deprecated alias after the move)
SERVING_MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")
#: ``--api`` -> bench_serving's ``--backend``
BACKENDS = {"generate": "sglang", "openai": "sglang-oai"}


@dataclass
class Phase:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    output_tokens_per_s: float
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None
    accept_length: float | None  # sglang's avg_spec_accept_length (None without speculation)
    first_error: str | None = None


@dataclass
class ServerReport:
    url: str
    label: str
    single: Phase | None = None
    concurrent: Phase | None = None
    outputs: list = field(default_factory=list)


def serving_module() -> str:
    """The installed sglang's serving benchmark module."""
    for name in SERVING_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ImportError:  # sglang (or sglang.benchmark) not installed
            continue
    raise Eagle3Error(
        "eagle3-patches bench: sglang's serving benchmark (sglang.bench_serving) is not installed in this Python "
        f"({sys.executable}): run bench with the Python sglang is installed in"
    )


def serving_argv(
    url: str,
    output_file: str,
    *,
    concurrency: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    api: str = "generate",
    seed: int = 0,
    tokenizer: str | None = None,
    progress: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of sglang's serving benchmark for one phase: random prompts of ``input_len`` token ids,
    ``output_len`` tokens each (EOS ignored), at most ``concurrency`` in flight, the result and the generated texts
    appended to ``output_file``."""
    argv = [
        sys.executable,
        "-m",
        serving_module(),
        "--backend",
        BACKENDS[api],
        "--base-url",
        url.rstrip("/"),
        "--dataset-name",
        "random-ids",  # random token ids; "random" samples ShareGPT, fetched from the hub
        "--num-prompts",
        str(num_prompts),
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "1",
        "--max-concurrency",
        str(concurrency),
        "--seed",
        str(seed),
        "--output-file",
        output_file,
        "--output-details",
    ]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if not progress:
        argv.append("--disable-tqdm")
    return argv + list(extra)


def phase_from(result: dict, concurrency: int) -> Phase:
    """A :class:`Phase` from one line of bench_serving's output file (its keys, 0.5.9 to the newest release)."""
    errors = [e for e in result.get("errors") or [] if e]

    def seconds(key: str) -> float | None:
        value = result.get(key)
        return None if value is None else value / 1000.0

    return Phase(
        concurrency=concurrency,
        requests=len(result.get("errors") or []) or int(result.get("completed", 0)),
        errors=len(errors),
        wall_s=float(result["duration"]),
        output_tokens=int(result["total_output_tokens"]),
        output_tokens_per_s=float(result["output_throughput"]),
        latency_p50=seconds("median_e2e_latency_ms"),
        latency_p90=seconds("p90_e2e_latency_ms"),
        latency_p99=seconds("p99_e2e_latency_ms"),
        accept_length=result.get("accept_length") or None,
        first_error=str(errors[0])[:300] if errors else None,
    )


def run_phase(url: str, concurrency: int, *, label: str = "", quiet: bool = False, **kw: Any) -> tuple[Phase, list]:
    """One run of sglang's serving benchmark; its summary goes to stderr (``quiet``: its output is kept back and shown
    only when it fails).  The phase and the generated texts."""
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmp:
        out = Path(tmp) / "result.jsonl"
        argv = serving_argv(
            url, str(out), concurrency=concurrency, **{**kw, "progress": kw.get("progress", True) and not quiet}
        )
        # its progress bar and messages: stderr, live; its summary (stdout) to our stderr, stdout keeps the report
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if quiet else None, text=True, check=False
        )
        lines = out.read_text(encoding="utf-8").splitlines() if out.is_file() else []
        if not quiet or done.returncode != 0 or not lines:
            sys.stderr.write(done.stdout)
    if done.returncode != 0 or not lines:
        raise Eagle3Error(
            f"eagle3-patches bench: sglang's serving benchmark against {label or 'the server'} {url} exited "
            f"{done.returncode} without a result (its messages are above); the command: {' '.join(argv[1:])}"
        )
    result = json.loads(lines[-1])
    return phase_from(result, concurrency), list(result.get("generated_texts") or [])


def bench_server(url: str, *, label: str, concurrency: int, **kw: Any) -> ServerReport:
    """``url`` single-stream, then (``concurrency`` > 1) at ``concurrency`` in flight."""
    report = ServerReport(url=url, label=label)
    report.single, report.outputs = run_phase(url, 1, label=label, **kw)
    if concurrency > 1:
        report.concurrent, _ = run_phase(url, concurrency, label=label, **kw)
    return report


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def compare(server: ServerReport, baseline: ServerReport) -> dict:
    out: dict[str, Any] = {}
    for phase in ("single", "concurrent"):
        s, b = getattr(server, phase), getattr(baseline, phase)
        if s is None or b is None:
            continue
        out[phase] = {
            "output_tokens_per_s": _ratio(s.output_tokens_per_s, b.output_tokens_per_s),
            "latency_p50": _ratio(s.latency_p50, b.latency_p50),
            "latency_p90": _ratio(s.latency_p90, b.latency_p90),
            "cycle_in_plain_steps": cycle_in_plain_steps(s.accept_length, s.output_tokens_per_s, b.output_tokens_per_s),
        }
    out["same_outputs"] = server.outputs == baseline.outputs
    return out


def cycle_in_plain_steps(
    accept_length: float | None, spec_tokens_per_s: float | None, plain_tokens_per_s: float | None
) -> float | None:
    """What one speculative cycle (the target's verify forward and the draft's forwards) cost, in decode steps of the
    server without speculation, measured: a cycle yields ``accept_length`` tokens in
    ``accept_length / spec_tokens_per_s`` seconds, a plain step one token in ``1 / plain_tokens_per_s``.  The speed
    ratio is ``accept_length / cycle_in_plain_steps``."""
    if not accept_length or not spec_tokens_per_s or not plain_tokens_per_s:
        return None
    return accept_length * plain_tokens_per_s / spec_tokens_per_s


def expected_speedup(accept_length: float, steps: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """The speedup over plain decoding that an accept length gives, as speculative decoding's walltime analysis
    computes it (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", section 3.3;
    the EAGLE papers report the accept length as tau): a cycle yields ``accept_length`` tokens and costs one verify
    forward of the target (``verify_cost`` decode steps: about 1 where decoding is memory-bound, as on a GPU at small
    batch, since the weights are read once for all the tokens verified) plus ``steps`` draft forwards, each costing
    ``draft_cost`` of a target decode step.  Scheduling overhead and the draft's extend are left out."""
    return accept_length / (verify_cost + steps * draft_cost)


def run(urls: Sequence[str], *, concurrency: int = 4, labels: Sequence[str] | None = None, **kw: Any) -> dict:
    """Benchmark the first URL and, if given, the second (the baseline).  A JSON-able report."""
    labels = list(labels or (["server", "baseline"][: len(urls)]))
    reports = [bench_server(url, label=label, concurrency=concurrency, **kw) for url, label in zip(urls, labels)]
    result = {
        "settings": {
            "concurrency": concurrency,
            **{k: v for k, v in kw.items() if k not in ("extra", "progress", "quiet")},
        },
        "servers": [asdict(r) for r in reports],
    }
    if len(reports) == 2:
        result["ratios"] = compare(reports[0], reports[1])
    return result


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def format_table(report: dict) -> str:
    head = ["server", "phase", "reqs", "err", "out tok", "wall s", "out tok/s", "p50 s", "p90 s", "p99 s", "accept len"]
    rows = []
    for s in report["servers"]:
        for phase in ("single", "concurrent"):
            p = s.get(phase)
            if not p:
                continue
            rows.append(
                [
                    s["label"],
                    "single" if phase == "single" else f"c={p['concurrency']}",
                    str(p["requests"]),
                    str(p["errors"]),
                    str(p["output_tokens"]),
                    _fmt(p["wall_s"], ".1f"),
                    _fmt(p["output_tokens_per_s"]),
                    _fmt(p["latency_p50"]),
                    _fmt(p["latency_p90"]),
                    _fmt(p["latency_p99"]),
                    _fmt(p["accept_length"]),
                ]
            )
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    ratios = report.get("ratios")
    if ratios:
        a, b = report["servers"][0]["label"], report["servers"][1]["label"]
        lines.append("")
        for phase in ("single", "concurrent"):
            if phase in ratios:
                r = ratios[phase]
                lines.append(
                    f"{a} / {b} ({phase}): output tok/s x{_fmt(r['output_tokens_per_s'])}, "
                    f"p50 latency x{_fmt(r['latency_p50'])}, p90 latency x{_fmt(r['latency_p90'])}"
                )
                if r.get("cycle_in_plain_steps"):
                    accept = report["servers"][0][phase]["accept_length"]
                    lines.append(
                        f"  a {a} cycle yields {_fmt(accept)} tokens (the accept length) and costs the wall time of "
                        f"{_fmt(r['cycle_in_plain_steps'])} {b} decode steps: x{_fmt(r['output_tokens_per_s'])}"
                    )
        lines.append(f"same outputs (single stream): {'yes' if ratios['same_outputs'] else 'NO'}")
    for s in report["servers"]:
        for phase in ("single", "concurrent"):
            p = s.get(phase)
            if p and p.get("first_error"):
                lines.append(f"{s['label']} {phase}: first error: {p['first_error']}")
    return "\n".join(lines)
