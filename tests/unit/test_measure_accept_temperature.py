"""``measure-accept --temperature``: the expected accept length at a temperature, where the data carry the target's
distribution, and the refusal where they do not; the sampling the figure holds at, in its output and its config
field; and the watchdog's use of it (a figure stated at one temperature is not held against traffic served at
another).  The greedy replay: tests/unit/test_measure_accept.py."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from eagle3_patches import settings
from eagle3_patches.acceptance import draft_reference
from eagle3_patches.acceptance import sampling as sm
from eagle3_patches.acceptance.measure import (
    MeasureError,
    TargetHead,
    load_draft,
    load_target_head,
    read_states,
    replay,
)
from eagle3_patches.acceptance.target_states import FINAL, TargetStates, open_dump
from eagle3_patches.checkpoint.expected_accept import FIELD, ExpectedAccept, from_value
from eagle3_patches.checkpoint.safe_io import CheckpointError
from eagle3_patches.cli import main
from eagle3_patches.cpu.spec_sampling import top_k_renorm_prob, top_p_renorm_prob
from eagle3_patches.instruments import accept_watchdog as aw
from eagle3_patches.instruments.hidden_state_dump import FORMAT
from eagle3_patches.testing import tiny_models

V, W = 6, 4  # the synthetic cases' vocabulary and aux width


# ---------------------------------------------------------------------- an independent reference
def _q(logits: list[float], t: float, top_k: int | None, top_p: float) -> list[float]:
    """The target's distribution at temperature ``t``, top-k then top-p, in plain Python (no tie in the tests)."""
    m = max(logits)
    e = [math.exp((x - m) / t) for x in logits]
    p = [x / sum(e) for x in e]
    if top_k is not None:
        kth = sorted(p, reverse=True)[top_k - 1]
        p = [x if x >= kth else 0.0 for x in p]
        p = [x / sum(p) for x in p]
    if top_p < 1.0:
        kept, mass = set(), 0.0
        for i in sorted(range(len(p)), key=lambda i: -p[i]):
            if mass < top_p:  # the smallest set of the largest whose mass reaches top_p
                kept.add(i)
                mass += p[i]
        p = [x if i in kept else 0.0 for i, x in enumerate(p)]
        p = [x / sum(p) for x in p]
    return p


def _softmax(logits: list[float], t: float) -> list[float]:
    m = max(logits)
    e = [math.exp((x - m) / t) for x in logits]
    return [x / sum(e) for x in e]


def _enumerated(accept, labelled: list[bool], steps: int) -> list[float]:
    """Every verify-step trajectory of one sequence, enumerated with its probability: the expected number of verify
    steps that accepted 0..steps draft tokens.  ``accept(k, t)``: draft token k of the step at base t accepted given
    the ones before it were."""
    L = len(labelled)
    hist = [0.0] * (steps + 1)

    def go(t: int, prob: float) -> None:
        if t > L - 3:  # no token left to draft for after the one just produced
            return
        if not labelled[t + 1]:
            go(t + 1, prob)
            return
        last = min(steps, L - 2 - t)  # the draft tokens that have a data token to be checked against
        a = [accept(k, t) if labelled[t + k + 1] else 0.0 for k in range(1, last + 1)] + [0.0]
        for j in range(last + 1):  # exactly j accepted
            pj = math.prod(a[:j]) * (1.0 - a[j])
            if pj:
                hist[j] += prob * pj
                go(t + j + 1, prob * pj)

    go(0, 1.0)
    return hist


# ---------------------------------------------------------------------- synthetic drafts and targets
class Given:
    """A draft whose step-k logits at base t are ``logits[k][t]`` (draft id = target id); its logits reach the
    head in two blocks per step, as a long sequence's do."""

    def __init__(self, logits: dict[int, torch.Tensor]):
        self.logits = logits
        self.params = {"fc.weight": torch.zeros(4, W)}
        self.embed = torch.zeros(V, 4)

    def _steps(self, L: int, steps: int) -> list[torch.Tensor]:
        return [self.logits[k][: L - 1 if k == 1 else L - k] for k in range(1, steps + 1)]

    def predict(self, tokens, aux, steps, worker="v1"):
        return [lg.argmax(-1) for lg in self._steps(len(tokens), steps)]

    def reduce(self, tokens, aux, steps, head, worker="v1"):
        out = []
        for k, lg in enumerate(self._steps(len(tokens), steps), start=1):
            half = lg.shape[0] // 2
            out.append(torch.cat([head(lg[:half], k, 0), head(lg[half:], k, half)]))
        return out


