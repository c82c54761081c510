"""The offline accept-length measurement's parts without a server: the replay of greedy verification, the figures,
the dump reader, the draft's config, and the expected-figure field.  The whole command against a live server:
tests/e2e/test_expected_accept.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eagle3_patches.acceptance.draft_reference import REQUIRED, draft_shape
from eagle3_patches.acceptance.measure import (
    Acceptance,
    MeasureError,
    expected_accept_length,
    load_draft,
    read_states,
    replay,
)
from eagle3_patches.acceptance.target_states import TargetStates, read_dump
from eagle3_patches.checkpoint.expected_accept import FIELD, ExpectedAccept, from_config, from_value
from eagle3_patches.checkpoint.safe_io import CheckpointError
from eagle3_patches.cli import main
from eagle3_patches.instruments.hidden_state_dump import FORMAT
from eagle3_patches.testing import tiny_models

V, W = 16, 6  # vocabulary, aux width


class Scripted:
    """A draft whose step-k prediction at base t is ``script[k][t]`` (a target id; hot = identity)."""

    def __init__(self, script: dict[int, dict[int, int]], default: int = 0):
        self.script, self.default = script, default
        self.params = {"fc.weight": torch.zeros(4, W)}
        self.embed = torch.zeros(V, 4)

    def forward_seq(self, tokens, aux, steps, worker="v1"):
        L = tokens.shape[0]
        out = []
        for k in range(1, steps + 1):
            n = L - 1 if k == 1 else L - k
            logits = torch.zeros(n, V)
            for t in range(n):
                logits[t, self.script.get(k, {}).get(t, self.default)] = 1.0
            out.append(logits)
        return out

    def predict(self, tokens, aux, steps, worker="v1"):
        return [logits.argmax(-1) for logits in self.forward_seq(tokens, aux, steps, worker)]


def _states(tokens, n_prompt) -> TargetStates:
    L = len(tokens)
    lab = torch.tensor([i >= n_prompt for i in range(L)])
    return TargetStates(torch.tensor(tokens), torch.zeros(L, W), lab, "test")


def _perfect(tokens) -> dict[int, dict[int, int]]:
    return {k: {t: tokens[t + k + 1] for t in range(len(tokens) - k - 1)} for k in (1, 2, 3)}


# ---------------------------------------------------------------------- the replay
def test_a_perfect_draft_is_accepted_every_step_from_the_first_target_token():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # prompt 1, 2, 3; the target's tokens from 4 on
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states(tokens, 3)], 3)
    # verify steps start at base t = 2 (token 4 just produced), then t = 6, then t = 10, whose third draft token
    # would be past the end of the request: the request finishes, as sglang finishes it, with two accepted
    assert r.histogram == [0, 0, 1, 2] and r.accept_length == pytest.approx(11 / 3)
    assert r.per_position == [1.0, 1.0, pytest.approx(2 / 3)]


def test_the_chain_stops_at_its_first_wrong_token_and_the_next_step_starts_after_the_accepted_ones():
    tokens = list(range(1, 15))
    script = _perfect(tokens)
    script[2][2] = 0  # the first verify step (t = 2): token 2 wrong, token 3 right but after a wrong one
    r = replay(Scripted(script), torch.arange(V), [_states(tokens, 3)], 3)
    # t = 2 accepts 1 (length 2), t = 4 accepts 3, t = 8 accepts 3; t = 12 has no full lookahead
    assert r.histogram == [0, 1, 0, 2]
    assert r.accept_length == pytest.approx((2 + 4 + 4) / 3)
    assert r.per_position == [1.0, pytest.approx(2 / 3), pytest.approx(2 / 3)]


def test_a_prompt_token_is_never_a_draft_target():
    tokens = list(range(1, 15))
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states(tokens, 12)], 3)
    assert r.histogram == [0, 1, 0, 0]  # two target tokens: one verify step (t = 11), then the data ends
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states(tokens, 9)], 3)
    assert r.histogram == [0, 0, 0, 1]  # starts at t = 8, the token before the first target one


def test_a_chain_stops_at_a_token_the_target_did_not_produce():
    tokens = list(range(1, 15))
    st = _states(tokens, 3)
    st.labelled[5] = False  # e.g. a user turn inside a training conversation
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [st], 3)
    # t = 2 accepts token 4 only (5 is not the target's); t = 4 starts at no target token; t = 5 accepts 3,
    # t = 9 accepts 3 (10, 11, 12), t = 13 is past the data
    assert r.histogram == [0, 1, 0, 2]


def test_the_draft_vocabulary_is_mapped_through_d2t():
    tokens = list(range(1, 15))
    hot = torch.arange(V).roll(1)  # draft id i means target id i - 1
    shifted = {k: {t: (v + 1) % V for t, v in d.items()} for k, d in _perfect(tokens).items()}
    assert replay(Scripted(shifted), hot, [_states(tokens, 3)], 3).accept_length == pytest.approx(11 / 3)
    assert replay(Scripted(_perfect(tokens)), hot, [_states(tokens, 3)], 3).accept_length == 1.0


def test_short_sequences_are_skipped_and_said():
    r = replay(Scripted({}), torch.arange(V), [_states([1, 2], 1)], 3)
    assert r.sequences == 0 and r.skipped == ["test: 2 tokens, shorter than one verify step"]
    assert replay(Scripted({}), torch.arange(V), [_states([1, 2, 3], 1)], 3).histogram == [1, 0, 0, 0]
    tokens = list(range(1, 15))  # a short sequence, then a whole one: the whole one is still measured
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states([1, 2], 1), _states(tokens, 3)], 3)
    assert r.sequences == 1 and r.histogram == [0, 0, 1, 2] and len(r.skipped) == 1
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states(tokens, 3)] * 2, 3)
    assert r.sequences == 2 and r.histogram == [0, 0, 2, 4]
    assert "over 6 verify steps of 2 sequence(s)" in r.format(4)


def test_a_sequence_labelled_from_its_first_token_is_drafted_for_from_its_second():
    tokens = list(range(1, 15))  # nothing predicts token 0: the first verify step is at t = 0
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states(tokens, 0)], 3)
    assert r.histogram == [0, 0, 0, 3]  # t = 0, 4, 8 accept 3 each; t = 12 has no token to draft for


def test_one_step_is_replayed_and_fewer_are_refused():
    tokens = list(range(1, 15))
    r = replay(Scripted(_perfect(tokens)), torch.arange(V), [_states(tokens, 3)], 1)
    assert r.histogram == [0, 5] and r.accept_length == 2.0 and r.per_position == [1.0]  # t = 2, 4, 6, 8, 10
    with pytest.raises(MeasureError, match="--speculative-num-steps must be at least 1") as info:
        replay(Scripted({}), torch.arange(V), [_states(tokens, 3)], 0)
    assert info.value.diagnostic.found == "0"


@pytest.mark.parametrize("width", [W + 1, W - 1])
def test_states_of_another_width_are_refused(width):
    st = _states(list(range(1, 15)), 3)
    st.aux = torch.zeros(14, width)
    with pytest.raises(MeasureError, match="do not have the width the draft's fc takes") as info:
        replay(Scripted({}), torch.arange(V), [st], 3)
    d = info.value.diagnostic
    assert (d.where, d.found) == ("test", f"{width} wide")
    assert d.expected == f"{W} (k aux layers x the target's hidden size)"  # the fc's input width


def test_the_figures_and_the_field_it_prints():
    a = Acceptance(steps=3, histogram=[2, 1, 0, 1], sequences=1)
    assert a.accept_length == (1 * 2 + 2 + 4) / 4 and a.per_position == [0.5, 0.25, 0.25]
    field = a.config_field(4)[FIELD]
    assert from_value(field, source="x") == ExpectedAccept(2.0, 3, 1, 4, "x", 0.0)  # what it prints, the field reads
    assert "expected accept length 2.000 at --speculative-num-steps 3" in a.format(4)
    assert json.loads(a.to_json(4))["per_position"] == [0.5, 0.25, 0.25]


def test_the_report_and_the_json_exactly():
    a = Acceptance(steps=3, histogram=[0, 0, 1, 2], sequences=1, skipped=["x: 2 tokens, shorter than one verify step"])
    stated = (
        '{"expected_accept_length": {"accept_length": 3.667, "speculative_num_steps": 3, "speculative_eagle_topk": 1, '
        '"speculative_num_draft_tokens": 4, "temperature": 0, "measured_by": "eagle3-patches measure-accept", '
        '"verify_steps": 3}}'
    )
    assert a.format(4).splitlines() == [
        "expected accept length 3.667 at --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4, greedy (temperature 0), over 3 verify steps of 1 sequence(s), the draft run "
        "as sglang's spec v1 worker runs it",
        "draft token k accepted in this fraction of verify steps:",
        "  k=1: 1.000",
        "  k=2: 1.000",
        "  k=3: 0.667",
        "to state it in the draft's config.json (the watchdog and the doctor read it):",
        "  " + stated,  # the field to paste, rounded to 3 digits as printed
        "skipped: x: 2 tokens, shorter than one verify step",
    ]
    out = a.to_json(4)
    assert out == json.dumps(json.loads(out), indent=2)  # two-space indented
    got = json.loads(out)
    assert got["accept_length"] == 11 / 3 and got[FIELD]["accept_length"] == 3.667 and got["sequences"] == 1
    assert got["spec_worker"] == "v1"
    # greedy, said so: the sampling the figure holds at, and no rejection-sampling figure beside it
    assert (got["temperature"], got["top_k"], got["top_p"]) == (0, None, 1.0)
    assert (got["sampling"], got["verify"], got["rejection_sampling"]) == ("greedy (temperature 0)", "greedy", None)
    assert got[FIELD]["temperature"] == 0 and type(got["histogram"][0]) is int


class Recording(Scripted):
    """A scripted draft that records the worker each replay asks it to run as."""

    def forward_seq(self, tokens, aux, steps, worker="v1"):
        self.asked = worker
        return super().forward_seq(tokens, aux, steps)


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_the_replay_runs_the_draft_as_the_worker_asked_and_says_so(worker):
    draft = Recording({})
    r = replay(draft, torch.arange(V), [_states(list(range(1, 9)), 3)], 3, worker)
    assert draft.asked == worker and r.worker == worker and json.loads(r.to_json(4))["spec_worker"] == worker
    assert r.format(4).splitlines()[0].endswith(f"the draft run as sglang's spec {worker} worker runs it")


@pytest.mark.parametrize(
    ("installed", "env", "worker"),
    [
        ("0.5.9", None, "v1"),  # spec v2 off by default before 0.5.11
        ("0.5.9", "1", "v2"),
        ("0.5.10.post1", "true", "v2"),
        ("0.5.10", "maybe", "v1"),  # a value sglang does not read: the default
        ("0.5.11", None, "v2"),  # on by default from 0.5.11
        ("0.5.12", "0", "v1"),
        ("0.5.13", "0", "v2"),  # one worker from 0.5.13, whatever the variable says
        ("0.5.23", None, "v2"),
        (None, "0", "v2"),  # no sglang here: the newest releases' worker
    ],
)
def test_the_default_worker_is_the_one_the_installed_sglang_runs(monkeypatch, installed, env, worker):
    from packaging.version import Version

    from eagle3_patches.cli import measure_accept_cmd

    monkeypatch.setattr(
        "eagle3_patches.sglang_version.installed_sglang_version", lambda: installed and Version(installed)
    )
    environ = {} if env is None else {"SGLANG_ENABLE_SPEC_V2": env}
    assert measure_accept_cmd.installed_worker(environ) == worker


# ---------------------------------------------------------------------- the expected-figure field
@pytest.mark.parametrize(
    ("value", "found"),
    [
        (1.0, "accept_length 1.0"),
        (65, "accept_length 65"),
        (True, "accept_length True"),
        ("3", "accept_length '3'"),
        ({"accept_length": 3.0, "speculative_num_steps": 2.5}, "speculative_num_steps 2.5"),
        ({"accept_length": 3.0, "speculative_eagle_topk": 0}, "speculative_eagle_topk 0"),
        ({"accept_length": 4.5, "speculative_num_draft_tokens": 4}, "above speculative_num_draft_tokens 4"),
        ({"accept_length": 4.5, "speculative_num_steps": 3}, "above speculative_num_steps + 1 = 4"),
    ],
)
def test_a_malformed_field_is_refused_naming_what_was_found(value, found):
    with pytest.raises(CheckpointError) as info:
        from_config({FIELD: value}, where="d/config.json")
    d = info.value.diagnostic
    assert d.code == "expected-accept-length" and found in d.found and d.where == f"d/config.json: {FIELD}"


def test_the_field_as_a_number_or_an_object():
    assert from_config({}, where="x") is None
    assert from_config({FIELD: 3}, where="x") == ExpectedAccept(3.0, source=f"x: {FIELD}")
    got = from_config({FIELD: {"accept_length": 4, "speculative_num_draft_tokens": 4}}, where="x")
    assert got is not None and got.accept_length == 4.0 and got.num_draft_tokens == 4  # the bound is inclusive
    e = ExpectedAccept(3.0, 3, 1, 4)
    assert e.not_comparable(3, 1, 4) is None and e.not_comparable(None, None, None) is None
    assert e.not_comparable(3, 2, 4) == "measured at --speculative-eagle-topk 1, served with 2"
    assert e.not_comparable(3, 1, 5) == "measured at --speculative-num-draft-tokens 4, served with 5"
    assert ExpectedAccept(3.0).not_comparable(5, 4, 16) is None  # a bare figure: measured at the served flags


# ---------------------------------------------------------------------- the draft
def test_draft_shapes_it_cannot_run_are_refused_with_the_reason():
    base = tiny_models.eagle3_draft_config()
    shape, why = draft_shape(base)
    assert shape is not None and why == "" and shape.num_kv_heads == shape.num_heads
    assert draft_shape(dict(base, num_key_value_heads=2, num_attention_heads=4, head_dim=16))[0].num_kv_heads == 2
    for change, reason in [
        ({"num_hidden_layers": 2}, "only one draft layer"),
        ({"hidden_act": "gelu"}, "only silu"),
        ({"norm_output": True}, "norm_output"),
        ({"eagle_config": {"norm_before_fc": True}}, "norm_before_fc"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope_scaling type 'yarn'"),
        ({"num_key_value_heads": 3}, "must divide"),
        ({"bias": True}, "bias"),
    ]:
        shape, why = draft_shape(dict(base, **change))
        assert shape is None and reason in why, (change, why)
    assert draft_shape(dict(base, rope_scaling={"type": "linear", "factor": 2}))[0].rope_linear_factor == 2.0


def test_load_draft_needs_the_target_for_a_shared_embedding(tmp_path):
    draft = tiny_models.build_trained_eagle3_draft(tmp_path)
    with pytest.raises(MeasureError, match="shares tensors with its target") as info:
        load_draft(draft, None)
    assert info.value.diagnostic.found == "no embed_tokens.weight"
    assert info.value.diagnostic.fix == "pass the target's checkpoint directory with --target"
    target = tiny_models.build_kimi_k25(tmp_path / "target")
    forward, hot, config = load_draft(draft, target)
    assert forward.embed.shape == (tiny_models.VOCAB, tiny_models.HIDDEN)
    assert hot.shape[0] == config["draft_vocab_size"] and int(hot.max()) < tiny_models.VOCAB


# ---------------------------------------------------------------------- the dump
def _shard(path, rows, *, layer_ids: str | None = "[1, 2, 3]", decoded=True, fmt=FORMAT):
    ids, pos, seq, dec = zip(*rows)
    tensors = {
        "input_ids": torch.tensor(ids),
        "positions": torch.tensor(pos),
        "seq_ids": torch.tensor(seq),
        "hidden_states": torch.arange(len(rows) * W, dtype=torch.float32).view(len(rows), W),
    }
    if decoded:
        tensors["decoded"] = torch.tensor(dec, dtype=torch.int8)
    meta = {"format": fmt} if layer_ids is None else {"format": fmt, "layer_ids": layer_ids}
    save_file(tensors, str(path), metadata=meta)


def test_the_dump_is_read_into_whole_sequences_with_the_generated_tokens_labelled(tmp_path):
    # sequence 7: prompt 5 6 7 then generated 8 9; sequence 9 starts at position 2 (a cached prefix): skipped
    _shard(tmp_path / "shard-1-00000.safetensors", [(5, 0, 7, 0), (6, 1, 7, 0), (7, 2, 7, 0), (3, 2, 9, 0)])
    _shard(tmp_path / "shard-1-00001.safetensors", [(8, 3, 7, 1), (9, 4, 7, 1)])
    states, meta = read_dump(tmp_path)
    (st,) = states
    assert st.tokens.tolist() == [5, 6, 7, 8, 9] and st.labelled.tolist() == [False, False, False, True, True]
    assert st.aux.shape == (5, W) and meta["layer_ids"] == [1, 2, 3]
    assert st.aux[3].tolist() == list(range(0, W))  # row 0 of the second shard


def test_an_old_dump_without_decoded_labels_every_position_but_the_first(tmp_path):
    _shard(tmp_path / "shard-1-00000.safetensors", [(5, 0, 7, 0), (6, 1, 7, 0), (7, 2, 7, 1)], decoded=False)
    (st,), _ = read_dump(tmp_path)
    assert st.labelled.tolist() == [False, True, True]


def test_a_dump_of_other_layers_or_none_is_refused(tmp_path):
    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    with pytest.raises(MeasureError, match="no target states found"):
        read_states(tmp_path, config, max_sequences=10)
    _shard(tmp_path / "shard-1-00000.safetensors", [(5, 0, 7, 0), (6, 1, 7, 1)], layer_ids="[2, 30, 58]")
    with pytest.raises(MeasureError, match="captured other layers"):
        read_states(tmp_path, config, max_sequences=10)


@pytest.mark.parametrize(
    ("draft_ids", "dump_ids", "refused"),
    [
        ([1, 2, 3], "[2, 30, 58]", True),
        ([2, 30, 58], "[1, 2, 3]", True),
        ([1, 2, 3], "[1, 2, 3]", False),
        ([1, 2, 3], None, False),  # a dump that records no layer ids: the user's word
        (None, "[1, 2, 3]", False),  # a draft config that states none
    ],
)
def test_the_dump_layers_are_checked_against_the_drafts_where_both_state_them(tmp_path, draft_ids, dump_ids, refused):
    config = {} if draft_ids is None else {"eagle_config": {"eagle_aux_hidden_state_layer_ids": draft_ids}}
    _shard(tmp_path / "shard-1-00000.safetensors", [(5, 0, 7, 0), (6, 1, 7, 1)], layer_ids=dump_ids)
    if not refused:
        assert [st.tokens.tolist() for st in read_states(tmp_path, config, max_sequences=10)] == [[5, 6]]
        return
    with pytest.raises(MeasureError, match="captured other layers") as info:
        read_states(tmp_path, config, max_sequences=10)
    d = info.value.diagnostic
    assert d.found == f"layer_ids {json.loads(dump_ids)}"
    assert d.expected == f"the draft's eagle_aux_hidden_state_layer_ids {draft_ids}"


def test_a_file_that_is_not_a_dump_shard_is_refused_naming_it(tmp_path):
    _shard(tmp_path / "shard-1-00000.safetensors", [(5, 0, 7, 0)], fmt="something-else")
    with pytest.raises(CheckpointError) as info:
        read_dump(tmp_path)
    assert "shard-1-00000.safetensors" in info.value.diagnostic.where
    assert "not a hidden_state_dump shard" in info.value.diagnostic.found


def test_a_shard_linked_from_outside_is_not_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _shard(outside / "x.safetensors", [(5, 0, 7, 0), (6, 1, 7, 1)])
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard-1-00000.safetensors").symlink_to(outside / "x.safetensors")
    with pytest.raises(CheckpointError, match="outside|link"):
        read_dump(data)


# ---------------------------------------------------------------------- the command
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--speculative-eagle-topk", "2"], "only topk 1 is replayed"),
        (["--speculative-num-steps", "0"], "expected 1..16"),
        (["--speculative-num-draft-tokens", "6"], "with topk 1 sglang uses steps + 1 = 4"),
        (["--max-sequences", "0"], "at least 1"),
    ],
)
def test_usage_errors_exit_2_with_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["measure-accept", "--draft", "d", "--data", "x", *flags])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_draft_that_is_not_a_checkpoint_is_a_message_not_a_traceback(tmp_path, capsys):
    assert main(["measure-accept", "--draft", str(tmp_path / "nope"), "--data", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nope" in err


def test_training_data_is_read_as_the_draft_was_trained_on(tmp_path):
    from test_training_data import K, write_specforge, write_speculators

    write_specforge(tmp_path / "sf", 0, length=6)
    (st,) = read_states(tmp_path / "sf", {}, max_sequences=10)
    assert st.aux.shape[-1] == K * 4 and st.labelled.tolist() == [False] * 3 + [True] * 3
    write_speculators(tmp_path / "spec", 0, length=6)
    write_speculators(tmp_path / "spec", 1, length=6)
    assert len(list(read_states(tmp_path / "spec", {}, max_sequences=1))) == 1  # the limit reaches the reader
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(MeasureError, match="no target states found"):
        read_states(tmp_path / "other", {}, max_sequences=10)


def _trained_variant(tmp_path, name, change):
    """The trained tiny draft with ``change(tensors, config)`` applied, written as its own checkpoint."""
    from safetensors.torch import load_file

    tensors = load_file(str(tiny_models.TRAINED_DRAFT_TENSORS))
    spec = tiny_models.TinyDraftSpec(
        draft_vocab=int(tensors["lm_head.weight"].shape[0]), extra_config={"torch_dtype": "float32"}
    )
    config = tiny_models.eagle3_draft_config(spec)
    change(tensors, config)
    return tiny_models.write_checkpoint(tmp_path / name, config, tensors, spec.vocab)


def test_a_draft_without_lm_head_uses_the_targets_and_its_own_embedding_without_a_target(tmp_path):
    target = tiny_models.build_kimi_k25(tmp_path / "target")

    def no_head(tensors, config):
        del tensors["lm_head.weight"], tensors["d2t"], tensors["t2d"]
        config["draft_vocab_size"] = None

    forward, hot, _ = load_draft(_trained_variant(tmp_path, "no-head", no_head), target)
    assert forward.params["lm_head.weight"].shape[0] == tiny_models.VOCAB and hot.tolist() == list(range(hot.shape[0]))

    def own_embed(tensors, config):
        tensors["embed_tokens.weight"] = torch.zeros(tiny_models.VOCAB, tiny_models.HIDDEN)

    forward, _, _ = load_draft(_trained_variant(tmp_path, "own-embed", own_embed), None)
    assert forward.embed.abs().sum() == 0  # the draft's own, without a target

    def own_embed_no_head(tensors, config):
        own_embed(tensors, config)
        no_head(tensors, config)

    with pytest.raises(MeasureError, match="shares tensors with its target") as info:
        load_draft(_trained_variant(tmp_path, "own-embed-no-head", own_embed_no_head), None)
    assert info.value.diagnostic.found == "no lm_head.weight"


def test_the_targets_tensors_are_found_by_name_the_shortest_first(tmp_path):
    v, h = tiny_models.VOCAB, tiny_models.HIDDEN
    target = tiny_models.write_checkpoint(
        tmp_path / "target",
        {},
        {
            "embed_tokens.weight": torch.full((v, h), 1.0),  # the exact name
            "lm_head.weight": torch.full((v, h), 2.0),
            "mtp.embed_tokens.weight": torch.full((v, h), 3.0),  # another module's, a longer name
        },
        v,
    )

    def no_head(tensors, config):
        del tensors["lm_head.weight"], tensors["d2t"], tensors["t2d"]
        config["draft_vocab_size"] = None

    forward, _, _ = load_draft(_trained_variant(tmp_path, "no-head", no_head), target)
    assert bool((forward.embed == 1.0).all()) and bool((forward.params["lm_head.weight"] == 2.0).all())


def test_a_draft_with_hf_style_names_is_read_under_sglangs(tmp_path):
    target = tiny_models.build_kimi_k25(tmp_path / "target")

    def hf_names(tensors, config):
        for name in [n for n in tensors if n.startswith("midlayer.") or n == "norm.weight"]:
            tensors["model." + name.replace("midlayer.", "layers.0.")] = tensors.pop(name)

    forward, _, _ = load_draft(_trained_variant(tmp_path, "hf", hf_names), target)
    reference, _, _ = load_draft(tiny_models.build_trained_eagle3_draft(tmp_path), target)
    assert sorted(forward.params) == sorted(reference.params)
    assert all(torch.equal(forward.params[n], reference.params[n]) for n in REQUIRED)


def test_a_draft_whose_head_is_saved_as_model_lm_head_is_refused_as_sglang_never_loads_it(tmp_path):
    """sglang looks ``model.lm_head.weight`` up as ``model.model.lm_head.weight`` and drops it: the figure measured
    with that head (or with the target's in its place) would not be the server's."""
    target = tiny_models.build_kimi_k25(tmp_path / "target")

    def prefixed_head(tensors, config):
        tensors["model.lm_head.weight"] = tensors.pop("lm_head.weight")

    with pytest.raises(MeasureError, match="head is stored under a name sglang does not load") as info:
        load_draft(_trained_variant(tmp_path, "prefixed-head", prefixed_head), target)
    assert info.value.diagnostic.found == "model.lm_head.weight"
    assert "rename model.lm_head.weight to lm_head.weight" in info.value.diagnostic.fix


def test_a_draft_lacking_many_tensors_names_the_first_six(tmp_path):
    def strip(tensors, config):
        for name in REQUIRED[:7]:
            del tensors[name]

    with pytest.raises(MeasureError, match="lacks tensors its forward needs") as info:
        load_draft(_trained_variant(tmp_path, "stripped", strip), None)
    assert info.value.diagnostic.found == f"missing {list(REQUIRED[:6])}"
    assert info.value.diagnostic.expected == f"every one of {list(REQUIRED)}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t, c: t.update(d2t=t["d2t"] + tiny_models.VOCAB), "d2t does not map the draft vocabulary"),
        (lambda t, c: t.update(d2t=t["d2t"][:-1]), "d2t does not map the draft vocabulary"),
        (lambda t, c: t.pop("midlayer.mlp.up_proj.weight"), "lacks tensors its forward needs"),
        (lambda t, c: c.update(norm_output=True), "not implemented by the measurement"),
    ],
)
def test_a_draft_the_measurement_cannot_run_is_refused_saying_why(tmp_path, change, message):
    target = tiny_models.build_kimi_k25(tmp_path / "target")
    with pytest.raises(MeasureError, match=message):
        load_draft(_trained_variant(tmp_path, "bad", change), target)


def _with_d2t(change):
    def apply(tensors, config):
        tensors["d2t"] = change(tensors["d2t"].clone())

    return apply


def _set(d2t, i, value):
    d2t[i] = value
    return d2t


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (lambda d: torch.cat([d, torch.zeros(1, dtype=d.dtype)]), "d2t has 321 entries but the draft config says"),
        (lambda d: _set(d, 0, -1), "d2t maps draft token 0 to target id -1, outside the target vocabulary [0, 1024)"),
        (lambda d: _set(d, 319, tiny_models.VOCAB - 319), "d2t maps draft token 319 to target id 1024, outside"),
        (lambda d: d + torch.arange(320), "d2t holds absolute target ids, not offsets"),
        (lambda d: d.view(-1, 1), "d2t has shape (320, 1), expected a 1-D tensor."),  # not a traceback in the replay
    ],
)
def test_a_d2t_the_doctor_refuses_is_refused_with_the_doctors_words(tmp_path, change, found):
    target = tiny_models.build_kimi_k25(tmp_path / "target")
    with pytest.raises(MeasureError, match="d2t does not map the draft vocabulary") as info:
        load_draft(_trained_variant(tmp_path, "bad", _with_d2t(change)), target)
    d = info.value.diagnostic
    assert d.found.startswith(found) and d.expected == (
        f"320 offsets: i + d2t[i] distinct target ids in 0..{tiny_models.VOCAB - 1}"
    )


def test_a_d2t_from_target_id_0_is_read(tmp_path):
    target = tiny_models.build_kimi_k25(tmp_path / "target")
    _, hot, _ = load_draft(_trained_variant(tmp_path, "identity", _with_d2t(torch.zeros_like)), target)
    assert hot.tolist() == list(range(320))  # draft id i is target id i, from 0


@pytest.mark.parametrize("side", ["embedding", "lm_head"])
@pytest.mark.parametrize("width", [tiny_models.HIDDEN - 1, tiny_models.HIDDEN + 1])
def test_an_embedding_or_head_of_another_width_is_refused_naming_both(tmp_path, side, width):
    v, h = tiny_models.VOCAB, tiny_models.HIDDEN

    def change(tensors, config):
        if side == "embedding":  # the draft's own, used without a target
            tensors["embed_tokens.weight"] = torch.zeros(v, width)
        else:
            tensors["embed_tokens.weight"] = torch.zeros(v, h)
            tensors["lm_head.weight"] = torch.zeros(320, width)

    with pytest.raises(MeasureError, match="disagree in width") as info:
        load_draft(_trained_variant(tmp_path, "bad", change), None)
    d = info.value.diagnostic
    embed, head = (width, h) if side == "embedding" else (h, width)
    assert d.found == f"embedding [{v}, {embed}], lm_head [320, {head}]"
    assert d.expected == f"width {h} (the draft's hidden_size)"


def test_an_embedding_of_another_width_is_refused(tmp_path):
    target = tiny_models.build_kimi_k25(tmp_path / "target")

    def wide(tensors, config):
        config["hidden_size"] = tiny_models.HIDDEN * 2  # a config for another model than its weights and target

    with pytest.raises(MeasureError, match="disagree in width"):
        load_draft(_trained_variant(tmp_path, "wide", wide), target)


def test_the_dump_is_bounded(tmp_path, monkeypatch):
    from eagle3_patches.acceptance import target_states

    _shard(tmp_path / "shard-1-00000.safetensors", [(5, 0, 7, 0), (6, 1, 7, 1), (7, 2, 7, 1)])
    monkeypatch.setattr(target_states, "MAX_DUMP_ROWS", 3)
    assert len(read_dump(tmp_path)[0]) == 1  # at the bound: read
    monkeypatch.setattr(target_states, "MAX_DUMP_ROWS", 2)
    with pytest.raises(CheckpointError, match="too large"):
        read_dump(tmp_path)


def test_expected_accept_length_is_the_replay_of_the_draft_with_the_targets_embedding(tmp_path):
    draft = tiny_models.build_trained_eagle3_draft(tmp_path)
    target = tiny_models.build_kimi_k25(tmp_path / "target")
    forward, hot, _ = load_draft(draft, target)
    g = torch.Generator().manual_seed(0)
    st = TargetStates(
        torch.randint(tiny_models.VOCAB, (12,), generator=g),
        torch.randn(12, forward.params["fc.weight"].shape[1], generator=g),
        torch.tensor([False] * 4 + [True] * 8),
        "test",
    )
    r = expected_accept_length(draft, [st], target=target)
    assert r.steps == 3 and r.histogram == replay(forward, hot, [st], 3).histogram  # --speculative-num-steps 3
    r = expected_accept_length(draft, [st], target=target, steps=2)
    assert r.steps == 2 and r.histogram == replay(forward, hot, [st], 2).histogram
    r = expected_accept_length(draft, [st], target=target, worker="v2")
    assert r.worker == "v2" and r.histogram == replay(forward, hot, [st], 3, "v2").histogram


# ---------------------------------------------------------------------- states no replay can run on
@pytest.mark.parametrize(("low", "high", "refused"), [(0, V - 1, False), (0, V, True), (-1, 5, True)])
def test_token_ids_outside_the_embedding_are_refused_naming_the_range(low, high, refused):
    """Whatever the source (a dump, SpecForge's or speculators' data), an id the embedding has no row for is the
    wrong target's data: refused with the range found, not an IndexError in the draft's forward."""
    tokens = [low, 3, 4, 5, high]
    run = lambda: replay(Scripted({}), torch.arange(V), [_states(tokens, 1)], 3)  # noqa: E731
    if not refused:
        assert run().sequences == 1
        return
    with pytest.raises(MeasureError) as info:
        run()
    d = info.value.diagnostic
    assert d.what == "the target states hold token ids outside the target's vocabulary" and d.where == "test"
    assert d.found == f"token ids {low}..{high}" and d.expected == f"ids in 0..{V - 1} (the rows of the embedding " + (
        "the draft runs with)"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_hidden_states_that_are_not_finite_are_refused_counting_them(bad):
    st = _states([1, 2, 3, 4, 5], 1)
    st.aux[1, 2] = bad
    st.aux[3, 0] = bad
    with pytest.raises(MeasureError) as info:
        replay(Scripted({}), torch.arange(V), [st], 3)
    d = info.value.diagnostic
    assert d.what == "the target states hold NaN or infinite values" and d.found == f"2 non-finite of {5 * W}"


# ---------------------------------------------------------------------- the trained draft's figures, on the device
#: sequences on which the trained tiny draft is accepted often: each token after the prompt is the draft's own step-1
#: choice, some replaced at random (tokens, prompt length); the aux states are ``torch.randn`` of seed 7 + i
PINNED = [
    ([584, 116, 519, 303, 419, 155, 383, 679, 733, 640, 1011, 313, 266, 1013, 1013, 1013, 1013, 1013, 1013, 1013, 818,
      93, 715, 436, 976, 843, 131, 27, 574, 44, 594, 8, 322, 623, 203, 569, 124, 866, 361, 319], 6),
    ([715, 851, 833, 830, 235, 55, 1006, 1015, 1010, 791, 706, 796, 391, 93, 715, 40, 531, 709, 775, 69, 254, 287, 654,
      816, 777, 326, 962, 505, 819, 623, 320, 300, 729, 866, 422, 919, 726, 436, 252, 720, 715, 436, 976, 843, 459, 395,
      885, 502], 4),
    ([72, 883, 390, 226, 282, 223, 222, 467, 771, 562, 805, 122, 51, 264, 1010, 341, 700, 889, 104, 716, 540, 29, 810,
      840, 958, 188, 277, 300, 729, 462, 629, 300], 8),
    ([239, 733, 315, 707, 545, 403, 59, 339, 332, 643, 529, 129, 519, 248, 902, 413, 56, 319, 101, 155, 240, 643, 975,
      941, 508, 962, 505, 861, 158, 745, 178, 870, 698, 672, 488, 198, 580, 672, 46, 976, 843, 131, 277, 543], 5),
]  # fmt: skip
#: what the float32 reference measured on them, per worker (the verify steps that accepted 0..3 draft tokens)
PINNED_HISTOGRAM = {"v1": [18, 23, 12, 10], "v2": [18, 20, 10, 13]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    return tiny_models.build_trained_eagle3_draft(root), tiny_models.build_kimi_k25(root / "target")


def _pinned(width: int):
    """The pinned sequences, one at a time (a generator: no length, nothing held)."""
    for i, (tokens, prompt) in enumerate(PINNED):
        aux = torch.randn(len(tokens), width, generator=torch.Generator().manual_seed(7 + i))
        yield TargetStates(torch.tensor(tokens), aux, torch.tensor([j >= prompt for j in range(len(tokens))]), f"s{i}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_the_trained_drafts_figures_are_pinned_in_each_dtype(trained, dtype, worker):
    """float32 gives the reference's figures exactly; bfloat16 and float16 give the same histogram on these
    sequences (their top token differs from float32's at 1.8% and 0.3% of all positions: near-ties)."""
    forward, hot, _ = load_draft(*trained, device="cpu", dtype=dtype)
    assert {t.dtype for t in (*forward.params.values(), forward.embed)} == {getattr(torch, dtype)}
    assert hot.device.type == "cpu"
    r = replay(forward, hot, _pinned(forward.params["fc.weight"].shape[1]), 3, worker)
    assert r.histogram == PINNED_HISTOGRAM[worker] and r.sequences == 4


def test_the_replay_takes_each_sequence_as_it_is_yielded():
    """Streamed sequences are drafted for as they come: none is read before the one before it is replayed."""
    events: list[str] = []

    class Logged(Scripted):
        def predict(self, tokens, aux, steps, worker="v1"):
            events.append("draft")
            return super().predict(tokens, aux, steps, worker)

    def sequences():
        for i in range(3):
            events.append(f"read {i}")
            yield _states(list(range(1, 9)), 3)

    assert replay(Logged({}), torch.arange(V), sequences(), 3).sequences == 3
    assert events == ["read 0", "draft", "read 1", "draft", "read 2", "draft"]


def test_the_progress_bar_counts_tokens_and_shows_the_figure(trained, capsys):
    forward, hot, _ = load_draft(*trained, device="cpu")
    replay(forward, hot, _pinned(forward.params["fc.weight"].shape[1]), 3, "v1", progress=True)
    err = capsys.readouterr().err
    total = sum(len(tokens) for tokens, _ in PINNED)
    assert f"measure-accept: {total}tok" in err and "accept length 2.222" in err  # 140 of 63 verify steps: 140/63
    replay(forward, hot, _pinned(forward.params["fc.weight"].shape[1]), 3, "v1")
    assert capsys.readouterr().err == ""  # none unless asked


def test_without_tqdm_the_replay_runs_without_a_bar(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
    r = replay(
        Scripted(_perfect(list(range(1, 9)))), torch.arange(V), [_states(list(range(1, 9)), 3)], 3, progress=True
    )
    assert r.verify_steps and capsys.readouterr().err == ""


# ---------------------------------------------------------------------- --device and --dtype
def _cuda(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(("spec", "count", "device"), [(None, 0, "cpu"), (None, 2, "cuda:0"), ("cpu", 2, "cpu"),
                                                       ("cuda", 1, "cuda:0"), ("cuda:1", 2, "cuda:1")])  # fmt: skip
def test_the_device_is_the_first_gpu_else_the_cpu_or_the_one_named(monkeypatch, spec, count, device):
    from eagle3_patches.acceptance.measure import pick_device

    _cuda(monkeypatch, count)
    assert pick_device(spec) == torch.device(device)


@pytest.mark.parametrize(
    ("spec", "count", "what", "found", "expected"),
    [
        ("cuda", 0, "this machine has no such GPU", "cuda, with 0 CUDA device(s) visible to torch",
         "cpu (torch sees no CUDA device)"),
        ("cuda:2", 2, "this machine has no such GPU", "cuda:2, with 2 CUDA device(s) visible to torch",
         "cuda:0 .. cuda:1"),
        ("tpu", 2, "the device is not one the measurement runs on", "tpu", "cpu, cuda or cuda:N"),
        ("cuda:-1", 2, "the device is not one the measurement runs on", "cuda:-1", "cpu, cuda or cuda:N"),
        ("cuda:99999", 2, "the device is not one the measurement runs on", "cuda:99999", "cpu, cuda or cuda:N"),
    ],
)  # fmt: skip
def test_a_device_that_is_not_there_is_refused_naming_the_flag(monkeypatch, spec, count, what, found, expected):
    from eagle3_patches.acceptance.measure import pick_device

    _cuda(monkeypatch, count)
    with pytest.raises(MeasureError) as info:
        pick_device(spec)
    d = info.value.diagnostic
    assert (d.what, d.where, d.found, d.expected) == (what, "--device", found, expected)


def test_a_missing_gpu_is_refused_before_the_draft_is_read(tmp_path, monkeypatch, capsys):
    _cuda(monkeypatch, 0)
    assert main(["measure-accept", "--draft", str(tmp_path / "nope"), "--data", str(tmp_path), "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "this machine has no such GPU" in err and "--device" in err and "nope" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("spec", "config", "device", "dtype"),
    [
        ("auto", {"torch_dtype": "bfloat16"}, "cpu", torch.float32),  # the CPU: the float32 reference
        ("auto", {"torch_dtype": "bfloat16"}, "cuda", torch.bfloat16),  # a GPU: the draft's own, as sglang serves it
        ("auto", {"dtype": "float16", "torch_dtype": "bfloat16"}, "cuda", torch.float16),  # `dtype` first, as sglang
        ("auto", {"torch_dtype": "float32"}, "cuda", torch.float32),
        ("auto", {}, "cuda", torch.bfloat16),
        ("auto", {"torch_dtype": "int8"}, "cuda", torch.bfloat16),
        ("auto", {"torch_dtype": "float8_e4m3fn"}, "cuda", torch.bfloat16),
        ("bfloat16", {"torch_dtype": "float32"}, "cpu", torch.bfloat16),  # named: as named
        ("float32", {"torch_dtype": "bfloat16"}, "cuda", torch.float32),
    ],
)
def test_the_dtype_is_the_references_on_the_cpu_and_the_drafts_on_a_gpu(spec, config, device, dtype):
    from eagle3_patches.acceptance.measure import pick_dtype

    assert pick_dtype(spec, config, torch.device(device)) == dtype


@pytest.mark.parametrize("spec", ["int8", "float8_e4m3fn", "nonsense"])
def test_a_dtype_that_is_not_a_float_type_is_refused(spec):
    from eagle3_patches.acceptance.measure import pick_dtype

    with pytest.raises(MeasureError) as info:
        pick_dtype(spec, {}, torch.device("cpu"))
    d = info.value.diagnostic
    assert (d.where, d.found, d.expected) == ("--dtype", spec, "auto, float32, bfloat16 or float16")


def test_the_command_runs_on_the_device_in_the_dtype_with_its_bar(trained, tmp_path, capsys):
    """The whole command on the pinned sequences as SpecForge training data: the figures of the replay, the bar on
    stderr where asked, none with --no-progress; --dtype outside its choices is a usage error."""
    from test_training_data import write_specforge

    draft, target = trained
    for i, st in enumerate(_pinned(192)):
        write_specforge(tmp_path / "data", i, aux_hidden_state=st.aux.unsqueeze(0), input_ids=st.tokens,
                        loss_mask=st.labelled.long(), hidden_state=torch.zeros(1, len(st.tokens), 64))  # fmt: skip
    flags = ["measure-accept", "--draft", str(draft), "--target", str(target), "--data", str(tmp_path / "data")]
    assert main([*flags, "--spec-worker", "v2", "--device", "cpu", "--dtype", "bfloat16", "--json", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["histogram"] == PINNED_HISTOGRAM["v2"] and "measure-accept: " in err
    assert main([*flags, "--spec-worker", "v1", "--json", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["histogram"] == PINNED_HISTOGRAM["v1"] and err == ""
    with pytest.raises(SystemExit) as info:
        main([*flags, "--dtype", "int8"])
    assert info.value.code == 2 and "--dtype" in capsys.readouterr().err
