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
import shutil
import subprocess
import sys
import time

import pytest
from support.releases import patch_applies

from eagle3_patches import settings
from eagle3_patches.selftest.checks import sampling_lossless
from eagle3_patches.testing import tiny_models, tiny_vl_models
from eagle3_patches.testing.server import Server, ServerError, held_out_prompts, serve, speculative_flags

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


def dumped_rows(dump_dir) -> int:
    """The rows (tokens) the ``hidden_state_dump`` shards in ``dump_dir`` hold so far."""
    from safetensors import safe_open

    rows = 0
    for shard in dump_dir.glob("shard-*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            rows += f.get_slice("input_ids").get_shape()[0]
    return rows


def probe_records(probe_dir) -> list[dict]:
    """The diagnostic probe's JSON lines (``EAGLE3_PATCHES_PROBE=<dir>``: one file per process)."""
    return [
        json.loads(line)
        for f in sorted(probe_dir.glob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]


#: the lossless check (tests/e2e/test_sampling.py): SAMPLES copies of one short prompt in one batched request, at
#: each sampling setting of selftest's GPU check (its prompt, its settings, its SAMPLED_TOKENS compared), to the
#: EAGLE3 server and to the target without speculation; fewer sequences than on a GPU (the Triton interpreter)
SAMPLING_PROMPT, SAMPLING, SAMPLED_TOKENS = (
    sampling_lossless.PROMPT,
    sampling_lossless.SETTINGS,
    sampling_lossless.TOKENS,
)
SAMPLES = 48


def sampling_questions() -> list[tuple[str, list[list[int]], dict]]:
    """:data:`SAMPLING` as ``serve(..., then=...)`` questions."""
    return [(name, [SAMPLING_PROMPT] * SAMPLES, params) for name, params in SAMPLING.items()]


#: the image requests (tests/e2e/test_image_requests.py): one greedy batch of two sequences with an image each (the
#: media placeholder id where the image goes; sizes 56 x 56 and 84 x 28 pixels: 4 and 3 image tokens) and two
#: text-only ones, asked of the target without speculation (``baseline``) and of EAGLE3 with the trained draft
#: (``eagle3_sampling``), both serving the tiny Kimi-K2.5 with its vision tower and processor
MEDIA = tiny_models.kimi_k25_config()["media_placeholder_token_id"]
IMAGE_PROMPTS = [[5, 6, 7, MEDIA, 8, 9], [10, MEDIA, 11, 12, 13, 14, 15], *held_out_prompts(2, seed=5150)]
IMAGE_DATA = [[tiny_vl_models.image_data_url(56, 56, 1)], [tiny_vl_models.image_data_url(84, 28, 2)], None, None]
IMAGE_QUESTION = ("images", IMAGE_PROMPTS, {"temperature": 0.0}, IMAGE_DATA)
#: what a server of the image-serving target needs: its processor is the checkpoint's own code
VL_FLAGS = ["--trust-remote-code"]
#: sglang's scheduler input blocker (``SGLANG_ENABLE_COLOCATED_BATCH_GEN``, 0.5.9 on): the tokenizer sends a batched
#: request's sequences inside one blocked region, so the scheduler takes them all at once and prefills them together.
#: Without it the first sequence to be processed is prefilled alone (a text one, its images not being processed),
#: and the draft's prefill with several image sequences is never seen
ONE_PREFILL_ENV = {"SGLANG_ENABLE_COLOCATED_BATCH_GEN": "1"}


def images_refused() -> bool:
    """This release feeds the draft wrong rows for image requests: eagle3_image_draft_rows refuses EAGLE3 with image
    input at start (tests/e2e/test_image_requests.py shows it), and the EAGLE3 servers serve text only."""
    return patch_applies("eagle3_image_draft_rows")


@pytest.fixture(scope="session")
def models(tiny_root) -> dict[str, str]:
    target = tiny_models.build_kimi_k25(tiny_root / "tiny-kimi-k25")
    draft = tiny_models.build_trained_eagle3_draft(tiny_root)
    # the same text weights with the vision tower's and the processor: the servers that answer IMAGE_QUESTION
    target_vl = tiny_vl_models.build_kimi_k25_vl(tiny_root / "tiny-kimi-k25-vl")
    return {"target": str(target), "draft": str(draft), "target_vl": str(target_vl)}


def measure_accept(draft: str, target: str, data) -> dict:
    """``eagle3-patches measure-accept --json``, as a user runs it."""
    cmd = [sys.executable, "-m", "eagle3_patches", "measure-accept", "--draft", str(draft), "--target", str(target)]
    proc = subprocess.run([*cmd, "--data", str(data), "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def measured(models, tmp_path_factory) -> dict:
    """The trained draft's expected accept length, measured offline (``eagle3-patches measure-accept``) on the
    ``hidden_state_dump`` of the target serving :data:`PROMPTS` greedily without speculation (a known-good server):
    the figure the ``eagle3`` server's watchdog is told to expect.  Then, the dump of the greedy requests put aside,
    the same server's answers to :func:`sampling_questions` (``samples``: the reference of the lossless check) and to
    :data:`IMAGE_QUESTION` (``images``).  It serves the image-serving tiny Kimi-K2.5, whose text weights are the
    target's."""
    if not patch_applies("hidden_state_dump"):
        pytest.skip("the hidden_state_dump instrument does not apply to this sglang release")
    tmp = tmp_path_factory.mktemp("measured")
    dump_dir = tmp / "dump"
    env = {
        **ONE_PREFILL_ENV,
        settings.ENABLE: "hidden_state_dump",
        settings.DUMP_DIR: str(dump_dir),
        settings.DUMP_LAYER_IDS: ",".join(map(str, tiny_models.DRAFT_AUX_IDS)),
    }
    server = Server(
        models["target_vl"],
        [*VL_FLAGS, "--disable-radix-cache", "--skip-server-warmup"],
        log_path=tmp / "dump.log",
        env=env,
    )
    try:
        server.start()
        outputs = [server.generate(p, MAX_NEW_TOKENS)["output_ids"] for p in PROMPTS]
        # every request's rows (its prompt, then each generated token but the last, which no forward reads): the
        # dump writes a shard after each idle second, so a loaded machine may split them over several shards
        expected = sum(len(p) + MAX_NEW_TOKENS - 1 for p in PROMPTS)
        deadline = time.monotonic() + 120  # a bound for a dump that never completes, not an expected time
        while dumped_rows(dump_dir) < expected and time.monotonic() < deadline:
            time.sleep(0.5)
        greedy_dump = shutil.copytree(dump_dir, tmp / "dump-greedy")  # what the sampled requests add stays out
        samples = sampled_outputs(server)
        images = server.generate_batch(IMAGE_PROMPTS, MAX_NEW_TOKENS, IMAGE_QUESTION[2], images=IMAGE_DATA)
    except ServerError as exc:
        pytest.fail(f"dump server failed: {exc}")
    finally:
        server.stop()
    return {
        "outputs": outputs,
        "samples": samples,
        "images": images,
        "dump": greedy_dump,
        **measure_accept(models["draft"], models["target"], greedy_dump),
    }


def sampled_outputs(server: Server) -> dict[str, list[list[int]]]:
    """The server's answers to :func:`sampling_questions`: ``{name: token ids of each sequence}``."""
    return {
        name: [r["output_ids"] for r in server.generate_batch(prompts, SAMPLED_TOKENS, params)]
        for name, prompts, params in sampling_questions()
    }


#: the EAGLE3 server's second question: held-out prompts at temperature 1.0 with top-k 4, in one batch
#: (tests/e2e/test_watchdog.py).  Without top-k the tiny target's temperature-1.0 distribution is so flat that the
#: trained draft's 16-step windows come close to the watchdog's threshold: a false alarm of the test, not the server's
SAMPLED_PROMPTS = held_out_prompts(8, seed=8765)
SAMPLED_PROMPTS_SAMPLING = {"temperature": 1.0, "top_k": 4}


@pytest.fixture(scope="session")
def baseline(models, tmp_path_factory, request) -> dict:
    """The target without speculation, greedy on :data:`PROMPTS`: the reference outputs; and its answers to
    :func:`sampling_questions` (``samples``) and to :data:`IMAGE_QUESTION` (``images``: the responses).  Where the
    dump server of :func:`measured` runs (the same target, no speculation, the same questions), its answers are the
    reference and no other server starts."""
    if patch_applies("hidden_state_dump"):
        measured = request.getfixturevalue("measured")
        return {"outputs": measured["outputs"], "samples": measured["samples"], "images": measured["images"]}
    out = serve_or_fail(
        "baseline",
        models["target_vl"],
        VL_FLAGS,
        tmp_path_factory.mktemp("baseline"),
        PROMPTS,
        then=[*sampling_questions(), IMAGE_QUESTION],
        env=dict(ONE_PREFILL_ENV),
    )
    return {**out, "samples": {name: out[name]["outputs"] for name in SAMPLING}, "images": out["images"]["responses"]}


@pytest.fixture(scope="session")
def eagle3(models, tmp_path_factory, request) -> dict:
    """EAGLE3 with the patches, the diagnostic probe writing JSON lines, metrics on; greedy; the watchdog told the
    offline figure (``EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH``, measured greedily: temperature 0) where the dump it is
    measured on can be made.  Then, in the same server, :data:`SAMPLED_PROMPTS` at temperature 1.0 and top-k 4
    (``out["sampled"]``, read by the ``eagle3_sampled`` fixture); the greedy figures and ``metrics`` are read before
    them."""
    expected = (
        {
            settings.EXPECTED_ACCEPT_LENGTH: str(request.getfixturevalue("measured")["accept_length"]),
            settings.EXPECTED_ACCEPT_TEMPERATURE: "0",
        }
        if patch_applies("hidden_state_dump")
        else {}
    )
    tmp = tmp_path_factory.mktemp("eagle3")
    probe_dir = tmp / "probe"
    out = serve_or_fail(
        "eagle3",
        models["target"],
        [*speculative_flags(models["draft"], "EAGLE3"), "--enable-metrics"],
        tmp,
        PROMPTS,
        metrics=True,
        then=[("sampled", SAMPLED_PROMPTS, SAMPLED_PROMPTS_SAMPLING)],
        env={
            settings.PROBE: str(probe_dir),
            **expected,
            **WATCHDOG_ENV,
        },
    )
    out["probe"] = probe_records(probe_dir)
    return out


@pytest.fixture(scope="session")
def eagle3_sampled(eagle3) -> dict:
    """The EAGLE3 server's answers at temperature 1.0 (top-k 4): its responses, and its log and ``/metrics`` after
    them."""
    return {**eagle3["sampled"], "log": eagle3["log"]}


@pytest.fixture(scope="session")
def eagle3_sampling(models, tmp_path_factory) -> dict:
    """EAGLE3 with the trained draft answering :func:`sampling_questions` (``out[name]``; tests/e2e/test_sampling.py),
    and the greedy :data:`PROMPTS` first (their accept length is the figure the sampled ones are printed beside).  A
    server of its own: its batches of one prompt are nothing like the traffic the watchdog's servers prove silence
    on (a window of 16 verify steps there is a handful of requests in the same context), so it runs with the
    watchdog's defaults.  It serves the image-serving tiny Kimi-K2.5 (the same text weights) and answers
    :data:`IMAGE_QUESTION` last (``out["images"]``), with the probe writing JSON lines (``out["probe"]``: its
    ``draft_image_rows`` record is that batch's, prefilled at once: :data:`ONE_PREFILL_ENV`); where
    :func:`images_refused`, the text-only target without the image question."""
    tmp = tmp_path_factory.mktemp("eagle3-sampling")
    refused = images_refused()  # then the text-only target, the same text weights, and no image question
    out = serve_or_fail(
        "eagle3-sampling",
        models["target"] if refused else models["target_vl"],
        [
            *([] if refused else VL_FLAGS),
            *speculative_flags(models["draft"], "EAGLE3"),
            "--max-running-requests",
            str(SAMPLES),
        ],
        tmp,
        PROMPTS[:1],
        then=[*sampling_questions(), *([] if refused else [IMAGE_QUESTION])],
        env={**ONE_PREFILL_ENV, settings.PROBE: str(tmp / "probe")},
    )
    out["probe"] = probe_records(tmp / "probe")
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