def _case(seed: int, L: int = 8, prompt: int = 2, steps: int = 3):
    """A draft's logits per step, the target's logits per position (the final states, under an identity head), and
    the data's tokens: the target's argmax after the prompt (greedy data)."""
    g = torch.Generator().manual_seed(seed)
    draft = {k: torch.randn(L - 1, V, generator=g) * 2 for k in range(1, steps + 1)}
    target = torch.randn(L, V, generator=g) * 2
    target[torch.arange(L), target.argmax(-1)] += 2.0  # a margin of 2 over the runner-up: certain at T = 0.01
    for k, t in ((1, 1), (1, 3), (2, 3), (1, 4), (3, 2)):  # some draft argmaxes on the target's: acceptances
        draft[k][t, int(target[t + k].argmax())] += 6.0
    tokens = torch.randint(V, (L,), generator=g)
    tokens[1:] = target[:-1].argmax(-1)  # token i + 1 is the target's greedy choice after position i
    st = TargetStates(tokens, torch.zeros(L, W), torch.tensor([i >= prompt for i in range(L)]), "case", final=target)
    return Given(draft), st


IDENTITY = TargetHead(torch.eye(V), "identity")
SAMPLINGS = [
    sm.Sampling(1.0),
    sm.Sampling(0.6),
    sm.Sampling(0.6, top_k=3),
    sm.Sampling(0.8, top_p=0.95),
    sm.Sampling(1.3, top_k=4, top_p=0.97),
    sm.Sampling(2.0, top_k=2),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: s.describe())
@pytest.mark.parametrize("seed", [0, 1])
def test_the_figures_at_temperature_are_the_enumerated_expectation_of_known_distributions(sampling, seed):
    """Per position, sglang's default verify accepts the draft's argmax x with q(x) (q: the target's distribution at
    T after top-k, then top-p) and rejection sampling with sum_x min(p(x), q(x)) (p: the draft's softmax at T); every
    trajectory of verify steps enumerated with its probability gives the expected histogram."""
    draft, st = _case(seed)
    T, k, p = sampling.temperature, sampling.top_k, sampling.top_p
    lab, final = st.labelled.tolist(), st.final.tolist()

    def target_only(step: int, t: int) -> float:
        x = int(draft.logits[step][t].argmax())
        return _q(final[t + step], T, k, p)[x]

    def rejection(step: int, t: int) -> float:
        q = _q(final[t + step], T, k, p)
        return sum(min(a, b) for a, b in zip(_softmax(draft.logits[step][t].tolist(), T), q))

    r = replay(draft, torch.arange(V), [st], 3, sampling=sampling, head=IDENTITY)
    wanted = {"target-only": _enumerated(target_only, lab, 3), "rejection-sampling": _enumerated(rejection, lab, 3)}
    # the two verify steps' figures differ here by far more than the tolerance: one computed as the other would fail
    assert max(abs(a - b) for a, b in zip(*wanted.values())) > 1e-4
    assert r.rejection_sampling is not None
    for got in (r, r.rejection_sampling):
        assert got.sampling == sampling
        want = wanted[got.verify]
        assert got.histogram == pytest.approx(want, abs=1e-6)
        n = sum(want)
        assert got.accept_length == pytest.approx(sum((j + 1) * c for j, c in enumerate(want)) / n, abs=1e-6)
        assert got.per_position == pytest.approx([sum(want[j:]) / n for j in (1, 2, 3)], abs=1e-6)
    assert (r.verify, r.rejection_sampling.verify) == ("target-only", "rejection-sampling")


