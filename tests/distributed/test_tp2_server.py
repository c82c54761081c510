"""The real `sglang.launch_server --device cpu --tp 2` on the tiny Kimi-K2.5 with EAGLE3.

Patches active in every rank (evidence: one log line per rank with rank and pid); without the
Kimi delegation the launcher refuses once with a clear message; fully stock, every rank dies
with the AttributeError (the patches are what made the difference).
"""

from __future__ import annotations

import re

import pytest

from eagle3_patches.testing.server import Server, speculative_flags

pytestmark = [pytest.mark.server, pytest.mark.tp2]

EAGLE3_DEFAULTS = [
    "kimi_k25_eagle3_delegation",
    "aux_capture_validation",
    "cuda_graph_capture_order",
    "tp_allreduce_fusion_capture",
    "eagle3_draft_strict_loading",
    "eagle3_fc_guard",
    "eagle3_algorithm_guard",
    "eagle3_target_capability",
]
RANK_LINE = re.compile(
    r"eagle3-patches: tp rank (\d)/2 pid (\d+): aux layer ids \[1, 2, 3\] -> layers_to_capture \[2, 3, 4\]; (.*)"
)


def _server(tiny, tmp_path, name, disable=()):
    args = ["--tp", "2", "--disable-custom-all-reduce", *speculative_flags(str(tiny["draft"]))]
    return Server(str(tiny["kimi_k25"]), args, log_path=tmp_path / f"{name}.log", disable=disable)


def test_tp2_eagle3_server_has_the_patches_in_every_rank(tiny, tmp_path, figure):
    with _server(tiny, tmp_path, "tp2") as server:
        out = server.generate([5, 6, 7, 8, 9], max_new_tokens=8)
        log = server.log()
    assert len(out["output_ids"]) == 8
    assert out["meta_info"]["spec_verify_ct"] >= 1  # it speculated
    ranks = {}
    for rank, pid, states in RANK_LINE.findall(log):
        ranks[int(rank)] = (int(pid), dict(s.split("=") for s in states.split(", ")))
    for r, (pid, states) in sorted(ranks.items()):
        figure(f"TP 2 server: rank {r} pid {pid}: {sum(v == 'applied' for v in states.values())} patches applied")
    assert sorted(ranks) == [0, 1]
    assert ranks[0][0] != ranks[1][0]
    for _, states in ranks.values():
        assert all(states[name] == "applied" for name in EAGLE3_DEFAULTS), states


def test_tp2_without_the_kimi_delegation_is_refused_once_in_the_launcher(tiny, tmp_path):
    server = _server(tiny, tmp_path, "no-delegation", disable=["kimi_k25_eagle3_delegation"])
    assert server.wait_exit(timeout=240) == 1
    log = server.log()
    assert log.count("cannot serve an EAGLE-3 draft") == 1
    assert "kimi_k25_eagle3_delegation" in log and "Traceback" not in log
    assert "TP0" not in log and "TP1" not in log  # no rank was started


def test_tp2_stock_fails_in_every_rank_as_stock_0_5_9_does(tiny, tmp_path):
    server = _server(tiny, tmp_path, "stock", disable=EAGLE3_DEFAULTS)
    assert server.wait_exit(timeout=240) != 0
    log = server.log()
    assert "'KimiK25ForConditionalGeneration' object has no attribute 'set_eagle3_layers_to_capture'" in log
    assert "eagle3-patches: tp rank" not in log
