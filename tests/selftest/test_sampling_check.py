"""selftest's GPU check ``sampling_lossless``: its verdict on the two servers' answers (the servers themselves run on
a GPU only; here their answers are given), and its place among the GPU checks."""

from __future__ import annotations

import numpy as np
import pytest

from eagle3_patches.selftest.base import Context, Device
from eagle3_patches.selftest.checks import BY_NAME
from eagle3_patches.selftest.checks import sampling_lossless as check


def _answers(seed: int, greedy_after_first: bool = False) -> dict[str, list[dict]]:
    """``SAMPLES`` sequences per setting from a small Markov chain; ``greedy_after_first``: every token after the
    first is the chain's most likely one (a verify that ignores the request's sampling parameters)."""
    rng = np.random.default_rng(seed)
    step = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    out = {}
    for setting in check.SETTINGS:
        rows = []
        for _ in range(check.SAMPLES):
            seq = [int(rng.integers(3))]
            while len(seq) < check.TOKENS:
                p = step[seq[-1]]
                seq.append(int(p.argmax()) if greedy_after_first else int(rng.choice(3, p=p)))
            rows.append({"output_ids": seq, "meta_info": {"spec_accept_length": 2.0}})
        out[setting] = rows
    return out


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    monkeypatch.setattr(Context, "path", lambda self, name: str(tmp_path / name))
    return Context(tmp_path, Device("cuda", 1, "a GPU"), None)


def _run(ctx, monkeypatch, eagle3: dict, plain: dict):
    monkeypatch.setattr(check, "_answers", lambda ctx, target, args, name, logs: eagle3 if args else plain)
    return check.sampled_like_no_speculation(ctx)


def test_the_same_distribution_passes(ctx, monkeypatch):
    finding = _run(ctx, monkeypatch, _answers(1), _answers(2))
    assert finding.fixed, finding.patched
    assert all(setting in finding.patched for setting in check.SETTINGS) and "accept length 2.00" in finding.patched


def test_a_verify_that_ignores_the_sampling_parameters_fails(ctx, monkeypatch):
    finding = _run(ctx, monkeypatch, _answers(1, greedy_after_first=True), _answers(2))
    assert not finding.fixed and "DIFFERENT distributions" in finding.patched


def test_a_server_that_does_not_answer_fails_with_its_reason(ctx, monkeypatch):
    from eagle3_patches.testing.server import ServerError

    def refuse(*a):
        raise ServerError("eagle3 server: exited with 1")

    monkeypatch.setattr(check, "_answers", refuse)
    finding = check.sampled_like_no_speculation(ctx)
    assert not finding.fixed and "exited with 1" in finding.patched


def test_it_is_a_gpu_check_of_sglang_itself():
    registered = BY_NAME["sampling_lossless"]
    assert registered.needs == ("cuda",) and registered.patch is None
    assert "needs a CUDA device" in registered.skip_reason(Context(".", Device("cpu"), None))