def test_the_temperature_and_the_sampling_change_the_figure():
    """The figure is not the greedy one, nor the one at another temperature, top-k or top-p."""
    draft, st = _case(1)
    figures = [replay(draft, torch.arange(V), [st], 3, sampling=s, head=IDENTITY).accept_length for s in SAMPLINGS]
    figures.append(replay(draft, torch.arange(V), [st], 3).accept_length)
    assert len({round(f, 4) for f in figures}) == len(figures)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_as_the_temperature_goes_to_0_the_figure_is_the_greedy_one_on_greedy_data(seed):
    draft, st = _case(seed)
    greedy = replay(draft, torch.arange(V), [st], 3)
    assert greedy.verify == "greedy" and all(type(c) is int for c in greedy.histogram)
    for t in (1e-2, 1e-3):
        cold = replay(draft, torch.arange(V), [st], 3, sampling=sm.Sampling(t), head=IDENTITY)
        assert cold.histogram == pytest.approx(greedy.histogram, abs=1e-9)
        # rejection sampling's draft is its argmax too as T -> 0: the same figure
        assert cold.rejection_sampling.histogram == pytest.approx(greedy.histogram, abs=1e-6)
    warm = replay(draft, torch.arange(V), [st], 3, sampling=sm.Sampling(1.0), head=IDENTITY)
    assert warm.histogram != pytest.approx(greedy.histogram, abs=1e-3)


def test_renormalisation_is_top_k_then_top_p_as_sglangs_verify():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    assert top_k_renorm_prob(probs, 2).tolist()[0] == pytest.approx([4 / 7, 3 / 7, 0, 0])
    assert top_p_renorm_prob(probs, 0.6).tolist()[0] == pytest.approx([4 / 7, 3 / 7, 0, 0])  # 0.4 < 0.6 <= 0.7
    assert top_p_renorm_prob(probs, 0.35).tolist()[0] == pytest.approx([1, 0, 0, 0])  # 0.4 reaches 0.35
    logits = probs.log()
    # top-k 3 first (0.4, 0.3, 0.2 renormalised to 4/9, 3/9, 2/9), then top-p 0.75: 4/9 + 3/9 = 0.78 reaches it
    got = sm.target_probs(logits, sm.Sampling(1.0, top_k=3, top_p=0.75)).tolist()[0]
    assert got == pytest.approx([4 / 7, 3 / 7, 0, 0])
    # the other order keeps three: top-p 0.75 of the whole row needs 0.4 + 0.3 + 0.2, and top-k 3 keeps them
    assert top_p_renorm_prob(probs, 0.75).tolist()[0] == pytest.approx([4 / 9, 3 / 9, 2 / 9, 0])
    assert sm.target_probs(logits * 2, sm.Sampling(2.0)).tolist()[0] == pytest.approx([0.4, 0.3, 0.2, 0.1])


