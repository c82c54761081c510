"""Property tests: random mutations of the three formats measure-accept reads (a hidden_state_dump shard, a SpecForge
file, a speculators file) never end in anything but a one-line refusal (an :class:`Eagle3Error`) or states the
draft can run on.  Deterministic (derandomized) and bounded by the number of cases, not by the clock."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from eagle3_patches.acceptance.measure import read_states
from eagle3_patches.errors import Eagle3Error
from eagle3_patches.instruments.hidden_state_dump import FORMAT

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
from test_training_data import write_specforge, write_speculators  # noqa: E402

CASES = settings(
    max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
W = 6
CONFIG = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}, "target_hidden_size": 2}

dims = st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=0, max_size=3)
dtypes = st.sampled_from([torch.int64, torch.int8, torch.float32, torch.bfloat16, torch.bool, torch.float64])
ints = st.sampled_from([0, 1, 2, 3, -1, 2**31, 2**62, -(2**63)])
tensors = st.one_of(
    st.builds(lambda shape, dt: torch.zeros(shape, dtype=dt), dims, dtypes),
    st.builds(lambda vals: torch.tensor(vals, dtype=torch.int64), st.lists(ints, min_size=1, max_size=6)),
    st.builds(lambda v: torch.full((3, W), v), st.sampled_from([float("nan"), float("inf"), 1e30, 0.0])),
)
objects = st.one_of(
    st.none(), st.integers(-3, 3), st.text(max_size=4), tensors, st.lists(tensors, max_size=3), st.just([])
)
meta_values = st.one_of(
    st.sampled_from(["[1, 2, 3]", "[1.0, 2.0, 3.0]", "[]", "null", "[-1]", "[true]", "{}", "[" * 50, "1,2,3"]),
    st.text(max_size=12),
)


def _consume(data: Path) -> None:
    try:
        for states in read_states(data, CONFIG, max_sequences=4, max_tokens=64):
            assert states.aux.dtype == torch.float32 and states.aux.shape[0] == states.tokens.shape[0]
            assert states.labelled.shape == states.tokens.shape
    except Eagle3Error as exc:
        assert str(exc) and not isinstance(exc, AssertionError)


@CASES
@given(
    key=st.sampled_from(["input_ids", "positions", "seq_ids", "hidden_states", "decoded", None]),
    value=tensors,
    layer_ids=meta_values,
    second=st.booleans(),
)
def test_a_mutated_dump_is_read_or_refused(key, value, layer_ids, second):
    rows = {
        "input_ids": torch.tensor([5, 6, 7, 8]),
        "positions": torch.tensor([0, 1, 2, 3]),
        "seq_ids": torch.tensor([7, 7, 7, 7]),
        "hidden_states": torch.ones(4, W),
        "decoded": torch.tensor([0, 1, 1, 1], dtype=torch.int8),
    }
    if key is not None:
        rows[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        save_file(
            rows, os.path.join(tmp, "shard-1-00000.safetensors"), metadata={"format": FORMAT, "layer_ids": layer_ids}
        )
        if second:  # a second shard of the same sequence, one position on
            more = {k: v[:1].clone() for k, v in rows.items() if v.dim() >= 1 and len(v)} if key is None else {}
            if more:
                more["positions"] = torch.tensor([4])
                save_file(
                    more,
                    os.path.join(tmp, "shard-1-00001.safetensors"),
                    metadata={"format": FORMAT, "layer_ids": "[1, 2, 3]"},
                )
        _consume(Path(tmp))


@CASES
@given(key=st.sampled_from(["input_ids", "loss_mask", "aux_hidden_state", "hidden_state", "extra"]), value=objects)
def test_a_mutated_specforge_file_is_read_or_refused(key, value):
    with tempfile.TemporaryDirectory() as tmp:
        write_specforge(Path(tmp), 0, **{key: value})
        _consume(Path(tmp))


@CASES
@given(key=st.sampled_from(["input_ids", "loss_mask", "hidden_states", "extra"]), value=objects)
def test_a_mutated_speculators_file_is_read_or_refused(key, value):
    with tempfile.TemporaryDirectory() as tmp:
        write_speculators(Path(tmp), 0, **{key: value})
        _consume(Path(tmp))


@CASES
@given(offset=st.integers(0, 4000), data=st.binary(min_size=1, max_size=16))
def test_a_torch_file_with_bytes_overwritten_is_read_or_refused(offset, data):
    with tempfile.TemporaryDirectory() as tmp:
        write_speculators(Path(tmp), 0)
        path = Path(tmp) / "data_0.pt"
        raw = bytearray(path.read_bytes())
        at = offset % len(raw)
        raw[at : at + len(data)] = data
        path.write_bytes(bytes(raw))
        _consume(Path(tmp))
