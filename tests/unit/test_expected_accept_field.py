"""The ``expected_accept_length`` field at its bounds: the figures a draft config may state, the flags a server is
compared at, and the refusal's text (the field is read from strangers' checkpoints)."""

from __future__ import annotations

import dataclasses

import pytest

from eagle3_patches.checkpoint.expected_accept import FIELD, MAX_ACCEPT_LENGTH, ExpectedAccept, from_config
from eagle3_patches.checkpoint.safe_io import CheckpointError


def _refused(value) -> str:
    """What the refusal of ``value`` says was found."""
    with pytest.raises(CheckpointError) as info:
        from_config({FIELD: value}, where="d/config.json")
    return info.value.diagnostic.found


@pytest.mark.parametrize("length", [1.001, 2.5, 64, 64.0])
def test_every_figure_in_the_documented_range_is_read(length):
    """(1, 64]: the expected text says so, and 64 itself is a figure a wide tree may state."""
    assert MAX_ACCEPT_LENGTH == 64.0
    got = from_config({FIELD: length}, where="d/config.json")
    assert got is not None and got.accept_length == float(length)


@pytest.mark.parametrize("length", [1, 1.0, 0.5, 64.001, 65])
def test_a_figure_outside_the_range_is_refused(length):
    assert _refused(length) == f"accept_length {length!r}"


FLAGS = ["speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"]


@pytest.mark.parametrize(
    ("key", "flag", "read"),
    [(k, f, r) for k in FLAGS for f, r in ((1024, True), (0, False), (1025, False))]
    + [(k, 1, True) for k in FLAGS[:2]],  # one draft token is below any figure over 1: refused for that
)
def test_each_measured_at_flag_is_read_from_1_to_1024(key, flag, read):
    value = {"accept_length": 1.5, key: flag}
    if read:
        got = from_config({FIELD: value}, where="d/config.json")
        assert got is not None and flag in (got.num_steps, got.topk, got.num_draft_tokens)
    else:
        assert _refused(value) == f"{key} {flag}"


def test_the_figure_may_equal_the_steps_plus_one_and_the_draft_tokens():
    """A verify step yields at most steps + 1 tokens and at most its draft tokens: both bounds are inclusive."""
    got = from_config({FIELD: {"accept_length": 4.0, "speculative_num_steps": 3}}, where="x")
    assert got is not None and (got.accept_length, got.num_steps) == (4.0, 3)
    got = from_config({FIELD: {"accept_length": 4.0, "speculative_num_draft_tokens": 4}}, where="x")
    assert got is not None and got.num_draft_tokens == 4
    assert _refused({"accept_length": 4.001, "speculative_num_steps": 3}) == (
        "accept_length 4.001 above speculative_num_steps + 1 = 4"
    )


def test_a_long_value_is_quoted_up_to_200_characters():
    found = _refused("x" * 500)
    assert found == f"accept_length {'x' * 500!r}"[:200] and len(found) == 200


@pytest.mark.parametrize("served", [2, 4])
def test_a_server_run_with_fewer_or_more_steps_than_measured_is_not_compared(served):
    e = ExpectedAccept(3.0, 3, 1, 4)
    assert e.not_comparable(served, 1, 4) == f"measured at --speculative-num-steps 3, served with {served}"
    assert e.not_comparable(3, 1, 4) is None


def test_the_figure_read_cannot_be_changed_after_it_was_checked():
    """The watchdog holds the figure the doctor and the config checked; nothing it hands it to may rewrite it."""
    e = ExpectedAccept(3.0, 3, 1, 4, "d/config.json: expected_accept_length")
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.accept_length = 9.0  # type: ignore[misc]
    assert hash(e) == hash(ExpectedAccept(3.0, 3, 1, 4, "d/config.json: expected_accept_length"))