def test_a_sampling_outside_what_sglang_takes_is_refused():
    for bad in (dict(temperature=-1), dict(temperature=math.nan), dict(temperature=0.0, top_k=5)):
        with pytest.raises(ValueError):
            sm.Sampling(**bad)
    for bad in (dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            sm.Sampling(1.0, **bad)
    assert sm.Sampling().describe() == "greedy (temperature 0)"
    assert sm.Sampling(0.6, 20, 0.95).describe() == "temperature 0.6, top-k 20, top-p 0.95"


# ---------------------------------------------------------------------- the real draft and the target's head
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    return tiny_models.build_trained_eagle3_draft(root), tiny_models.build_kimi_k25(root / "target")


def _pinned(trained, scale: float = 0.5) -> list[TargetStates]:
    """The pinned sequences of the greedy tests (tests/unit/test_measure_accept.py), with final states built so that
    the target's argmax at each position is the data's next token: a greedy dump's data, as the target would have
    chosen them.  ``scale``: how sure the target is (0.5: a margin above 1 over its runner-up everywhere)."""
    from test_measure_accept import PINNED

    w = load_target_head(trained[1], torch.zeros(())).weight
    out = []
    for i, (tokens, prompt) in enumerate(PINNED):
        L = len(tokens)
        aux = torch.randn(L, 3 * tiny_models.HIDDEN, generator=torch.Generator().manual_seed(7 + i))
        final = torch.randn(L, w.shape[1], generator=torch.Generator().manual_seed(70 + i))
        final[:-1] = scale * w[torch.tensor(tokens[1:])]
        labelled = torch.tensor([j >= prompt for j in range(L)])
        out.append(TargetStates(torch.tensor(tokens), aux, labelled, f"s{i}", final=final))
        logits = final[:-1] @ w.T
        assert logits.argmax(-1).tolist() == tokens[1:]  # greedy data
        top2 = logits.topk(2, dim=-1).values
        assert float((top2[:, 0] - top2[:, 1]).min()) > 1.0  # a margin that temperature 0.01 makes certain
    return out


def test_the_trained_draft_at_temperature_near_0_gives_its_pinned_greedy_figure(trained, monkeypatch):
    """The real draft forward and the target's real lm_head (read from --target): near temperature 0 the figure is
    the greedy one pinned in tests/unit/test_measure_accept.py; computed in blocks of a few rows (where each block's
    offset and step choose the final state) it is the same."""
    from test_measure_accept import PINNED_HISTOGRAM

    forward, hot, _ = load_draft(*trained, device="cpu")
    head = load_target_head(trained[1], forward.params["fc.weight"])
    assert head.weight.shape == (tiny_models.VOCAB, tiny_models.HIDDEN) and head.source.endswith("lm_head.weight")
    data = _pinned(trained)
    assert replay(forward, hot, data, 3).histogram == PINNED_HISTOGRAM["v1"]
    cold = replay(forward, hot, data, 3, sampling=sm.Sampling(0.01), head=head)
    assert cold.histogram == pytest.approx(PINNED_HISTOGRAM["v1"], abs=1e-6)
    warm = replay(forward, hot, data, 3, sampling=sm.Sampling(1.0, top_p=0.9), head=head)
    assert warm.accept_length < cold.accept_length - 0.05
    monkeypatch.setattr(draft_reference, "BLOCK_ELEMENTS", 3 * tiny_models.VOCAB)  # 3 rows a block
    blocked = replay(forward, hot, data, 3, sampling=sm.Sampling(1.0, top_p=0.9), head=head)
    # the same up to the float32 rounding of the draft's attention in blocks; a block's rows given another
    # position's final state would move these by whole verify steps
    assert blocked.histogram == pytest.approx(warm.histogram, abs=1e-4)
    assert blocked.rejection_sampling.histogram == pytest.approx(warm.rejection_sampling.histogram, abs=1e-4)


def test_final_states_that_do_not_fit_the_head_are_refused():
    draft, st = _case(0)
    for final, found in ((None, "no final states"), (torch.zeros(8, V + 1), "final states [8, 7]")):
        st.final = final
        with pytest.raises(MeasureError) as info:
            replay(draft, torch.arange(V), [st], 3, sampling=sm.Sampling(1.0), head=IDENTITY)
        assert info.value.diagnostic.found == found
    st.final = torch.full((8, V), math.inf)
    with pytest.raises(MeasureError, match="NaN or infinite values in their final states"):
        replay(draft, torch.arange(V), [st], 3, sampling=sm.Sampling(1.0), head=IDENTITY)


# ---------------------------------------------------------------------- the command: data, refusals, output
def _specforge(root, states: list[TargetStates], *, hidden_state: bool = True) -> None:
    """SpecForge's files (``rows_0-2000/data_<i>.ckpt``, :mod:`test_training_data`'s layout) of ``states``."""
    for i, st in enumerate(states):
        record = {
            "input_ids": st.tokens,
            "loss_mask": st.labelled.long(),
            "aux_hidden_state": st.aux.unsqueeze(0),
        }
        if hidden_state:
            record["hidden_state"] = st.final.unsqueeze(0)
        path = root / "rows_0-2000" / f"data_{i}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(record, path)


def _dump(root, states: list[TargetStates], *, final: bool) -> None:
    """One hidden_state_dump shard of ``states`` (the labelled tokens decoded), with its final states or without."""
    tensors = {
        "input_ids": torch.cat([st.tokens for st in states]),
        "positions": torch.cat([torch.arange(len(st.tokens)) for st in states]),
        "seq_ids": torch.cat([torch.full((len(st.tokens),), i) for i, st in enumerate(states)]),
        "hidden_states": torch.cat([st.aux for st in states]),
        "decoded": torch.cat([st.labelled for st in states]).to(torch.int8),
    }
    if final:
        tensors[FINAL] = torch.cat([st.final for st in states])
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / "shard-1-00000.safetensors"), metadata={"format": FORMAT})


