"""eagle3_probe and ``eagle3-patches probe-report``.

The sglang runs (one isolated process each) drive the real TpModelWorker + EAGLEWorker on the
tiny Kimi-K2.5 (hidden 64, aux ids [1, 2, 3]): with the patches the probe sees 3 x 64 at the
target's output and at the draft's input with fc applied; with ``--speculative-algorithm EAGLE``
and both guards off it sees 64 at both, fc skipped, and the report names the target output as
the first wrong hop with the flag as the cause; with the probe off nothing of it runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_patches.instruments.probe_diagnosis import hop_of
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.tiny_models import DRAFT_AUX_IDS, HIDDEN

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
PATH_MODES = {
    ("target_output", "extend"),
    ("draft_input", "extend"),
    ("draft_input", "decode"),
    ("target_output", "target_verify"),
    ("draft_input", "draft_extend"),
}


def _with_probe() -> list[str]:
    import eagle3_patches

    reg = eagle3_patches.get_registry()
    return [n for n in reg.names() if reg[n].default_enabled] + ["eagle3_probe"]


def _serve(target: str, draft: str, algorithm: str, decode_steps: int):
    """Prefill + ``decode_steps`` speculative steps through the real workers; what the probe did."""
    import torch
    import wrapt
    from sglang.srt.model_executor.model_runner import ModelRunner

    import eagle3_patches
    from eagle3_patches.instruments import eagle3_probe
    from eagle3_patches.testing import sglang_harness as h

    log = h.eagle3_log()
    sa = h.eagle3_server_args(target, draft, algorithm=algorithm)
    tw, dw = h.eagle_workers(sa)
    res, batch = h.eagle_prefill(tw, dw, PROMPTS)
    for req, tok in zip(batch.reqs, res.next_token_ids.tolist()):
        req.output_ids.append(tok)
    batch.output_ids = res.next_token_ids
    for _ in range(decode_steps):
        batch.prepare_for_decode()
        with torch.no_grad():
            res = dw.forward_batch_generation(batch)
        batch.output_ids = res.next_token_ids
    out = {
        "pid": __import__("os").getpid(),
        "counters": dict(eagle3_probe.COUNTERS),
        "lines": [(r.levelname, r.getMessage()) for r in log if r.getMessage().startswith("eagle3-patches probe")],
        "probe_state": eagle3_patches.status()["eagle3_probe"].state.value,
        "forward_wrapped": isinstance(ModelRunner.__dict__["forward"], wrapt.FunctionWrapper),
    }
    eagle3_patches.revert(["eagle3_probe"])
    fwd = ModelRunner.__dict__["forward"]
    out["reverted_to_sglang"] = not isinstance(fwd, wrapt.FunctionWrapper) and fwd.__module__ == ModelRunner.__module__
    return out


def _records(directory: Path) -> tuple[list[Path], dict]:
    files = sorted(directory.glob("probe-*.jsonl"))
    recs = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    by_key: dict = {}
    for r in recs:
        by_key.setdefault((r["hop"], r["mode"]), []).append(r)
    return files, by_key


# --------------------------------------------------------------------------- correct setup
@pytest.fixture(scope="module")
def eagle3_run(tiny, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("probe-eagle3")
    out = run_isolated(
        _serve,
        str(tiny["kimi_k25"]),
        str(tiny["draft"]),
        "EAGLE3",
        2,
        patches=_with_probe(),
        env={"EAGLE3_PATCHES_PROBE": str(out_dir)},
    )
    return out, out_dir


@pytest.mark.sglang
def test_probe_sees_3h_at_the_target_output_and_the_draft_input_once_per_mode(eagle3_run):
    out, out_dir = eagle3_run
    assert out["probe_state"] == "applied" and out["forward_wrapped"]
    files, by_key = _records(out_dir)
    assert [f.name for f in files] == [f"probe-{out['pid']}.jsonl"]
    assert set(by_key) == PATH_MODES
    assert all(len(v) == 1 for v in by_key.values())  # once per (process, hop, mode), over 2 decode steps
    rec = {k: v[0] for k, v in by_key.items()}

    target = rec[("target_output", "extend")]
    assert target["algorithm"] == "EAGLE3" and target["model"] == "KimiK25ForConditionalGeneration"
    assert target["aux_ids_configured"] == list(DRAFT_AUX_IDS)
    assert target["layers_to_capture"] == [i + 1 for i in DRAFT_AUX_IDS]
    assert target["captured_states"] == 3 and target["width"] == 3 * HIDDEN == target["expected_width"]
    assert target["pid"] == out["pid"] and target["tp_rank"] == 0
    assert rec[("target_output", "target_verify")]["width"] == 3 * HIDDEN

    for mode in ("extend", "draft_extend"):  # the target's states entering the draft
        draft = rec[("draft_input", mode)]
        assert draft["width"] == 3 * HIDDEN == draft["fc_in_features"]
        assert draft["fc_applied"] is True and draft["fc_observed"] == "observed"
        assert draft["dtype"] == "float32"
        assert draft["stats"]["nan"] is False and draft["stats"]["std"] > 0
    decode = rec[("draft_input", "decode")]  # the draft's own states: fc skipped by design
    assert decode["width"] == HIDDEN and decode["fc_applied"] is False

    # one statistics sync per record, none per step; the wrapper ran on every forward
    c = out["counters"]
    assert c["records"] == c["stats"] == len(PATH_MODES) < c["calls"]
    assert [lvl for lvl, _ in out["lines"]] == ["INFO"] * len(PATH_MODES)
    assert out["reverted_to_sglang"]


@pytest.mark.sglang
def test_probe_report_passes_the_correct_setup(eagle3_run, capsys):
    from eagle3_patches.cli import main

    _, out_dir = eagle3_run
    assert main(["probe-report", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert "OK:" in text and "WRONG" not in text and "fc applied" in text


# --------------------------------------------------------------------------- EAGLE, guards off
@pytest.fixture(scope="module")
def eagle_run(tiny, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("probe-eagle")
    out = run_isolated(
        _serve,
        str(tiny["kimi_k25"]),
        str(tiny["draft"]),
        "EAGLE",
        0,
        patches=_with_probe(),
        env={"EAGLE3_PATCHES_PROBE": str(out_dir), "EAGLE3_PATCHES_DISABLE": "eagle3_algorithm_guard,eagle3_fc_guard"},
    )
    return out, out_dir


@pytest.mark.sglang
def test_probe_sees_h_and_the_silent_fc_skip_and_the_report_names_the_cause(eagle_run, capsys):
    from eagle3_patches.cli import main
    from eagle3_patches.probe_report import report

    out, out_dir = eagle_run
    _, by_key = _records(out_dir)
    target, draft = by_key[("target_output", "extend")][0], by_key[("draft_input", "extend")][0]
    assert target["algorithm"] == "EAGLE" and target["capture_aux_hidden_states"] is False
    assert target["width"] == HIDDEN and target["captured_states"] == 0 and target["expected_width"] == 3 * HIDDEN
    assert draft["width"] == HIDDEN and draft["fc_in_features"] == 3 * HIDDEN
    assert draft["fc_applied"] is False  # the silent skip, observed
    assert [lvl for lvl, _ in out["lines"]] == ["WARNING", "WARNING"]

    r = report([out_dir])
    assert r.exit_code == 1
    assert hop_of(r.first) == ("target_output", "extend")
    assert "--speculative-algorithm EAGLE" in r.first.cause and "EAGLE3" in r.first.fix
    assert "algorithm-eagle-with-eagle3-draft" in r.first.related
    skip = next(p for p in r.problems if hop_of(p)[0] == "draft_input")
    assert hop_of(skip)[1] == "extend" and "silent skip" in skip.what and "fc was skipped" in skip.what

    assert main(["probe-report", str(out_dir), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_wrong_hop"]["where"].startswith("target_output in extend")
    assert main(["probe-report", str(out_dir)]) == 1
    text = capsys.readouterr().out
    assert "FIRST WRONG HOP: target_output in extend" in text and "silent skip" in text


# --------------------------------------------------------------------------- probe off
def _serve_without_probe(target: str, draft: str):
    import wrapt
    from sglang.srt.model_executor.model_runner import ModelRunner

    import eagle3_patches
    from eagle3_patches.instruments import eagle3_probe
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft)
    tw, dw = h.eagle_workers(sa)
    h.eagle_prefill(tw, dw, PROMPTS)
    fwd = ModelRunner.__dict__["forward"]
    return {
        "probe_state": eagle3_patches.status()["eagle3_probe"].state.value,
        "others": {n: s.state.value for n, s in eagle3_patches.status().items() if n != "eagle3_probe"},
        "wrapped": isinstance(fwd, wrapt.FunctionWrapper)
        or eagle3_patches.get_instruments().is_object_patched(ModelRunner, "forward"),
        "sglang_function": fwd.__module__ == ModelRunner.__module__ and fwd.__qualname__ == "ModelRunner.forward",
        "counters": dict(eagle3_probe.COUNTERS),
    }


@pytest.mark.sglang
def test_probe_off_runs_no_probe_code(tiny):
    out = run_isolated(
        _serve_without_probe, str(tiny["kimi_k25"]), str(tiny["draft"]), patches="all", env={"EAGLE3_PATCHES_PROBE": ""}
    )
    assert out["probe_state"] == "not-selected"
    assert out["others"]["eagle3_fc_guard"] == "applied"
    assert not out["wrapped"] and out["sglang_function"]
    assert out["counters"] == {"calls": 0, "records": 0, "stats": 0}


# --------------------------------------------------------------------------- no sglang
def test_probe_output_and_run_environment(tmp_path):
    from eagle3_patches import settings
    from eagle3_patches._bootstrap import child_environment
    from eagle3_patches.instruments.eagle3_probe import output_file

    assert output_file(str(tmp_path), pid=42) == str(tmp_path / "probe-42.jsonl")
    assert output_file(str(tmp_path / "all.jsonl")) == str(tmp_path / "all.jsonl")
    assert output_file("") is None

    # the probe is an instrument: its own setting switches it on, whatever the patch selection
    env = child_environment(probe=str(tmp_path), base={"EAGLE3_PATCHES_ENABLE": "hidden_state_dump"})
    assert env[settings.PROBE] == str(tmp_path) and env[settings.APPLY] == "all"
    assert env[settings.ENABLE] == "hidden_state_dump"
    env = child_environment(patches="eagle3_fc_guard", probe="1", base={})
    assert env[settings.APPLY] == "eagle3_fc_guard" and env[settings.PROBE] == "1"
    assert settings.PROBE not in child_environment(base={})


def test_run_probe_reaches_the_command_without_importing_sglang(tmp_path):
    """``run --probe PATH`` and the bare variable both select the probe in the started process."""
    import os
    import subprocess
    import sys

    code = (
        "import json, os, sys, eagle3_patches; print(json.dumps([eagle3_patches.status()['eagle3_probe'].state.value,"
        " os.environ.get('EAGLE3_PATCHES_PROBE'), 'sglang' in sys.modules]))"
    )
    cli = [sys.executable, "-m", "eagle3_patches", "run"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_PATCHES_")}
    for args, extra, expected in [
        (["--probe", str(tmp_path)], {}, ["pending", str(tmp_path), False]),
        ([], {"EAGLE3_PATCHES_PROBE": "1"}, ["pending", "1", False]),
        ([], {}, ["not-selected", None, False]),
    ]:
        out = subprocess.run(
            [*cli, *args, "--", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**base, **extra},
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


def test_probe_report_usage_errors_exit_2_without_traceback(tmp_path, capsys):
    from eagle3_patches.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.jsonl").write_text('not json\n{"a": 1}\n')
    for arg, message in [
        (tmp_path / "missing", "no such file"),
        (tmp_path / "empty", "no probe files"),
        (tmp_path / "garbage.jsonl", "no eagle3-patches probe records"),
    ]:
        assert main(["probe-report", str(arg)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_probe_report_names_lost_captures_and_ranks_that_disagree(tmp_path):
    """Capture on but 2 of 3 states arrive (an id the forward never reaches): cause and doctor codes;
    two TP ranks storing different states for the same batch: a note naming the all-reduce fusion."""
    from eagle3_patches.probe_report import report

    target = {
        "probe": 1,
        "algorithm": "EAGLE3",
        "hop": "target_output",
        "mode": "extend",
        "hidden_size": 64,
        "width": 128,
        "tokens": 8,
        "capture_aux_hidden_states": True,
        "layers_to_capture": [2, 3, 6],
        "expected_width": 192,
    }
    draft = {
        "probe": 1,
        "pid": 7,
        "tp_rank": 0,
        "algorithm": "EAGLE3",
        "hop": "draft_input",
        "mode": "extend",
        "width": 128,
        "fc_in_features": 192,
        "embed_width": 64,
        "fc_applied": True,
        "stats": {"nan": False},
    }
    rank0 = [{**target, "pid": 7, "tp_rank": 0, "stats": {"std": 1.0, "nan": False}}, draft]
    (tmp_path / "probe-7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rank0) + '{"probe": 1, "hop"')
    (tmp_path / "probe-8.jsonl").write_text(
        json.dumps({**target, "pid": 8, "tp_rank": 1, "stats": {"std": 0.4}}) + "\n"
    )
    r = report([tmp_path])
    assert r.exit_code == 1 and (*hop_of(r.first), r.first.context["tp_rank"]) == ("target_output", "extend", 0)
    assert r.first.cause.startswith("2 of 3 configured states captured")
    assert "aux-ids-out-of-range" in r.first.related
    assert any("1 line(s) skipped" in n for n in r.notes)  # a cut-off last line is skipped, not fatal
    assert any("tp-allreduce-fusion" in n and "rank 1: std 0.4" in n for n in r.notes)


def test_probe_report_with_the_fc_guard_on_still_names_the_algorithm():
    """The guard stops the draft forward; the probe's draft record carries the error, the cause stays the flag."""
    from eagle3_patches.instruments.probe_diagnosis import analyse

    base = {"probe": 1, "pid": 9, "tp_rank": 0, "algorithm": "EAGLE"}
    recs = [
        {
            **base,
            "hop": "target_output",
            "mode": "extend",
            "hidden_size": 64,
            "width": 64,
            "tokens": 5,
            "capture_aux_hidden_states": False,
            "layers_to_capture": [],
            "expected_width": 192,
        },
        {
            **base,
            "hop": "draft_input",
            "mode": "extend",
            "width": 64,
            "fc_in_features": 192,
            "embed_width": 64,
            "fc_applied": None,
            "error": "Eagle3CaptureError: eagle3-patches: the EAGLE-3 draft's fc would be skipped",
        },
    ]
    r = analyse(recs)
    assert [hop_of(p) for p in r.problems] == [("target_output", "extend"), ("draft_input", "extend")]
    assert "--speculative-algorithm EAGLE" in r.first.cause
    assert "raised Eagle3CaptureError" in r.problems[1].what and "--speculative-algorithm EAGLE" in r.problems[1].cause
