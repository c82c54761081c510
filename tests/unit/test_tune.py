"""``eagle3-patches tune``: the grid, the expected accept length (the draft's own tree, held against a node-by-node
reference and the chain replay), the cost model's fit, the recommendation, the report, the plot and the CLI.  No
server: the draft is the trained tiny one run in torch on synthetic target states."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET

import pytest

from eagle3_patches import tune
from eagle3_patches.cli import main
from eagle3_patches.tune import CostModel, Cycle, Setting

# ---------------------------------------------------------------------- the grid


@pytest.mark.parametrize(
    ("setting", "ok"),
    [
        (Setting(3, 1, 4), True),
        (Setting(3, 1, 3), False),  # topk 1: sglang verifies steps + 1 whatever is asked
        (Setting(3, 1, 5), False),
        (Setting(1, 2, 3), True),  # a tree of 2 candidates: 2 + 1 draft tokens
        (Setting(1, 2, 4), False),
        (Setting(2, 2, 7), True),  # 2 + 1 x 4 = 6 candidates
        (Setting(2, 2, 8), False),
        (Setting(2, 4, 2), True),
        (Setting(2, 4, 1), False),
        (Setting(0, 1, 1), False),
    ],
)
def test_a_setting_is_valid_as_sglang_serves_it(setting, ok):
    assert tune.valid(setting) is ok


def test_the_grid_holds_every_valid_setting_and_no_other():
    g = tune.grid()
    assert len(set(g)) == len(g) and all(tune.valid(s) for s in g)
    assert {s.steps for s in g} == set(range(1, 9)) and {s.topk for s in g} == {1, 2, 4, 8}
    assert [s for s in g if s.topk == 1] == [Setting(s, 1, s + 1) for s in range(1, 9)]
    assert [s.draft_tokens for s in g if (s.steps, s.topk) == (2, 2)] == list(range(2, 8))
    assert max(s.draft_tokens for s in g) == tune.MAX_DRAFT_TOKENS
    assert len(tune.grid(max_draft_tokens=8)) < len(g)


# ---------------------------------------------------------------------- the accept length


def test_the_accept_length_and_depths_of_a_histogram():
    assert tune.accept_length([1, 2, 1]) == pytest.approx((1 + 4 + 3) / 4)
    assert tune.per_depth([1, 2, 1]) == pytest.approx([0.75, 0.25])
    with pytest.raises(tune.TuneError):
        tune.accept_length([0, 0])


def test_a_chain_from_its_per_position_figures():
    got = tune.chain_from_per_position([0.8, 0.5, 0.25])
    assert got == pytest.approx({Setting(1, 1, 2): 1.8, Setting(2, 1, 3): 2.3, Setting(3, 1, 4): 2.55})
    assert list(tune.chain_from_per_position([0.8, 0.5, 0.25], served_steps=2)) == [Setting(1, 1, 2), Setting(2, 1, 3)]
    for bad in ([0.5, 0.8], [1.2], []):
        with pytest.raises(tune.TuneError, match="not a chain"):
            tune.chain_from_per_position(bad)


def test_the_walk_over_depths_is_measure_accepts_walk():
    from eagle3_patches.acceptance.measure import walk
    from eagle3_patches.acceptance.tree import walk_depths

    rng = random.Random(5)
    for _ in range(300):
        L, steps = rng.randrange(3, 30), rng.randrange(1, 6)
        depth = [rng.randrange(0, steps + 2) for _ in range(L - 1)]
        labelled = [rng.random() < 0.8 for _ in range(L)]
        accept = [[1.0 if depth[t] >= k else 0.0 for t in range(L - k - 1)] for k in range(1, steps + 1)]
        want = [0.0] * (steps + 1)
        walk(accept, labelled, steps, want)
        got = [0] * (steps + 1)
        walk_depths(depth, labelled, steps, got)
        assert got == want


@pytest.fixture(scope="module")
def draft():
    """The trained tiny draft (its embedding random: the target's is not needed to exercise the tree) and a sequence
    whose tokens are mostly the draft's second choice: topk 1 is rarely accepted, a tree often."""
    import torch
    from safetensors.torch import load_file

    from eagle3_patches.acceptance.draft_reference import DraftForward, DraftShape
    from eagle3_patches.acceptance.target_states import TargetStates
    from eagle3_patches.testing import tiny_models as tm

    t = load_file(str(tm.TRAINED_DRAFT_TENSORS))
    d2t = t.pop("d2t")
    t.pop("t2d")
    hot = d2t + torch.arange(d2t.shape[0])
    g = torch.Generator().manual_seed(0)
    hidden = t["fc.weight"].shape[0]
    forward = DraftForward(t, torch.randn(tm.VOCAB, hidden, generator=g), DraftShape(hidden, 4, 4, hidden // 4))
    L = 28
    aux = torch.randn(L, t["fc.weight"].shape[1], generator=g)
    tokens = torch.randint(4, tm.VOCAB, (L,), generator=g)
    for i in range(2, L):
        logits = forward.forward_seq(tokens[: i + 1].clone(), aux[: i + 1], 1)[0][i - 2]
        rank = int(torch.randint(0, 3, (1,), generator=g))  # the first, second or third choice
        tokens[i] = hot[logits.topk(3).indices[rank]]
    labelled = torch.ones(L, dtype=torch.bool)
    labelled[:3] = False
    return forward, hot, TargetStates(tokens, aux, labelled, "synthetic")


def _reference_tree(forward, hot, tokens, aux, t, steps, topk, offset):
    """sglang's tree at base t built node by node (dense attention over the step-1 keys up to t and the node's own
    ancestors): every candidate's target token, score, parent and depth."""
    import torch

    from eagle3_patches.acceptance.draft_reference import attend

    fc = forward.params["fc.weight"]
    L = aux.shape[0]
    h = aux[:-1] @ fc.T
    q1, k1, v1 = forward.qkv(tokens[1:L], h, torch.arange(L - 1))
    logits, out = forward.finish(attend(q1, k1, v1, [], [], forward.hd**-0.5), h)
    k1, v1 = k1[: t + 1], v1[: t + 1]
    g = forward.nh // forward.nkv

    def step(node, pos):  # the node's forward: its own k/v after its ancestors'
        q, k, v = forward.qkv(torch.tensor([node["tok"]]), node["hid"][None], torch.tensor([pos]))
        keys = torch.cat([k1, *node["ks"], k]).repeat_interleave(g, 1)
        vals = torch.cat([v1, *node["vs"], v]).repeat_interleave(g, 1)
        w = (torch.einsum("qhd,khd->hqk", q, keys) * forward.hd**-0.5).softmax(-1)
        lg, o = forward.finish(torch.einsum("hqk,khd->qhd", w, vals), node["hid"][None])
        return lg[0], o[0], [*node["ks"], k], [*node["vs"], v]

    nodes = []
    frontier = [{"idx": -1, "score": 1.0, "probs": logits[t], "hid": out[t], "ks": [], "vs": []}]
    for j in range(1, steps + 1):
        cands = []
        for f in frontier:
            cp, ci = f["probs"].float().softmax(-1).topk(topk)
            for pp, ii in zip(cp.tolist(), ci.tolist()):
                nodes.append({"tok": int(hot[ii]), "score": f["score"] * pp, "parent": f["idx"], "depth": j})
                cands.append({**f, "idx": len(nodes) - 1, "tok": int(hot[ii]), "score": f["score"] * pp})
        if j == steps:
            break
        frontier = []
        for c in sorted(cands, key=lambda c: -c["score"])[:topk]:  # the best-scored are expanded
            c["probs"], c["hid"], c["ks"], c["vs"] = step(c, t + j + 1 + offset)
            frontier.append(c)
    return nodes


def _verified_depth(nodes, tokens, t, steps, draft_tokens):
    """The greedy verify of the ``draft_tokens - 1`` best-scored nodes: the depth of the longest root path that is the
    data's."""
    import torch

    kept = set(torch.tensor([n["score"] for n in nodes]).topk(min(draft_tokens - 1, len(nodes))).indices.tolist())
    depth, parent = 0, -1
    while depth < steps and t + depth + 2 < len(tokens):
        want = int(tokens[t + depth + 2])
        nxt = [i for i in kept if nodes[i]["parent"] == parent and nodes[i]["tok"] == want]
        if not nxt:
            break
        parent, depth = nxt[0], depth + 1
    return depth


@pytest.mark.parametrize(("topk", "worker"), [(2, "v1"), (4, "v2")])
def test_the_tree_is_sglangs_tree_built_node_by_node(draft, topk, worker):
    from eagle3_patches.acceptance.draft_reference import CHAIN_OFFSET
    from eagle3_patches.acceptance.tree import run_tree

    forward, hot, st = draft
    steps = 3
    run = run_tree(forward, hot, st.tokens, st.aux, topk, steps, worker)
    seen = set()
    for s in range(1, steps + 1):
        sizes = [g.draft_tokens for g in tune.grid(steps=[s], topks=[topk])]
        got = run.depths(s, sizes)
        for t in range(0, got.shape[0], 3):
            nodes = _reference_tree(forward, hot, st.tokens, st.aux, t, s, topk, CHAIN_OFFSET[worker])
            want = [_verified_depth(nodes, st.tokens, t, s, n) for n in sizes]
            assert got[t].tolist() == want, (s, t)
            seen.update(want)
    assert seen >= {0, 1, 2}  # the data reach into the tree: a check of depths that are all 0 would be empty


def test_a_path_through_a_node_the_tree_did_not_expand_ends_there(draft):
    """The target's tokens at base t chosen from the tree itself: level 1 any node, level 2 a child of it that the
    tree keeps but does not expand (not among the topk best of its level), level 3 a child of the best node of level 2.
    That last token is in the tree, under another parent: greedy verification accepts two tokens, not three."""
    from eagle3_patches.acceptance.draft_reference import CHAIN_OFFSET
    from eagle3_patches.acceptance.tree import run_tree

    forward, hot, st = draft
    t, steps, topk, draft_tokens = 5, 3, 2, 11  # 2 + 4 + 4 candidates: every one kept
    nodes = _reference_tree(forward, hot, st.tokens, st.aux, t, steps, topk, CHAIN_OFFSET["v1"])
    level2 = sorted((i for i, n in enumerate(nodes) if n["depth"] == 2), key=lambda i: -nodes[i]["score"])
    leaf = level2[topk]  # kept, not expanded
    best_child = next(n for n in nodes if n["parent"] == level2[0])
    tokens = st.tokens.clone()
    tokens[t + 2 : t + 5] = tokens.new_tensor(
        [nodes[nodes[leaf]["parent"]]["tok"], nodes[leaf]["tok"], best_child["tok"]]
    )
    assert _verified_depth(nodes, tokens, t, steps, draft_tokens) == 2
    run = run_tree(forward, hot, tokens, st.aux, topk, steps)
    assert run.depths(steps, [draft_tokens])[t].tolist() == [2]


@pytest.mark.parametrize("L", [3, 9])
def test_the_tree_holds_no_level_past_the_datas_end_even_where_the_draft_predicts_token_0(draft, L):
    """Every draft token maps to target token 0 and the data are all 0, so each level of the chain is on the path
    until the data end: a base t holds exactly its L - 2 - t levels left, never one past them (at the tree's last
    level too), and a sequence shorter than the tree's levels runs.  topk 1: siblings of one token cannot occur."""
    import torch

    from eagle3_patches.acceptance.tree import run_tree

    forward, hot, st = draft
    zeros = torch.zeros_like(hot)
    steps = 4
    run = run_tree(forward, zeros, torch.zeros(L, dtype=torch.int64), st.aux[:L], 1, steps)
    for s in range(1, steps + 1):
        got = run.depths(s, [s + 1])[:, 0].tolist()
        assert got == [min(s, L - 2 - t) for t in range(L - 1)], s


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_topk_1_gives_measure_accepts_chain(draft, worker):
    from eagle3_patches.acceptance import measure
    from eagle3_patches.acceptance.tree import measure_grid

    forward, hot, st = draft
    settings = [(s, 1, s + 1) for s in (1, 2, 4)]
    got, n = measure_grid(forward, hot, [st], settings, worker)
    assert n == 1
    for s, k, d in settings:
        assert got[(s, k, d)] == measure.replay(forward, hot, [st], s, worker).histogram


def test_the_grid_measures_the_tree_of_the_worker_it_is_given(draft):
    """Spec v1 and v2 place the draft's later steps one position apart: the two trees differ on these data, and the
    grid's histogram at topk > 1 is that of the worker asked for."""
    from eagle3_patches.acceptance.tree import measure_grid, run_tree, walk_depths

    forward, hot, st = draft
    setting = (4, 4, 9)
    labelled = [bool(x) for x in st.labelled.tolist()]
    got = {}
    for worker in ("v1", "v2"):
        want = [0] * 5
        walk_depths(run_tree(forward, hot, st.tokens, st.aux, 4, 4, worker).depths(4, [9])[:, 0], labelled, 4, want)
        got[worker] = measure_grid(forward, hot, [st], [setting], worker)[0][setting]
        assert got[worker] == want, worker
    assert got["v1"] != got["v2"]


def test_a_wider_tree_of_the_same_steps_accepts_at_least_as_much(draft):
    from eagle3_patches.acceptance.tree import measure_grid

    forward, hot, st = draft
    settings = [(3, 4, n) for n in (2, 4, 8, 16, 22)]
    got, _ = measure_grid(forward, hot, [st], settings)
    lengths = [tune.accept_length(got[s]) for s in settings]
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0]


# ---------------------------------------------------------------------- the cost model


TRUE = CostModel(0.02, 0.01, 0.002, 0.001)
CALIBRATION = [Setting(1, 1, 2), Setting(4, 1, 5), Setting(2, 4, 8), Setting(3, 4, 16)]


def test_the_cost_of_a_cycle():
    # 1 fixed + 2 per step x 3 steps + 3 per verified token x 2 requests x 8 tokens + 4 per draft token x 3 steps x
    # 2 requests x topk 4
    assert CostModel(1.0, 2.0, 3.0, 4.0).cycle(Setting(3, 4, 8), 2) == 1 + 6 + 48 + 96
    assert CostModel(1.0, 2.0, 3.0, 4.0).describe() == (
        "cycle seconds = 1 + 2 x steps + 3 x B x draft_tokens + 4 x steps x B x topk"
    )


def test_the_fit_recovers_the_parameters_the_cycles_were_made_with():
    cycles = [Cycle(s, b, TRUE.cycle(s, b)) for s in CALIBRATION for b in (1, 4)]
    got = tune.fit(cycles)
    for name in tune.PARAMS:
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)


def test_the_fit_keeps_every_parameter_non_negative():
    # cycles that a negative cost per step would fit exactly: no parameter may go below 0 to fit them
    negative = CostModel(0.05, -0.004, 0.002, 0.001)
    cycles = [Cycle(s, b, negative.cycle(s, b)) for s in CALIBRATION for b in (1, 4)]
    got = tune.fit(cycles)
    assert all(getattr(got, n) >= 0 for n in tune.PARAMS)
    assert got.c_step == 0 and got.c0 > 0


def test_a_calibration_that_cannot_tell_the_parameters_apart_is_refused():
    with pytest.raises(tune.TuneError, match="four parameters") as e:
        tune.fit([Cycle(Setting(s, 1, s + 1), 1, 0.1 * s) for s in range(1, 7)])  # topk 1, one batch size
    assert "topk > 1" in e.value.expected


def test_a_cycle_from_a_bench_phase():
    c = tune.cycle_from_phase(Setting(3, 1, 4), {"concurrency": 4, "output_tokens_per_s": 80.0, "accept_length": 2.5})
    assert c == Cycle(Setting(3, 1, 4), 4, 4 * 2.5 / 80.0)
    with pytest.raises(tune.TuneError, match="accept length"):
        tune.cycle_from_phase(Setting(3, 1, 4), {"concurrency": 4, "output_tokens_per_s": 80.0, "accept_length": None})


# ---------------------------------------------------------------------- the recommendation


def test_the_recommendation_is_the_best_predicted_valid_setting():
    accept = {s: 1.0 + 0.6 * s.steps**0.5 + 0.15 * (s.topk > 1) * s.draft_tokens**0.3 for s in tune.grid()}
    accept[Setting(3, 2, 30)] = 50.0  # not a setting sglang serves as given: never recommended
    pred = tune.predict(accept, TRUE, [1, 16])
    for b, rows in pred.items():
        brute = max((s for s in accept if tune.valid(s)), key=lambda s: b * accept[s] / TRUE.cycle(s, b))
        assert tune.recommend(pred)[b].setting == brute
        assert all(tune.valid(p.setting) for p in rows)
        assert [p.tokens_per_s for p in rows] == sorted((p.tokens_per_s for p in rows), reverse=True)
    # a larger batch makes each verified token dearer: the tree it picks is no larger
    assert tune.recommend(pred)[16].setting.draft_tokens <= tune.recommend(pred)[1].setting.draft_tokens
    for b in (1, 16):  # b requests in flight, each accepting the accept length per cycle
        p = pred[b][0]
        assert p.tokens_per_s == pytest.approx(b * accept[p.setting] / TRUE.cycle(p.setting, b))


def test_tokens_per_second_keep_three_figures_on_a_slow_device():
    assert [tune._rate(v) for v in (0.2712, 54.321, 1234.56)] == ["0.271", "54.3", "1234.6"]


def test_spearman():
    assert tune.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert tune.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert tune.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert tune.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)