@pytest.fixture(scope="module")
def pinned(trained):
    return _pinned(trained)


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["measure-accept", "--device", "cpu", "--no-progress", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("kind", ["specforge", "dump"])
def test_the_json_says_the_sampling_and_gives_both_verify_figures(trained, pinned, tmp_path, capsys, kind):
    draft, target = trained
    data = tmp_path / kind
    _specforge(data, pinned) if kind == "specforge" else _dump(data, pinned, final=True)
    sampled = ("--temperature", 0.6, "--top-p", 0.9, "--spec-worker", "v1")  # the worker replayed below, any release
    rc, out, err = _run(capsys, "--draft", draft, "--target", target, "--data", data, *sampled, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert (got["temperature"], got["top_k"], got["top_p"]) == (0.6, None, 0.9)
    assert got["sampling"] == "temperature 0.6, top-p 0.9" and got["verify"] == "target-only"
    rs = got["rejection_sampling"]
    assert rs["verify"] == "rejection-sampling" and len(rs["per_position"]) == 3
    assert rs[FIELD]["speculative_use_rejection_sampling"] is True and rs[FIELD]["temperature"] == 0.6
    field = got[FIELD]
    assert (field["temperature"], field["top_p"], "top_k" in field) == (0.6, 0.9, False)
    read = from_value(field, source="x")
    assert (read.temperature, read.top_p, read.top_k) == (0.6, 0.9, None)
    # the figure is the replay's on the same data
    forward, hot, config = load_draft(draft, target, device="cpu")
    head = load_target_head(target, forward.params["fc.weight"])
    states = read_states(data, config, final=True)
    direct = replay(forward, hot, states, 3, "v1", sampling=sm.Sampling(0.6, top_p=0.9), head=head)
    assert got["accept_length"] == pytest.approx(direct.accept_length)
    assert rs["accept_length"] == pytest.approx(direct.rejection_sampling.accept_length)
    if kind == "dump":
        return  # the text and the greedy figure: from SpecForge's data
    rc, text, _ = _run(capsys, "--draft", draft, "--target", target, "--data", data, *sampled)
    assert rc == 0
    first = text.splitlines()[0]
    assert first.startswith(f"expected accept length {direct.accept_length:.3f} at --speculative-num-steps 3 ")
    assert "temperature 0.6, top-p 0.9, with sglang's default verify (target-only" in first
    assert "with --speculative-use-rejection-sampling" in text and '"temperature": 0.6' in text
    # greedy on the same data: the pinned figure, said to hold greedily
    from test_measure_accept import PINNED_HISTOGRAM

    rc, out, _ = _run(capsys, "--draft", draft, "--target", target, "--data", data, "--json", "--spec-worker", "v1")
    got = json.loads(out)
    assert rc == 0 and got["histogram"] == PINNED_HISTOGRAM["v1"] and got["accept_length"] > direct.accept_length
    assert (got["temperature"], got["sampling"], got["verify"]) == (0, "greedy (temperature 0)", "greedy")
    assert got["rejection_sampling"] is None and got[FIELD]["temperature"] == 0


def _refused(err: str) -> str:
    assert "Traceback" not in err
    return err.splitlines()[0]


@pytest.mark.parametrize(
    ("data", "missing"),
    [
        ("dump", "this hidden_state_dump holds no final hidden states (aux hidden states and token ids only)"),
        ("speculators", "speculators' data hold no state the target's distribution can be rebuilt from"),
    ],
)
def test_data_that_cannot_give_the_targets_distribution_are_refused_without_a_figure(
    trained, pinned, tmp_path, capsys, data, missing
):
    root = tmp_path / data
    if data == "dump":
        _dump(root, pinned, final=False)
    else:  # speculators 0.3/0.4: data_<i>.pt, the aux layers then the last layer's state
        g = torch.Generator().manual_seed(0)
        root.mkdir()
        layers = [torch.randn(12, tiny_models.HIDDEN, generator=g) for _ in range(4)]
        torch.save(
            {
                "input_ids": torch.randint(tiny_models.VOCAB, (12,), generator=g),
                "hidden_states": layers,
                "loss_mask": torch.tensor([0] * 4 + [1] * 8),
            },
            root / "data_0.pt",
        )
    rc, out, err = _run(capsys, "--draft", trained[0], "--target", trained[1], "--data", root, "--temperature", 1)
    first = _refused(err)
    assert rc == 1 and out == ""  # no figure
    assert first.startswith("eagle3-patches: --temperature needs the target's distribution at each position: ")
    assert missing in first
    assert "EAGLE3_PATCHES_DUMP_FINAL_STATES=1, or SpecForge's data (its hidden_state), with --target" in first
    # greedy, the same data are measured
    assert _run(capsys, "--draft", trained[0], "--target", trained[1], "--data", root)[0] == 0


def test_without_the_target_or_its_final_states_temperature_is_refused(trained, pinned, tmp_path, capsys):
    _specforge(tmp_path / "sf", pinned)
    rc, out, err = _run(capsys, "--draft", trained[0], "--data", tmp_path / "sf", "--temperature", 0.6)
    assert rc == 1 and out == ""
    assert _refused(err) == (
        "eagle3-patches: --temperature needs the target's lm_head to turn its final states into its distribution: "
        "pass the target's checkpoint with --target"
    )
    _specforge(tmp_path / "bare", pinned[:1], hidden_state=False)
    rc, out, err = _run(
        capsys, "--draft", trained[0], "--target", trained[1], "--data", tmp_path / "bare", "--temperature", 0.6
    )
    assert rc == 1 and out == ""
    assert "SpecForge hidden-state file holds no hidden_state (the target's final normed state" in _refused(err)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "--temperature -1.0: expected 0 (greedy) .. 100"),
        (["--top-k", "5"], "--top-k and --top-p apply at --temperature above 0"),
        (["--temperature", "1", "--top-k", "0"], "--top-k 0: expected at least 1"),
        (["--temperature", "1", "--top-p", "0"], "--top-p 0.0: expected 0 < P <= 1"),
    ],
)
def test_sampling_flags_outside_what_sglang_takes_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["measure-accept", "--draft", "d", "--data", "x", *flags])
    assert info.value.code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------------- the dump's final states
