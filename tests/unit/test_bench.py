"""`eagle3-patches bench`: sglang's own serving benchmark (the installed release's CLI, in a child process) against
fake SGLang servers (stdlib HTTP: /v1/models, /get_server_info, a streamed /generate), and what bench adds."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import threading
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle3_patches import bench
from eagle3_patches._bootstrap import child_environment
from eagle3_patches.cli import main
from eagle3_patches.errors import Eagle3Error
from eagle3_patches.testing import tiny_models

pytestmark = pytest.mark.sglang


def _fake(accept: float | None, tokenizer: Path, word: str = "t5"):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *a):
            pass

        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.startswith("/v1/models"):
                self._send({"data": [{"id": str(tokenizer)}]})
            elif self.path.startswith(("/get_server_info", "/server_info")):  # 0.5.9; the newer releases
                self._send({"internal_states": [{"avg_spec_accept_length": accept} if accept else {}]})
            else:
                self._send({"model_path": str(tokenizer)})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = body["sampling_params"]["max_new_tokens"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(1, n + 1):
                chunk = {"text": " ".join([word] * i), "meta_info": {"completion_tokens": i}}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    tiny_models.write_tokenizer(path, 64)
    return path


@pytest.fixture(autouse=True)
def cpu_profile_children(monkeypatch):
    """sglang's benchmark runs as under ``eagle3-patches run --cpu-profile``: from 0.5.23 it imports sglang's model
    configs, which import torchvision (a CUDA build here: the CPU profile's stand-in)."""
    for key, value in child_environment(cpu_profile=True).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)


@pytest.fixture
def servers(tokenizer):
    a, url_a = _fake(2.0, tokenizer)
    b, url_b = _fake(None, tokenizer)
    yield url_a, url_b
    a.shutdown()
    b.shutdown()


def test_every_flag_bench_passes_is_one_the_installed_releases_benchmark_declares():
    """0.5.9's sglang/bench_serving.py and the newest release's sglang/benchmark/serving.py (mode c) alike."""
    source = Path(importlib.util.find_spec(bench.serving_module()).origin).read_text(encoding="utf-8")
    if "from sglang.benchmark.serving import *" in source:  # the deprecated alias
        source = Path(importlib.util.find_spec("sglang.benchmark.serving").origin).read_text(encoding="utf-8")
    argv = bench.serving_argv(
        "http://h:1",
        "/o.jsonl",
        concurrency=2,
        num_prompts=3,
        input_len=4,
        output_len=5,
        tokenizer="/t",
        progress=False,
    )
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == 13 and not [f for f in flags if f'"{f}"' not in source]
    keys = [
        "duration",
        "completed",
        "total_output_tokens",
        "output_throughput",
        "median_e2e_latency_ms",
        "p90_e2e_latency_ms",
        "p99_e2e_latency_ms",
        "accept_length",
        "errors",
        "generated_texts",
    ]
    assert not [k for k in keys if f'"{k}":' not in source]  # the result keys phase_from reads


def test_a_server_against_its_baseline_in_one_run(servers, capsys):
    url, base = servers
    rep = bench.run([url, base], concurrency=2, num_prompts=3, input_len=4, output_len=6)
    s, b = rep["servers"]
    assert s["single"]["accept_length"] == pytest.approx(2.0) and b["single"]["accept_length"] is None
    assert s["single"]["requests"] == 3 and s["single"]["errors"] == 0 and s["concurrent"]["concurrency"] == 2
    assert s["single"]["output_tokens"] == 18 and s["single"]["latency_p50"] > 0
    assert rep["ratios"]["same_outputs"] and s["outputs"] == [" ".join(["t5"] * 6)] * 3
    steps = rep["ratios"]["single"]["cycle_in_plain_steps"]
    assert steps == pytest.approx(2.0 / rep["ratios"]["single"]["output_tokens_per_s"])
    table = bench.format_table(rep)
    assert "accept len" in table and "2.00" in table and "same outputs (single stream): yes" in table
    assert f"costs the wall time of {steps:.2f} baseline decode steps" in table
    assert "Serving Benchmark Result" in capsys.readouterr().err  # sglang's own summary, on stderr


