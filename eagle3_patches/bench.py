"""A small benchmark client for a running SGLang server (``eagle3-patches bench``).

Standard library only (``urllib`` + threads).  For each server it sends the same requests
twice: one at a time (single stream) and with ``concurrency`` in flight, and reports

* **accept length**: sglang's ``meta_info.spec_accept_length`` = completion tokens / verify
  steps of each request (0.5.9; the prefill counts as one step, so a draft that never hits
  shows slightly above 1.0), averaged over requests; also the pooled figure
  sum(completion tokens) / sum(``spec_verify_ct``).  Absent (``None``) without speculation
  and on the OpenAI endpoint, whose response has no ``meta_info``;
* **output tokens/s**: completion tokens of the phase / wall time of the phase;
* **latency** percentiles (p50 / p90 / p99, seconds) of whole requests.

With a second (baseline) server, e.g. the same target without speculation, the report adds
ratios (server / baseline) measured in the same run.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import Eagle3Error


@dataclass
class Prompt:
    text: str | None = None
    input_ids: list[int] | None = None


@dataclass
class Result:
    latency: float
    completion_tokens: int
    verify_ct: int | None = None
    accept_length: float | None = None
    output: list[int] | str | None = None
    error: str | None = None


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
    accept_length: float | None  # mean over requests of sglang's spec_accept_length
    accept_length_pooled: float | None  # sum(completion tokens) / sum(verify steps)
    first_error: str | None = None


@dataclass
class ServerReport:
    url: str
    label: str
    single: Phase | None = None
    concurrent: Phase | None = None
    outputs: list = field(default_factory=list)


def random_prompts(n: int, length: int, vocab_size: int, seed: int = 0, low: int = 4) -> list[Prompt]:
    rng = random.Random(seed)
    return [Prompt(input_ids=[rng.randrange(low, vocab_size) for _ in range(length)]) for _ in range(n)]


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def send(
    base_url: str,
    prompt: Prompt,
    *,
    api: str = "generate",
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    model: str = "default",
    timeout: float = 600.0,
) -> Result:
    t0 = time.perf_counter()
    try:
        if api == "generate":
            body: dict = {
                "sampling_params": {
                    "temperature": temperature,
                    "max_new_tokens": max_new_tokens,
                    "ignore_eos": ignore_eos,
                }
            }
            if prompt.input_ids is not None:
                body["input_ids"] = list(prompt.input_ids)
            else:
                body["text"] = prompt.text
            out = _post(base_url.rstrip("/") + "/generate", body, timeout)
            meta = out.get("meta_info", {})
            return Result(
                time.perf_counter() - t0,
                int(meta.get("completion_tokens", 0)),
                meta.get("spec_verify_ct"),
                meta.get("spec_accept_length"),
                out.get("output_ids", out.get("text")),
            )
        body = {
            "model": model,
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "ignore_eos": ignore_eos,
            "prompt": list(prompt.input_ids) if prompt.input_ids is not None else prompt.text,
        }
        out = _post(base_url.rstrip("/") + "/v1/completions", body, timeout)
        usage = out.get("usage") or {}
        text = (out.get("choices") or [{}])[0].get("text")
        return Result(time.perf_counter() - t0, int(usage.get("completion_tokens", 0)), output=text)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        detail = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
        return Result(time.perf_counter() - t0, 0, error=f"{type(exc).__name__}: {exc} {detail}".strip())


class Progress:
    """A one-line progress bar on stderr (a line per quarter when stderr is not a terminal)."""

    def __init__(self, label: str, total: int, stream=None, width: int = 30):
        self.label, self.total, self.width = label, total, width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.lock = threading.Lock()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self._last_quarter = -1
        self._draw()

    def step(self) -> None:
        with self.lock:
            self.done += 1
            self._draw()

    def _draw(self) -> None:
        filled = int(self.width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (self.width - filled)
        line = f"{self.label} [{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:.1f}s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done >= self.total else ""))
        else:
            quarter = 4 * self.done // max(self.total, 1)
            if quarter == self._last_quarter:
                return
            self._last_quarter = quarter
            self.stream.write(line + "\n")
        self.stream.flush()


def run_phase(
    base_url: str, prompts: Sequence[Prompt], concurrency: int, *, label: str = "", progress: bool = True, **send_kw
) -> tuple[Phase, list[Result]]:
    bar = Progress(f"{label} c={concurrency}", len(prompts)) if progress else None
    results: list[Result | None] = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = send(base_url, prompts[i], **send_kw)
        if bar:
            bar.step()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - t0
    done = [r for r in results if r is not None]
    ok = [r for r in done if r.error is None]
    tokens = sum(r.completion_tokens for r in ok)
    lat = [r.latency for r in ok]
    accepts = [r.accept_length for r in ok if r.accept_length is not None]
    verify = [r.verify_ct for r in ok if r.verify_ct]
    pooled = (sum(r.completion_tokens for r in ok if r.verify_ct) / sum(verify)) if verify else None
    errors = [r.error for r in done if r.error]
    phase = Phase(
        concurrency=concurrency,
        requests=len(prompts),
        errors=len(errors),
        wall_s=wall,
        output_tokens=tokens,
        output_tokens_per_s=tokens / wall if wall > 0 else 0.0,
        latency_p50=percentile(lat, 50),
        latency_p90=percentile(lat, 90),
        latency_p99=percentile(lat, 99),
        accept_length=sum(accepts) / len(accepts) if accepts else None,
        accept_length_pooled=pooled,
        first_error=errors[0] if errors else None,
    )
    return phase, done


def wait_ready(base_url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for path in ("/health", "/get_model_info"):
            try:
                with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
        time.sleep(1.0)
    raise Eagle3Error(f"eagle3-patches bench: no SGLang server answers at {base_url} ({last})")


def bench_server(
    base_url: str,
    prompts: Sequence[Prompt],
    *,
    label: str,
    concurrency: int,
    single_requests: int | None = None,
    progress: bool = True,
    **send_kw,
) -> ServerReport:
    report = ServerReport(url=base_url, label=label)
    single = list(prompts[: single_requests or len(prompts)])
    report.single, results = run_phase(base_url, single, 1, label=label, progress=progress, **send_kw)
    report.outputs = [r.output for r in results]
    if concurrency > 1:
        report.concurrent, _ = run_phase(base_url, prompts, concurrency, label=label, progress=progress, **send_kw)
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
            "cycle_in_plain_steps": cycle_in_plain_steps(
                s.accept_length_pooled, s.output_tokens_per_s, b.output_tokens_per_s
            ),
        }
    out["same_outputs"] = server.outputs == baseline.outputs
    return out


def cycle_in_plain_steps(
    accept_length: float | None, spec_tokens_per_s: float | None, plain_tokens_per_s: float | None
) -> float | None:
    """What one speculative cycle (the target's verify forward and the draft's forwards) cost, in decode steps of the
    server without speculation, measured: a cycle yields ``accept_length`` tokens (the pooled figure: completion
    tokens / verify steps) in ``accept_length / spec_tokens_per_s`` seconds, a plain step one token in
    ``1 / plain_tokens_per_s``.  The speed ratio is ``accept_length / cycle_in_plain_steps``."""
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


def run(
    urls: Sequence[str],
    prompts: Sequence[Prompt],
    *,
    concurrency: int = 4,
    single_requests: int | None = None,
    labels: Sequence[str] | None = None,
    progress: bool = True,
    ready_timeout: float = 60.0,
    **send_kw,
) -> dict:
    """Benchmark the first URL and, if given, the second (the baseline).  A JSON-able report."""
    labels = list(labels or (["server", "baseline"][: len(urls)]))
    reports = []
    for url, label in zip(urls, labels):
        wait_ready(url, ready_timeout)
        reports.append(
            bench_server(
                url,
                prompts,
                label=label,
                concurrency=concurrency,
                single_requests=single_requests,
                progress=progress,
                **send_kw,
            )
        )
    result = {
        "settings": {
            "concurrency": concurrency,
            "prompts": len(prompts),
            **{k: v for k, v in send_kw.items() if k != "timeout"},
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
                    accept = report["servers"][0][phase]["accept_length_pooled"]
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