def test_the_plot_is_an_svg_with_a_line_per_topk_and_the_best_marked():
    accept = {s: 1.0 + 0.5 * s.steps**0.5 + 0.1 * s.topk for s in tune.grid(max_draft_tokens=16)}
    pred = tune.predict(accept, TRUE, [1, 8])
    root = ET.fromstring(tune.svg(pred))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2 * 4
    assert len(root.findall(f"{ns}circle")) == 2
    texts = [t.text for t in root.findall(f"{ns}text")]
    assert f"best {pred[8][0].setting.label()}" in texts
    assert tune._rate(pred[8][0].tokens_per_s * 1.1 / 1.1) in texts  # the axis's top: the best, to three figures


# ---------------------------------------------------------------------- the command


def _calibration_files(tmp_path, model=TRUE, accept=2.0):
    args = []
    for s in CALIBRATION:
        phases = [
            {"concurrency": b, "output_tokens_per_s": b * accept / model.cycle(s, b), "accept_length": accept}
            for b in (1, 4)
        ]
        f = tmp_path / f"{s.label().replace('/', '-')}.json"
        f.write_text(json.dumps({"servers": [{"single": phases[0], "concurrent": phases[1]}]}))
        args += ["--calibration", f"{s.steps},{s.topk},{s.draft_tokens}={f}"]
    return args


