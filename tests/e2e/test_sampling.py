"""Speculative sampling is lossless in the real server: at Kimi-K2.5's served temperatures, the EAGLE3 server with
the trained draft generates what the target without speculation generates, in distribution.

The servers (tests/e2e/e2e_servers.py): ``eagle3_sampling`` and the target without speculation (the dump server,
or ``baseline``) answer the same :data:`~e2e_servers.SAMPLES` copies of one prompt at each setting of
:data:`~e2e_servers.SAMPLING` (selftest's ``sampling_lossless`` settings: temperature 1.0 with top-k 4; 0.6 with top-p
0.95 and top-k 4; 0.3 with top-k 4, where a verify that ignores the temperature shows).  Their
first :data:`~e2e_servers.SAMPLED_TOKENS` tokens are compared by the permutation test of
:mod:`eagle3_patches.acceptance.lossless` (false-alarm rate 1e-3).  On CPU the verify runs the CPU profile's
sampling kernels (eagle3_patches/cpu/spec_sampling.py); stock sglang verifies greedily there (0.5.9 - 0.5.12,
0.5.16 on: the sequences after the first token are the target's argmax) or fails (0.5.13 - 0.5.15).
"""

from __future__ import annotations

import pytest
from e2e_servers import SAMPLED_TOKENS, SAMPLES, SAMPLING

from eagle3_patches.acceptance import lossless
from eagle3_patches.selftest.checks import sampling_lossless
from eagle3_patches.testing.server import mean_accept_length

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


@pytest.mark.parametrize("setting", list(SAMPLING))
def test_eagle3_sampling_has_the_distribution_of_no_speculation(setting, eagle3_sampling, baseline, figure):
    speculative = eagle3_sampling[setting]["outputs"]
    assert len(speculative) == SAMPLES and all(len(s) == SAMPLED_TOKENS for s in speculative)
    result = lossless.compare(
        speculative, baseline["samples"][setting], SAMPLED_TOKENS, from_length=sampling_lossless.FROM_LENGTH
    )
    accept = mean_accept_length(eagle3_sampling[setting]["responses"])
    figure(
        f"EAGLE3 at {setting} ({SAMPLING[setting]}): accept length {accept:.2f} (greedy "
        f"{mean_accept_length(eagle3_sampling['responses']):.2f}); against no speculation: {result.describe()}"
    )
    assert result.same_distribution, result.describe()


def test_sampled_verify_accepts_draft_tokens(eagle3_sampling):
    """Sampling does not switch speculation off: the trained draft's tokens are accepted at every setting."""
    for setting in SAMPLING:
        assert mean_accept_length(eagle3_sampling[setting]["responses"]) > 1.3, setting
