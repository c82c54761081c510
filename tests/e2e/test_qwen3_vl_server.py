"""The real ``sglang.launch_server`` speculating with EAGLE-3 on a Qwen3-VL target (qwen3_vl_eagle3_capture).

Tiny Qwen3-VL target (transformers' own class, random weights; text prompts, the processor left out:
``Server(text_only=True)``), the tiny EAGLE-3 draft (random, so the accept length stays near 1.0:
no Qwen3-VL draft was trained here; what is proven is the wiring): stock refuses or fails at start,
the patched server's greedy outputs equal the server without speculation, and the probe shows the
draft's ``fc`` fed 3 x hidden from the target.
"""

from __future__ import annotations

import json

import pytest
from support.releases import requires_patch

from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.server import Server, ServerError, speculative_flags
from eagle3_patches.testing.tiny_vl_models import build_qwen3_vl

pytestmark = [pytest.mark.server, pytest.mark.timeout(900), requires_patch("qwen3_vl_eagle3_capture")]
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


@pytest.fixture(scope="module")
def served(tiny_root, tiny, tmp_path_factory) -> dict:
    target = str(build_qwen3_vl(tiny_root / "tiny-qwen3-vl-dense"))
    tmp = tmp_path_factory.mktemp("qwen3-vl")
    out = {}
    for name, args, env in (
        ("baseline", [], {}),
        ("eagle3", speculative_flags(str(tiny["draft"])), {"EAGLE3_PATCHES_PROBE": str(tmp / "probe")}),
    ):
        server = Server(target, args, log_path=tmp / f"{name}.log", env=env, text_only=True)
        try:
            server.start()
            out[name] = [server.generate(p, 12) for p in PROMPTS]
        except ServerError as exc:
            pytest.fail(f"{name} server did not start: {exc}")
        finally:
            server.stop()
    out["probe"] = [
        json.loads(line) for f in sorted((tmp / "probe").glob("*.jsonl")) for line in f.read_text().splitlines()
    ]
    return out


def test_eagle3_on_qwen3_vl_gives_the_outputs_of_no_speculation(served, figure):
    assert [r["output_ids"] for r in served["eagle3"]] == [r["output_ids"] for r in served["baseline"]]
    accept = [r["meta_info"]["spec_accept_length"] for r in served["eagle3"]]
    assert all(a >= 1.0 for a in accept)  # it speculated (verify steps happened)
    figure(
        f"Qwen3-VL EAGLE3 server (tiny, random draft): accept length {sum(accept) / len(accept):.2f}, outputs identical"
    )


def test_the_draft_fc_is_fed_3h_from_the_qwen3_vl_target(served):
    fed = [r for r in served["probe"] if r.get("hop") == "draft_input" and r.get("mode") == "extend"]
    assert fed and fed[0]["width"] == 3 * tm.HIDDEN and fed[0].get("fc_applied") is True
    target = [r for r in served["probe"] if r.get("hop") == "target_output" and r.get("mode") == "extend"]
    assert target and target[0]["width"] == 3 * tm.HIDDEN


def test_stock_qwen3_vl_server_cannot_start_with_an_eagle3_draft(tiny_root, tiny, tmp_path):
    target = str(build_qwen3_vl(tiny_root / "tiny-qwen3-vl-dense"))
    server = Server(
        target,
        speculative_flags(str(tiny["draft"])),
        log_path=tmp_path / "stock.log",
        text_only=True,
        disable=["qwen3_vl_eagle3_capture"],
    )
    assert server.wait_exit(timeout=300) != 0
    log = server.log()
    assert "Qwen3VLForConditionalGeneration" in log and "qwen3_vl_eagle3_capture" in log  # the launcher names the patch