def test_the_command_prints_the_table_and_the_flags_to_paste(tmp_path, capsys):
    plot = tmp_path / "tune.svg"
    rc = main(["tune", "--per-position", "0.95,0.9,0.85,0.3", *_calibration_files(tmp_path), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "cycle seconds = 0.02 + 0.01 x steps + 0.002 x B x draft_tokens + 0.001 x steps x B x topk" in out
    # batch 1: 3.7 tokens in 0.022 + 3 x 0.013 s (60.7/s) beat 2.85 in 0.048 s (59.4/s) and 4.0 in 0.074 s (54.1/s);
    # batch 4 pays 4 x 0.002 s more per verified token: 2 steps (158.3/s) beat 3 (157.4/s)
    assert (
        "recommended at batch size 1: --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4" in out
    )
    assert (
        "recommended at batch size 4: --speculative-num-steps 2 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 3" in out
    )
    assert (
        "  3/1/4                         3.700     61.00      60.7" in out
    )  # steps/topk/draft tokens, accept length, cycle ms, tokens/s
    assert plot.read_text().startswith("<svg")
    rc = main(["tune", "--per-position", "0.9,0.8", *_calibration_files(tmp_path), "--json", "--batch-sizes", "2"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and list(report["batches"]) == ["2"] and report["recommended"]["2"]["topk"] == 1


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        (["--per-position", "0.5"], 2, "--calibration"),
        (["--calibration", "3,1=x.json", "--per-position", "0.5"], 2, "STEPS,TOPK,DRAFT_TOKENS=FILE"),
        (["--calibration", "3,1,3=x.json", "--per-position", "0.5"], 2, "not a setting sglang serves"),
        (["--calibration", "1,1,2=x.json"], 2, "--draft and --data"),
        (["--per-position", "0.5", "--data", "d", "--calibration", "1,1,2=x.json"], 2, "one or the other"),
    ],
)
def test_usage_errors(argv, status, said, capsys):
    with pytest.raises(SystemExit) as e:
        main(["tune", *argv])
    assert e.value.code == status and said in capsys.readouterr().err


def test_a_calibration_file_that_is_not_a_bench_report_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{\x1b[31m")
    assert main(["tune", "--per-position", "0.5", "--calibration", f"1,1,2={bad}"]) == 1
    err = capsys.readouterr().err
    assert "not an `eagle3-patches bench --json` report" in err and str(bad) in err
    assert "Traceback" not in err and "\x1b" not in err


def test_the_grid_measures_every_sequence_long_enough_and_refuses_states_the_draft_cannot_run_on(draft, capsys):
    from eagle3_patches.acceptance.measure import MeasureError
    from eagle3_patches.acceptance.target_states import TargetStates
    from eagle3_patches.acceptance.tree import measure_grid

    forward, hot, st = draft
    cut = [TargetStates(st.tokens[:n], st.aux[:n], st.labelled[:n], f"first {n}") for n in (2, 3)]
    settings = [(2, 2, 3)]
    got, n = measure_grid(forward, hot, [cut[0], cut[1], st], settings)  # 2 tokens: no verify step to measure
    assert n == 2 and got == measure_grid(forward, hot, [cut[1], st], settings)[0]
    assert capsys.readouterr().err == ""  # no progress bar unless asked
    measure_grid(forward, hot, [st], settings, progress=True)
    assert f"tune: the draft's trees: {len(st.tokens)}.0tok" in capsys.readouterr().err  # every token, once
    narrow = TargetStates(st.tokens, st.aux[:, :-1], st.labelled, "narrow.safetensors")
    with pytest.raises(MeasureError, match="the width the draft's fc takes"):
        measure_grid(forward, hot, [narrow], settings)
    # the bar is closed before the caller tells the error (while it holds the traceback): its line is ended
    with pytest.raises(MeasureError) as told:
        measure_grid(forward, hot, [narrow], settings, progress=True)
    assert capsys.readouterr().err.endswith("\n") and told.value