class _Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_target_verify(self):
        return False

    def is_idle(self):
        return False

    def is_extend(self):
        return self.extend

    def is_decode(self):
        return not self.extend


def _record(dumper, ids: list[int], start: int, aux, final, extend: bool) -> None:
    n = len(ids)
    batch = SimpleNamespace(
        forward_mode=_Mode(extend),
        input_ids=torch.tensor(ids),
        positions=torch.arange(start, start + n),
        req_pool_indices=torch.tensor([0]),
        extend_seq_lens_cpu=[n],
        extend_prefix_lens_cpu=[0],
    )
    model = SimpleNamespace(
        _eagle3_dump_layer_ids=[1], model=SimpleNamespace(layers_to_capture=[2]), config=SimpleNamespace(hidden_size=2)
    )
    model.config.num_hidden_layers = 3
    dumper.record(model, batch, [aux], final)


@pytest.mark.parametrize("on", [True, False])
def test_the_dump_writes_the_final_states_where_asked_and_the_reader_reads_them(tmp_path, monkeypatch, on):
    """The instrument's writer with a served prefill and one decode step (sglang's forward is exercised in
    tests/probe/test_hidden_state_dump.py): ``final_hidden_states`` only where EAGLE3_PATCHES_DUMP_FINAL_STATES is
    on, read back row for row; a dump without it is read as before and refused at temperature."""
    from eagle3_patches.instruments import hidden_state_dump as hsd

    env = {settings.DUMP_DIR: str(tmp_path), **({settings.DUMP_FINAL_STATES: "1"} if on else {})}
    monkeypatch.setattr(settings, "_current", [settings.read(env)])
    dumper = hsd._Dumper(tmp_path)
    aux, final = torch.randn(4, 3), torch.randn(4, 2)
    _record(dumper, [5, 6, 7], 0, aux[:3], final[:3], extend=True)
    _record(dumper, [8], 3, aux[3:], final[3:], extend=False)
    dumper.flush()
    dump = open_dump(tmp_path)
    assert dump.final_width == (2 if on else None)
    assert (dump.shards[0].metadata.get(FINAL) is not None) == on
    (st,) = read_states(tmp_path, {}, final=False)
    assert st.final is None and torch.equal(st.aux, aux)
    if on:
        (st,) = read_states(tmp_path, {}, final=True)
        assert torch.equal(st.final, final) and st.tokens.tolist() == [5, 6, 7, 8]
    else:
        with pytest.raises(MeasureError, match="holds no final hidden states"):
            read_states(tmp_path, {}, final=True)