def test_outputs_that_differ_are_said(tokenizer):
    (a, url), (b, base) = _fake(2.0, tokenizer), _fake(None, tokenizer, word="t6")
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(
                [
                    "bench",
                    url,
                    "--baseline",
                    base,
                    "--num-prompts",
                    "2",
                    "--max-new-tokens",
                    "3",
                    "--concurrency",
                    "1",
                    "--no-progress",
                    "--json",
                ]
            )
    finally:
        a.shutdown()
        b.shutdown()
    rep = json.loads(out.getvalue())  # stdout holds the report alone
    assert rc == 0 and rep["ratios"]["same_outputs"] is False and rep["servers"][0]["concurrent"] is None


def test_an_unreachable_server_is_one_line_naming_it_and_quiet_shows_sglangs_output_only_then(
    servers, tokenizer, capsys
):
    phase, texts = bench.run_phase(
        servers[0], 1, label="server", num_prompts=1, input_len=2, output_len=2, tokenizer=str(tokenizer), quiet=True
    )
    assert phase.requests == 1 and texts and capsys.readouterr().err == ""  # sglang's summary kept back
    with pytest.raises(Eagle3Error, match=r"against server http://127\.0\.0\.1:9 exited \d+ without a result"):
        bench.run_phase(
            "http://127.0.0.1:9",
            1,
            label="server",
            num_prompts=1,
            input_len=2,
            output_len=2,
            tokenizer="/nonexistent",
            quiet=True,
        )
    assert capsys.readouterr().err.strip()  # what sglang said, shown when it fails


def test_without_sglang_bench_says_which_python(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(Eagle3Error, match=re.escape("sglang's serving benchmark (sglang.bench_serving) is not")):
        bench.serving_module()


def test_a_cycle_is_priced_in_plain_decode_steps():
    # 2.5 tokens a cycle at 1.0 tok/s against 2.0 tok/s plain: a cycle lasts 2.5 s, a plain step 0.5 s
    assert bench.cycle_in_plain_steps(2.5, 1.0, 2.0) == pytest.approx(5.0)
    assert 2.5 / bench.cycle_in_plain_steps(2.5, 1.0, 2.0) == pytest.approx(1.0 / 2.0)  # the speed ratio
    assert bench.cycle_in_plain_steps(None, 1.0, 2.0) is None and bench.cycle_in_plain_steps(2.5, 0.0, 2.0) is None


def test_the_expected_speedup_is_the_accept_length_over_the_cycles_cost():
    assert bench.expected_speedup(3.0, steps=3, draft_cost=0.0) == pytest.approx(3.0)
    assert bench.expected_speedup(3.0, steps=3, draft_cost=0.05) == pytest.approx(3.0 / 1.15)
    assert bench.expected_speedup(3.0, steps=2, draft_cost=0.5, verify_cost=2.0) == pytest.approx(1.0)


def test_the_demo_explains_its_ratio_from_its_own_measurements(tool):
    demo = tool("demo_cpu")
    report = {
        "servers": [{"single": {"accept_length": 2.0}}],
        "ratios": {"single": {"cycle_in_plain_steps": 4.0}},
    }
    parts = {"plain_decode": 0.1, "cycle": 0.4, "draft": 0.1, "verify": 0.25, "forward_draft_extend_after_decode": 0.05}
    text = "\n".join(demo.why_slower_here(report, parts, steps=3))
    assert "2.00 / 4.0 = x0.50" in text
    assert "an EAGLE3 cycle 0.40 s = 4.00 plain steps" in text
    assert "draft steps 1.00, target verify 2.50, draft extend 0.50" in text
    assert f"x{bench.expected_speedup(2.0, 3, 0.03):.1f} with c = 0.03" in text
    assert demo.why_slower_here({**report, "ratios": {"single": {"cycle_in_plain_steps": None}}}, parts, 3) == []
