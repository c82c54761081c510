"""The real CPU servers the e2e tests share (session-scoped fixtures, registered by tests/e2e/conftest.py: one
start each, however many modules use them), and the constants the tests compare with.

Tiny Kimi-K2.5 target (random weights) + the tiny EAGLE-3 draft trained on the target's own greedy
continuations (``tools/train_tiny_draft.py``, committed tensors), served under
``eagle3-patches run --cpu-profile`` (docs/e2e.md).  Each fixture starts one server in its own process
group on a free loopback port, sends every request its tests need, reads ``/metrics`` where metrics are
on, and always kills the group before returning; a server that fails to start fails the test with its log.

The accept-length watchdog runs in every one of them (on by default) with a small window so that a few
requests fill several windows: :data:`WATCHDOG_ENV` (tests/e2e/test_watchdog.py reads its figures).
"""

from __future__ import annotations

import json

import pytest

from eagle3_patches import settings
from eagle3_patches.testing import tiny_models
from eagle3_patches.testing.server import ServerError, held_out_prompts, serve, speculative_flags

MAX_NEW_TOKENS = 24
PROMPTS = held_out_prompts(4)
#: 16 verify steps a window after 4 of warm-up, so that a few requests (each about 10-23 verify steps) fill
#: several windows; the interval stays at its default (one report per server).  8-step windows were too
#: noisy for a healthy draft at temperature 1.0: one fell to 1.12 (docs/troubleshooting.md)
WATCHDOG_ENV = {settings.WATCHDOG_WINDOW: "16", settings.WATCHDOG_WARMUP: "4"}


def serve_or_fail(name: str, model: str, args, tmp, prompts, **kw) -> dict:
    try:
        return serve(model, args, tmp / f"{name}.log", prompts, max_new_tokens=MAX_NEW_TOKENS, **kw)
    except ServerError as exc:
        pytest.fail(f"{name} server failed: {exc}")


def probe_records(probe_dir) -> list[dict]:
    """The diagnostic probe's JSON lines (``EAGLE3_PATCHES_PROBE=<dir>``: one file per process)."""
    return [
        json.loads(line)
        for f in sorted(probe_dir.glob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]


@pytest.fixture(scope="session")
def models(tiny_root) -> dict[str, str]:
    target = tiny_models.build_kimi_k25(tiny_root / "tiny-kimi-k25")
    draft = tiny_models.build_trained_eagle3_draft(tiny_root)
    return {"target": str(target), "draft": str(draft)}


@pytest.fixture(scope="session")
def eagle3(models, tmp_path_factory) -> dict:
    """EAGLE3 with the patches, the diagnostic probe writing JSON lines, metrics on; greedy."""
    tmp = tmp_path_factory.mktemp("eagle3")
    probe_dir = tmp / "probe"
    out = serve_or_fail(
        "eagle3",
        models["target"],
        [*speculative_flags(models["draft"], "EAGLE3"), "--enable-metrics"],
        tmp,
        PROMPTS,
        metrics=True,
        env={settings.PROBE: str(probe_dir), **WATCHDOG_ENV},
    )
    out["probe"] = probe_records(probe_dir)
    return out


@pytest.fixture(scope="session")
def eagle_unguarded(models, tmp_path_factory) -> dict:
    """``--speculative-algorithm EAGLE`` with the EAGLE-3 draft and both guards disabled: the field's symptom."""
    return serve_or_fail(
        "eagle-unguarded",
        models["target"],
        [*speculative_flags(models["draft"], "EAGLE"), "--enable-metrics"],
        tmp_path_factory.mktemp("eagle"),
        PROMPTS[:2],
        metrics=True,
        env=dict(WATCHDOG_ENV),
        disable=["eagle3_algorithm_guard", "eagle3_fc_guard"],
    )