def test_a_dump_whose_shards_differ_in_final_states_gives_none_or_is_refused(pinned, tmp_path):
    root = tmp_path / "mixed"
    _dump(root, pinned[:1], final=True)
    g = torch.Generator().manual_seed(1)
    other = {
        "input_ids": torch.tensor([1, 2]),
        "positions": torch.tensor([0, 1]),
        "seq_ids": torch.tensor([9, 9]),
        "hidden_states": torch.randn(2, 3 * tiny_models.HIDDEN, generator=g),
        "decoded": torch.tensor([0, 1], dtype=torch.int8),
    }
    save_file(other, str(root / "shard-1-00001.safetensors"), metadata={"format": FORMAT})
    assert open_dump(root).final_width is None
    with pytest.raises(MeasureError) as info:
        read_states(root, {}, final=True)
    assert info.value.diagnostic.found == f"{FINAL} in some shards only"
    save_file({**other, FINAL: torch.zeros(2, 5)}, str(root / "shard-1-00001.safetensors"), metadata={"format": FORMAT})
    with pytest.raises(CheckpointError, match="final hidden states of different widths"):
        open_dump(root)


# ---------------------------------------------------------------------- the field and the watchdog
def test_the_field_states_the_sampling_and_a_malformed_one_is_refused():
    e = from_value({"accept_length": 2.5, "temperature": 0.6, "top_k": 20, "top_p": 0.95}, source="x")
    assert (e.temperature, e.top_k, e.top_p) == (0.6, 20, 0.95)
    assert e.describe() == "2.5, temperature 0.6, top-k 20, top-p 0.95 (x)"
    assert (
        from_value({"accept_length": 2.5, "temperature": 0}, source="x").describe() == "2.5, greedy (temperature 0) (x)"
    )
    assert from_value(2.5, source="x").describe() == "2.5, at a temperature not stated (x)"
    for bad, found in (
        ({"temperature": -0.5}, "temperature -0.5"),
        ({"temperature": "hot"}, "temperature 'hot'"),
        ({"top_k": 0}, "top_k 0"),
        ({"top_p": 1.5}, "top_p 1.5"),
    ):
        with pytest.raises(CheckpointError) as info:
            from_value({"accept_length": 2.5, **bad}, source="x")
        assert info.value.found == found


def _watchdog(temperature: float | None, expected: float = 3.5):
    from test_accept_watchdog import EAGLE_RECORDS, FakeProbe, _dog

    dog = _dog(FakeProbe(EAGLE_RECORDS))
    figure = ExpectedAccept(
        expected, 3, 1, 4, source="draft/config.json: expected_accept_length", temperature=temperature
    )
    dog.set_expected(figure, (3, 1, 4))
    return dog


def _req(temperature: float, top_k: int = 1 << 30):
    """sglang's ``Req`` as the watchdog sees it: normalised sampling params (temperature 0 is top_k 1)."""
    if temperature == 0:
        temperature, top_k = 1.0, 1
    return SimpleNamespace(sampling_params=SimpleNamespace(temperature=temperature, top_k=top_k))


def _serve(monkeypatch, dog, temperatures: list[float], accepted: int = 1) -> None:
    """One decode batch per verify step, each request counted through the watchdog's wrapper of sglang's
    per-request histogram method, as sglang calls it; ``accepted`` 1: accept length 2.0, a gain of 1.0, below half
    of the expected 3.5's 2.5 and above the floor near 1.0."""
    monkeypatch.setattr(aw._state, "watchdog", dog)
    monkeypatch.setattr(aw._state, "logging_rank", True)
    monkeypatch.setattr(aw._state, "broken", False)
    for t in temperatures:
        aw._counted_positions(lambda *a, **k: None, _req(t), (accepted,), {})
        dog.add(1, accepted + 1)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eagle3_patches" and r.levelno >= logging.WARNING]


def test_a_figure_at_one_temperature_is_not_held_against_windows_served_at_another(monkeypatch, caplog):
    dog = _watchdog(0.0)  # a greedy figure of 3.5: windows at 2.0 are far below it
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        _serve(monkeypatch, dog, [1.0] * 4)  # warm-up
        _serve(monkeypatch, dog, [1.0] * 7 + [0.0])  # served at temperature 1: no false alarm
        assert not dog.below_expected and not dog.degraded and dog.last_served == {1.0: 7, 0.0: 1}
        (said,) = _warnings(caplog)
        assert "is not compared with windows whose verify steps were served at other temperatures" in said
        assert (
            "3.5 at --speculative-num-steps 3, --speculative-eagle-topk 1, --speculative-num-draft-tokens 4, " in said
        )
        assert ", greedy (temperature 0) (draft/config.json" in said
        assert "temperature 1 in 88%, greedy (temperature 0) in 12%" in said
        _serve(monkeypatch, dog, [1.0] * 8)
        assert len(_warnings(caplog)) == 1  # said once
        _serve(monkeypatch, dog, [0.0] * 8)  # served greedily: compared, and below
    assert dog.below_expected
    warning = _warnings(caplog)[-1]
    assert warning.startswith("eagle3-patches watchdog: drafts are accepted far less often")
    assert "expected: accept length 3.5 at --speculative-num-steps 3" in warning
    assert "--speculative-num-draft-tokens 4, greedy (temperature 0) (draft/config.json" in warning
    assert "requests served greedy (temperature 0) in 100% of verify steps" in warning


