"""EAGLE-3.1 MLA drafts (``Eagle3DeepseekV2ForCausalLM`` with ``fc_norm`` / ``norm_output``, as
``lightseekorg/kimi-k2.6-eagle3.1-mla`` and ``kimi-k2.7-coder-eagle3.1-mla`` are published): on every release with the
MLA draft's class, served with their norms or refused at start (``eagle3_draft_config_fields``, judging the draft by
``kimi_k25_eagle3.py``, not ``llama_eagle3.py``).

sglang 0.5.12's ``kimi_k25_eagle3.py`` logs "skipping unexpected weight" for ``fc_norm.<i>.weight`` and never reads
``norm_output``: stock, the draft loads and is served without its norms.  0.5.13 and later build both.  On the
installed release, the real launcher (``ServerArgs`` resolved as ``launch_server`` resolves them) and the real draft
``ModelRunner`` beside the tiny Kimi-K2.5, stock and with the patch set, in one process each."""

from __future__ import annotations

import pytest
from support import mla_draft_norms as M
from support.releases import only_release, sglang_version

from eagle3_patches.checkpoint import draft_fields as F
from eagle3_patches.testing.isolation import run_isolated

pytestmark = [
    pytest.mark.sglang,
    only_release(">=0.5.12", "sglang's MLA draft class (models/kimi_k25_eagle3.py) arrived in 0.5.12"),
]

#: the drafts: both fields with their weights (as published), norm_output alone (no weight of its own: only the
#: config says it), and the plain MLA draft
#: the draft is what is judged here, not image input (which the tiny Kimi-K2.5 cannot preprocess)
TEXT_ONLY = {"enable_multimodal": False}
CASES = {"eagle31": ({}, True), "norm_output": ({"norm_output": True}, False), "plain": ({"fc_norm": False}, False)}


def _reads() -> frozenset[str]:
    """What the installed release's MLA draft module reads (its own source; the table must agree)."""
    found = F.installed_source(F.MLA_DRAFT_MODULE)
    assert found is not None
    read = F.fields_read(found[1]) & set(F.candidate_names())
    assert read == F.read_by_release(tuple(sglang_version().release), F.MLA_DRAFT_MODULE)
    return read


@pytest.fixture(scope="module")
def drafts(tiny, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mla-norms")
    return {
        name: str(M.build_eagle31_mla_draft(root / name, fields or None, weights))
        for name, (fields, weights) in CASES.items()
    }


@pytest.fixture(scope="module")
def stock(tiny, drafts):
    return run_isolated(M.served_norms, str(tiny["kimi_k25"]), drafts, patches=None, **TEXT_ONLY)


@pytest.fixture(scope="module")
def patched(tiny, drafts):
    return run_isolated(M.served_norms, str(tiny["kimi_k25"]), drafts, patches="all", **TEXT_ONLY)


def _served_with_norms(got: dict) -> bool:
    load = got["load"]
    k = 3
    return (
        got["launch"] == ("ok", "EAGLE3")
        and load["ok"]
        and load["fc_norm"] is not None
        and len(load["fc_norm"]) == k
        and all(w == [M.FC_NORM_WEIGHT] * len(w) for w in load["fc_norm"])
        and load["norm_output"] is True
        and not load["skipped"]
    )


@pytest.mark.runtime_only
def test_patched_serves_the_eagle31_mla_draft_with_its_norms_or_refuses_it_naming_the_release(patched):
    """The rule of this issue, on the installed release: never served without the norms."""
    got = patched["eagle31"]
    if {"fc_norm", "norm_output"} <= _reads():
        assert _served_with_norms(got), got
        return
    kind, message = got["launch"]
    assert kind == "Eagle3ConfigError", got
    assert "Eagle3DeepseekV2ForCausalLM never reads" in message and "config.json: fc_norm" in message
    assert "sglang >= 0.5.13" in message


@pytest.mark.runtime_only
def test_patched_refuses_norm_output_alone_where_the_release_ignores_it(patched):
    """norm_output has no weight: the strict loader cannot see it; only the config check does."""
    got = patched["norm_output"]
    if "norm_output" in _reads():
        assert got["launch"] == ("ok", "EAGLE3") and got["load"]["norm_output"] is True, got
        return
    kind, message = got["launch"]
    assert kind == "Eagle3ConfigError" and "config.json: norm_output" in message, got


@pytest.mark.runtime_only
def test_patched_loads_the_eagle31_weights_or_refuses_them_at_load(patched):
    """Past the launcher (a process that skipped it), the strict loader refuses fc_norm.<i>.weight where the class
    has no parameter for it, as the doctor's keys-unknown says."""
    load = patched["eagle31"]["load"]
    if "fc_norm" in _reads():
        assert load["ok"] and load["fc_norm"] is not None, load
        return
    assert not load["ok"] and load["type"] == "Eagle3ConfigError", load
    assert "fc_norm.0.weight" in load["message"] and "does not match Eagle3DeepseekV2ForCausalLM" in load["message"]
    assert "sglang >= 0.5.13 reads it" in load["message"]


@pytest.mark.runtime_only
def test_patched_lets_the_plain_mla_draft_through(patched):
    got = patched["plain"]
    assert got["launch"] == ("ok", "EAGLE3") and got["load"]["ok"], got
    assert got["load"]["fc_norm"] is None and not got["load"]["norm_output"]


@pytest.mark.stock
def test_stock_serves_the_eagle31_mla_draft_as_its_class_reads_it(stock):
    """0.5.12: launched, loaded, fc_norm.<i>.weight skipped with a warning line, no fc_norm, no norm_output: the
    silent failure.  0.5.13 and later: the norms, as the patched process has them."""
    got = stock["eagle31"]
    assert got["launch"] == ("ok", "EAGLE3") and got["load"]["ok"], got
    if {"fc_norm", "norm_output"} <= _reads():
        assert _served_with_norms(got), got
        return
    assert got["load"]["fc_norm"] is None and got["load"]["norm_output"] is None, got
    assert any("fc_norm.0.weight" in line for line in got["load"]["skipped"]), got
