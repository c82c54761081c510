"""eagle3_patches.bench and `eagle3-patches bench` against a fake SGLang server (stdlib HTTP)."""

from __future__ import annotations

import io
import json
import threading
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3_patches import bench
from eagle3_patches.cli import main
from eagle3_patches.errors import Eagle3Error


def _fake(accept: float | None):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"model_path": "/nonexistent"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/generate":
                n = body["sampling_params"]["max_new_tokens"]
                meta = {"completion_tokens": n}
                if accept:
                    meta.update(spec_verify_ct=round(n / accept), spec_accept_length=n / round(n / accept))
                self._send({"output_ids": [t + 1 for t in body["input_ids"]][:n], "meta_info": meta})
            else:
                self._send({"choices": [{"text": "x"}], "usage": {"completion_tokens": body["max_tokens"]}})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def servers():
    a, url_a = _fake(2.0)
    b, url_b = _fake(None)
    yield url_a, url_b
    a.shutdown()
    b.shutdown()


def test_percentile():
    assert bench.percentile([], 50) is None
    assert bench.percentile([1, 2, 3, 4], 50) == 2.5
    assert bench.percentile([5], 99) == 5


def test_report_with_baseline(servers, capsys):
    url, base = servers
    prompts = bench.random_prompts(6, 5, 100)
    rep = bench.run([url, base], prompts, concurrency=3, max_new_tokens=8)
    s, b = rep["servers"]
    assert s["single"]["accept_length"] == pytest.approx(2.0) and s["single"]["accept_length_pooled"] == pytest.approx(
        2.0
    )
    assert b["single"]["accept_length"] is None and s["concurrent"]["requests"] == 6
    assert s["single"]["output_tokens"] == 48 and rep["ratios"]["same_outputs"]
    table = bench.format_table(rep)
    assert "accept len" in table and "2.00" in table and "same outputs (single stream): yes" in table
    assert "c=3" in capsys.readouterr().err  # the progress bar


def test_cli_json_and_openai(servers):
    url, base = servers
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(
            [
                "bench",
                url,
                "--baseline",
                base,
                "--vocab-size",
                "50",
                "--num-prompts",
                "3",
                "--json",
                "--no-progress",
                "--max-new-tokens",
                "4",
                "--concurrency",
                "2",
            ]
        )
    assert rc == 0
    rep = json.loads(out.getvalue())
    assert rep["servers"][0]["single"]["accept_length"] == pytest.approx(2.0) and "ratios" in rep
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["bench", url, "--api", "openai", "--prompt", "hello", "--concurrency", "1", "--no-progress"]) == 0
    assert "server" in out.getvalue()


def test_unreachable_server_is_an_error(capsys):
    bench_wait = bench.wait_ready
    with pytest.raises(Eagle3Error, match="no SGLang server answers at http://127.0.0.1:9"):
        bench_wait("http://127.0.0.1:9", timeout=0.5)


def test_a_cycle_is_priced_in_plain_decode_steps():
    # 2.5 tokens a cycle at 1.0 tok/s against 2.0 tok/s plain: a cycle lasts 2.5 s, a plain step 0.5 s
    assert bench.cycle_in_plain_steps(2.5, 1.0, 2.0) == pytest.approx(5.0)
    assert 2.5 / bench.cycle_in_plain_steps(2.5, 1.0, 2.0) == pytest.approx(1.0 / 2.0)  # the speed ratio
    assert bench.cycle_in_plain_steps(None, 1.0, 2.0) is None and bench.cycle_in_plain_steps(2.5, 0.0, 2.0) is None


def test_the_expected_speedup_is_the_accept_length_over_the_cycles_cost():
    assert bench.expected_speedup(3.0, steps=3, draft_cost=0.0) == pytest.approx(3.0)
    assert bench.expected_speedup(3.0, steps=3, draft_cost=0.05) == pytest.approx(3.0 / 1.15)
    assert bench.expected_speedup(3.0, steps=2, draft_cost=0.5, verify_cost=2.0) == pytest.approx(1.0)


def test_the_table_prices_the_cycle(servers):
    url, base = servers
    rep = bench.run([url, base], bench.random_prompts(2, 5, 100), concurrency=1, max_new_tokens=8, progress=False)
    steps = rep["ratios"]["single"]["cycle_in_plain_steps"]
    assert steps == pytest.approx(2.0 / rep["ratios"]["single"]["output_tokens_per_s"])
    assert f"costs the wall time of {steps:.2f} baseline decode steps" in bench.format_table(rep)


def test_the_demo_explains_its_ratio_from_its_own_measurements(tool):
    demo = tool("demo_cpu")
    report = {
        "servers": [{"single": {"accept_length_pooled": 2.0}}],
        "ratios": {"single": {"cycle_in_plain_steps": 4.0}},
    }
    parts = {"plain_decode": 0.1, "cycle": 0.4, "draft": 0.1, "verify": 0.25, "forward_draft_extend_after_decode": 0.05}
    text = "\n".join(demo.why_slower_here(report, parts, steps=3))
    assert "2.00 / 4.0 = x0.50" in text
    assert "an EAGLE3 cycle 0.40 s = 4.00 plain steps" in text
    assert "draft steps 1.00, target verify 2.50, draft extend 0.50" in text
    assert f"x{bench.expected_speedup(2.0, 3, 0.03):.1f} with c = 0.03" in text
    assert demo.why_slower_here({**report, "ratios": {"single": {"cycle_in_plain_steps": None}}}, parts, 3) == []