def test_a_window_a_tenth_of_it_served_otherwise_is_still_compared(monkeypatch):
    dog = _watchdog(0.6)
    _serve(monkeypatch, dog, [0.6] * 4)
    _serve(monkeypatch, dog, [0.6] * 7 + [1.0])  # 1 of 8 served otherwise: more than a tenth
    assert not dog.below_expected
    dog = _watchdog(0.6)
    dog.window.size = 10
    _serve(monkeypatch, dog, [0.6] * 4)
    _serve(monkeypatch, dog, [0.6] * 9 + [0.0])  # 1 of 10: compared
    assert dog.below_expected


def test_a_figure_that_states_no_temperature_is_compared_with_every_window(monkeypatch):
    dog = _watchdog(None)
    _serve(monkeypatch, dog, [1.0] * 4)
    _serve(monkeypatch, dog, [1.0] * 8)
    assert dog.below_expected and "at a temperature not stated" in dog.finding(2.0).expected


def test_the_launchs_figure_takes_the_launchs_temperature(monkeypatch):
    env = {settings.EXPECTED_ACCEPT_LENGTH: "2.5", settings.EXPECTED_ACCEPT_TEMPERATURE: "0.6"}
    monkeypatch.setattr(settings, "_current", [settings.read(env)])
    figure = aw.expected_figure()
    assert figure is not None and (figure.accept_length, figure.temperature) == (2.5, 0.6)
    monkeypatch.setattr(settings, "_current", [settings.read({settings.EXPECTED_ACCEPT_LENGTH: "2.5"})])
    assert aw.expected_figure().temperature is None


def test_the_gauges_say_the_figures_temperature(monkeypatch):
    import prometheus_client

    from eagle3_patches.instruments.watchdog_metrics import Gauges

    values: dict[str, float] = {}

    class Gauge:
        def __init__(self, name, doc, labelnames, multiprocess_mode):
            self.name = name

        def labels(self, **labels):
            gauge = self
            return SimpleNamespace(set=lambda value: values.__setitem__(gauge.name, value))

    monkeypatch.setattr(prometheus_client, "Gauge", Gauge)
    Gauges({"model_name": "m"}).export(_watchdog(0.6))
    assert values["eagle3_patches:expected_accept_temperature"] == 0.6
    values.clear()
    Gauges({"model_name": "m"}).export(_watchdog(None))
    assert (
        "eagle3_patches:expected_accept_temperature" not in values and values["eagle3_patches:expected_accept_length"]
    )


@pytest.mark.parametrize("final", [torch.zeros(2, 4), torch.zeros(3), torch.zeros(3, 4, dtype=torch.int64)])
def test_final_states_that_are_not_one_row_per_token_are_refused_naming_them(pinned, tmp_path, final):
    from eagle3_patches.acceptance.target_states import read_dump

    tensors = {
        "input_ids": torch.tensor([5, 6, 7]),
        "positions": torch.arange(3),
        "seq_ids": torch.full((3,), 7),
        "hidden_states": torch.zeros(3, 4),
        "decoded": torch.tensor([0, 1, 1], dtype=torch.int8),
        FINAL: final,
    }
    save_file(tensors, str(tmp_path / "shard-1-00000.safetensors"), metadata={"format": FORMAT})
    with pytest.raises(CheckpointError) as info:
        read_dump(tmp_path)
    shape = ", ".join(str(d) for d in final.shape)
    assert info.value.what == "a dump shard's tensors are not one row per token"
    assert info.value.found.endswith(f", {FINAL} {str(final.dtype).replace('torch.', '')} [{shape}]")
