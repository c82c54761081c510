"""Image requests through the real EAGLE3 server: the tiny Kimi-K2.5 with its vision tower (MoonViT, one block) and a
tiny processor written to the public interface of Kimi-K2.5's (``eagle3_patches/testing/tiny_kimi_k25_processor.py``,
loaded with ``--trust-remote-code``, no model hub), the trained tiny draft.  One greedy batch of four sequences, two
with an image each and two text only (``IMAGE_QUESTION`` of tests/e2e/e2e_servers.py), asked of the target without
speculation and of the EAGLE3 server of the lossless check (no server of its own):

* the outputs of every sequence equal those without speculation;
* the probe's ``draft_image_rows`` record of the first draft prefill with images: the draft's first layer got, at
  each sequence's last prefill position, the embedding of the token there;
* the accept length of the image requests beside the text ones (a figure, not a bound);
* where the release feeds the draft wrong rows for image requests (0.5.10 - 0.5.20), the EAGLE3 server with image
  input refused at start instead, naming the release that fixes it.
"""

from __future__ import annotations

import pytest
from e2e_servers import IMAGE_DATA, IMAGE_PROMPTS, VL_FLAGS, images_refused

from eagle3_patches.testing.server import Server, speculative_flags

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]
served = pytest.mark.skipif(
    images_refused(), reason="this release refuses EAGLE3 with image input at start (eagle3_image_draft_rows)"
)


@served
def test_a_batch_with_images_gives_the_outputs_of_no_speculation(baseline, eagle3_sampling, figure):
    eagle3 = eagle3_sampling["images"]["responses"]
    base = baseline["images"]
    assert len(eagle3) == len(base) == len(IMAGE_PROMPTS)
    # the images went in: each image sequence's prompt grew by its image tokens (4 and 3) less the placeholder
    grown = [r["meta_info"]["prompt_tokens"] - len(p) for r, p in zip(eagle3, IMAGE_PROMPTS)]
    assert grown == [3, 2, 0, 0], grown
    assert [r["output_ids"] for r in eagle3] == [r["output_ids"] for r in base]
    accept = [r["meta_info"]["spec_accept_length"] for r in eagle3]
    assert all(a >= 1.0 for a in accept)  # it speculated
    images = [a for a, d in zip(accept, IMAGE_DATA) if d]
    text = [a for a, d in zip(accept, IMAGE_DATA) if not d]
    figure(
        "image requests through EAGLE3 (tiny Kimi-K2.5 + trained draft, greedy, one batch of 2 image + 2 text "
        f"sequences): outputs identical; accept length image {sum(images) / len(images):.2f} "
        f"({', '.join(f'{a:.2f}' for a in images)}), text {sum(text) / len(text):.2f} "
        f"({', '.join(f'{a:.2f}' for a in text)})"
    )


@served
def test_the_draft_gets_the_token_embedding_at_each_last_prefill_row(eagle3_sampling):
    """The probe's record of the first draft prefill with images: the whole batch, prefilled at once (sglang's input
    blocker: ``ONE_PREFILL_ENV``), its two image sequences among the four, and at every sequence's last position the
    embedding of the token there."""
    rows = [r for r in eagle3_sampling["probe"] if r.get("hop") == "draft_image_rows"]
    assert len(rows) == 1, rows  # one record a process
    rec = rows[0]
    assert rec["sequences"] == len(IMAGE_PROMPTS), rec
    assert sum(rec["with_images"]) == sum(d is not None for d in IMAGE_DATA) == 2, rec  # in the scheduler's order
    assert rec["last_rows"] == [True] * rec["sequences"], rec


@pytest.mark.skipif(not images_refused(), reason="this release feeds the draft the right rows for image requests")
def test_eagle3_with_image_input_is_refused_at_start_where_the_draft_reads_wrong_rows(models, tmp_path):
    """sglang 0.5.10 - 0.5.20: the server of the image-serving target with EAGLE3 stops at start, saying which release
    fixes it and how a server that gets no images goes on."""
    server = Server(
        models["target_vl"],
        [*VL_FLAGS, *speculative_flags(models["draft"], "EAGLE3")],
        log_path=tmp_path / "refused.log",
    )
    rc = server.wait_exit(timeout=240)
    log = server.log()
    assert rc not in (0, -9), log[-3000:]
    assert "upgrade to sglang >= 0.5.21" in log and "EAGLE3_PATCHES_DISABLE=eagle3_image_draft_rows" in log, log[-3000:]
