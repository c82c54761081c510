"""CPU fallbacks for sgl_kernel's EAGLE tree ops (eagle3_patches.cpu.spec_kernels).

Expected values are worked out by hand in the comments, or copied from upstream tests:
sglang's ``test/srt/test_build_eagle_tree.py`` and sgl-kernel's
``tests/speculative/test_eagle_utils.py``. The patch tests run the installed real sglang (any
release of the matrix) in spawned processes (CPU profile active), the way a serving process would.
"""

from __future__ import annotations

import logging

import pytest
import torch
from support.releases import only_release, release

from eagle3_patches.cpu.spec_kernels import (
    FULL_MASK,
    QLEN_ONLY,
    QLEN_ONLY_BITPACKING,
    build_tree_kernel_efficient,
    packed_mask_bytes,
    verify_tree_greedy,
)

# --------------------------------------------------------------------------------------
# helpers: buffers allocated as sglang's eagle_utils.build_tree_kernel_efficient does
# --------------------------------------------------------------------------------------


def _mask_buffer(mode, seq_lens, n):
    bs = len(seq_lens)
    if mode == FULL_MASK:
        return torch.full((sum(seq_lens) * n + n * n * bs,), True, dtype=torch.bool)
    if mode == QLEN_ONLY:
        return torch.full((n * n * bs,), True, dtype=torch.bool)
    dtype = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}[packed_mask_bytes(n)]
    return torch.zeros((n * bs,), dtype=dtype)


def build(parent_list, selected, seq_lens, topk, depth, n, mode):
    bs = len(seq_lens)
    out = dict(
        tree_mask=_mask_buffer(mode, seq_lens, n),
        positions=torch.empty((bs * n,), dtype=torch.long),
    )
    retrive = torch.full((3, bs, n), -1, dtype=torch.long)
    out["retrive_index"], out["retrive_next_token"], out["retrive_next_sibling"] = retrive
    build_tree_kernel_efficient(
        torch.tensor(parent_list, dtype=torch.long),
        torch.tensor(selected, dtype=torch.long),
        torch.tensor(seq_lens, dtype=torch.long),
        out["tree_mask"],
        out["positions"],
        out["retrive_index"],
        out["retrive_next_token"],
        out["retrive_next_sibling"],
        topk,
        depth,
        n,
        mode,
    )
    return out


def packed_rows(mask, n):
    """Bit-packed rows back to ints (little endian), one per draft token."""
    nbytes = packed_mask_bytes(n)
    raw = mask.view(torch.uint8).view(-1, nbytes).tolist()
    return [int.from_bytes(bytes(r), "little") for r in raw]


# --------------------------------------------------------------------------------------
# a chain: topk 1, 3 steps, 4 draft tokens -- root 0 -> 1 -> 2 -> 3
#   parent_list = [-1, 0, 1] (the draft loop's chain parents), top_scores_index = [0, 1, 2]
#   token 1: 0 // 1 = 0 -> root; token 2: parent_list[1] = 0 = score index of token 1;
#   token 3: parent_list[2] = 1 = score index of token 2.
# --------------------------------------------------------------------------------------
CHAIN = dict(parent_list=[[-1, 0, 1]], selected=[[0, 1, 2]], topk=1, depth=3, n=4)
CHAIN_TREE = [  # row i attends to the root, its ancestors and itself
    [1, 0, 0, 0],
    [1, 1, 0, 0],
    [1, 1, 1, 0],
    [1, 1, 1, 1],
]


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_chain_links_and_positions(mode):
    out = build(seq_lens=[5], mode=mode, **CHAIN)
    assert out["positions"].tolist() == [5, 6, 7, 8]
    assert out["retrive_index"].tolist() == [[0, 1, 2, 3]]
    assert out["retrive_next_token"].tolist() == [[1, 2, 3, -1]]
    assert out["retrive_next_sibling"].tolist() == [[-1, -1, -1, -1]]


def test_chain_qlen_only_mask():
    out = build(seq_lens=[5], mode=QLEN_ONLY, **CHAIN)
    assert out["tree_mask"].view(4, 4).int().tolist() == CHAIN_TREE


def test_chain_bitpacked_mask():
    out = build(seq_lens=[5], mode=QLEN_ONLY_BITPACKING, **CHAIN)
    assert out["tree_mask"].dtype == torch.uint8
    assert out["tree_mask"].tolist() == [0b1, 0b11, 0b111, 0b1111]


def test_chain_full_mask_two_requests():
    # two requests, seq_lens 5 and 3: request 0 owns 4 rows of 5 + 4, request 1 starts at
    # 5 * 4 + 4 * 4 = 36 with 4 rows of 3 + 4; the prefix columns stay True (sglang's fill)
    out = build(
        parent_list=[[-1, 0, 1], [-1, 0, 1]],
        selected=[[0, 1, 2], [0, 1, 2]],
        seq_lens=[5, 3],
        topk=1,
        depth=3,
        n=4,
        mode=FULL_MASK,
    )
    mask = out["tree_mask"].int()
    assert mask.numel() == (5 + 3) * 4 + 2 * 16
    req0 = mask[:36].view(4, 9).tolist()
    req1 = mask[36:].view(4, 7).tolist()
    assert req0 == [[1] * 5 + row for row in CHAIN_TREE]
    assert req1 == [[1] * 3 + row for row in CHAIN_TREE]
    assert out["positions"].tolist() == [5, 6, 7, 8, 3, 4, 5, 6]
    assert out["retrive_index"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out["retrive_next_token"].tolist() == [[1, 2, 3, -1]] * 2


def test_full_mask_writes_tree_columns_over_false_prefix():
    # the tree part is written whatever the buffer held; the prefix is left alone
    seq_lens, n = [2], 4
    mask = torch.zeros(2 * 4 + 16, dtype=torch.bool)
    pos = torch.empty(4, dtype=torch.long)
    ri, rnt, rns = torch.full((3, 1, 4), -1, dtype=torch.long)
    build_tree_kernel_efficient(
        torch.tensor(CHAIN["parent_list"]),
        torch.tensor(CHAIN["selected"]),
        torch.tensor(seq_lens),
        mask,
        pos,
        ri,
        rnt,
        rns,
        1,
        3,
        n,
        FULL_MASK,
    )
    assert mask.view(4, 6).int().tolist() == [[0, 0] + row for row in CHAIN_TREE]


def test_long_chain_bitpacked_two_bytes():
    # 10 draft tokens (9 steps, topk 1): rows take 2 bytes (uint16 buffer, as sglang allocates)
    # row i has bits 0..i set: 2**(i+1) - 1; row 9 = 1023 = bytes ff 03
    out = build(
        parent_list=[[-1] + list(range(8))],
        selected=[list(range(9))],
        seq_lens=[4],
        topk=1,
        depth=9,
        n=10,
        mode=QLEN_ONLY_BITPACKING,
    )
    assert out["tree_mask"].dtype == torch.uint16
    assert out["tree_mask"].view(torch.uint8)[-2:].tolist() == [0xFF, 0x03]
    assert packed_rows(out["tree_mask"], 10) == [2 ** (i + 1) - 1 for i in range(10)]
    assert out["positions"].tolist() == list(range(4, 14))


def test_bitpacked_row_widths():
    assert [packed_mask_bytes(n) for n in (1, 8, 9, 16, 17, 32)] == [1, 1, 2, 2, 4, 4]
    with pytest.raises(ValueError):
        packed_mask_bytes(33)


# --------------------------------------------------------------------------------------
# a branching tree: topk 2, 3 steps, 6 draft tokens
#   flattened score list: step 0 -> indices 0, 1; step 1 -> 2..5 (2 + 2 * parent + child);
#   step 2 -> 6..9 (6 + 2 * slot + child, slot into parent_list[3:5])
#   parent_list = [-1, 0, 1, 3, 2]  (step 1 kept score indices 3 and 2, in that order)
#   top_scores_index = [0, 1, 2, 3, 8]
#     token 1: 0 // 2 = 0 -> root          token 2: 1 // 2 = 0 -> root
#     token 3: 2 // 2 = 1 -> parent_list[1] = 0 -> token 1
#     token 4: 3 // 2 = 1 -> token 1
#     token 5: 8 // 2 = 4 -> parent_list[4] = 2 -> token 3
#   tree: 0 -> {1, 2}; 1 -> {3, 4}; 3 -> {5}; depths 0 1 1 2 2 3
# --------------------------------------------------------------------------------------
TREE = dict(parent_list=[[-1, 0, 1, 3, 2]], selected=[[0, 1, 2, 3, 8]], topk=2, depth=3, n=6)
TREE_ROWS = [
    [1, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0],
    [1, 1, 0, 1, 0, 0],
    [1, 1, 0, 0, 1, 0],
    [1, 1, 0, 1, 0, 1],
]


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_branching_tree_links_and_positions(mode):
    out = build(seq_lens=[7], mode=mode, **TREE)
    assert out["positions"].tolist() == [7, 8, 8, 9, 9, 10]
    assert out["retrive_index"].tolist() == [[0, 1, 2, 3, 4, 5]]
    # first child / next sibling, children in ascending order
    assert out["retrive_next_token"].tolist() == [[1, 3, -1, 5, -1, -1]]
    assert out["retrive_next_sibling"].tolist() == [[-1, 2, -1, 4, -1, -1]]


def test_branching_tree_masks():
    assert build(seq_lens=[7], mode=QLEN_ONLY, **TREE)["tree_mask"].view(6, 6).int().tolist() == TREE_ROWS
    full = build(seq_lens=[7], mode=FULL_MASK, **TREE)["tree_mask"]
    assert full.view(6, 13).int().tolist() == [[1] * 7 + row for row in TREE_ROWS]
    packed = build(seq_lens=[7], mode=QLEN_ONLY_BITPACKING, **TREE)["tree_mask"]
    assert packed.tolist() == [0b1, 0b11, 0b101, 0b1011, 0b10011, 0b101011]


def test_qlen_only_second_request_offset():
    # request 1 (seq_len 2, a chain of the same size) starts at n * n = 36 in QLEN_ONLY mode
    out = build(
        parent_list=[[-1, 0, 1, 3, 2], [-1, 0, 1, 2, 4]],
        selected=[[0, 1, 2, 3, 8], [0, 1, 2, 3, 6]],
        seq_lens=[7, 2],
        topk=2,
        depth=3,
        n=6,
        mode=QLEN_ONLY,
    )
    # request 1, same shape reached another way: token 1 (0) root; token 2 (1) root;
    # token 3 (2 // 2 = 1 -> parent_list[1] = 0) -> token 1; token 4 (3) -> token 1;
    # token 5 (6 // 2 = 3 -> parent_list[3] = 2) -> token 3
    mask = out["tree_mask"].int()
    assert mask[:36].view(6, 6).tolist() == TREE_ROWS
    assert mask[36:].view(6, 6).tolist() == TREE_ROWS
    assert out["positions"].tolist() == [7, 8, 8, 9, 9, 10, 2, 3, 3, 4, 4, 5]
    assert out["retrive_index"][1].tolist() == [6, 7, 8, 9, 10, 11]


# --------------------------------------------------------------------------------------
# upstream: sglang test/srt/test_build_eagle_tree.py (topk 4, depth 4, 8 draft tokens, bs 2)
# --------------------------------------------------------------------------------------
UPSTREAM_PARENTS = [
    [[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]],
    [[4, 8, 9, 10], [4, 5, 6, 7]],
    [[20, 24, 21, 28], [24, 28, 20, 21]],
    [[36, 40, 41, 44], [36, 40, 44, 45]],
]
UPSTREAM_SCORES = [
    [[[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]], [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]]],
    [
        [
            [6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03],
            [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
            [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08],
            [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05],
        ],
        [
            [8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02],
            [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
            [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05],
            [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08],
        ],
    ],
    [
        [
            [6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06],
            [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
            [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05],
            [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05],
        ],
        [
            [2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03],
            [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
            [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04],
            [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04],
        ],
    ],
    [
        [
            [6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06],
            [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
            [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05],
            [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05],
        ],
        [
            [5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04],
            [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
            [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03],
            [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04],
        ],
    ],
]
UPSTREAM_EXPECTED = dict(
    positions=[5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14],
    retrive_index=[[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]],
    retrive_next_token=[[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]],
    retrive_next_sibling=[[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]],
)


def upstream_tree_inputs():
    """parent_list and top_scores_index as sglang's organize_draft_results makes them."""
    scores = torch.cat([torch.tensor(s) for s in UPSTREAM_SCORES], dim=1).flatten(1)
    top = torch.sort(torch.topk(scores, 8 - 1, dim=-1).indices).values
    parent_list = torch.cat([torch.tensor(p) for p in UPSTREAM_PARENTS[:-1]], dim=1)
    return parent_list, top


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_upstream_build_eagle_tree_case(mode):
    parent_list, top = upstream_tree_inputs()
    out = build(parent_list.tolist(), top.tolist(), [5, 10], topk=4, depth=4, n=8, mode=mode)
    for key, expected in UPSTREAM_EXPECTED.items():
        assert out[key].tolist() == expected, key


# --------------------------------------------------------------------------------------
# malformed trees
# --------------------------------------------------------------------------------------


def _buffers(bs, n):
    retrive = torch.full((3, bs, n), -1, dtype=torch.long)
    return torch.full((n * n * bs,), True), torch.full((bs * n,), -7, dtype=torch.long), *retrive


@pytest.mark.parametrize(
    "parent_list",
    [
        [[-1, 1, 1]],  # token 2 (score index 1) is its own parent: parent_list[1] = 1
        [[-1, 2, 1]],  # tokens 2 and 3 are each other's parent: 2 -> 3 -> 2
    ],
)
def test_cyclic_parent_list_raises_and_writes_nothing(parent_list):
    mask, pos, ri, rnt, rns = _buffers(1, 4)
    with pytest.raises(ValueError, match="loops"):
        build_tree_kernel_efficient(
            torch.tensor(parent_list),
            torch.tensor([[0, 1, 2]]),
            torch.tensor([5]),
            mask,
            pos,
            ri,
            rnt,
            rns,
            1,
            3,
            4,
            QLEN_ONLY,
        )
    assert pos.tolist() == [-7] * 4 and ri.tolist() == [[-1] * 4] and mask.all()


def test_parent_slot_outside_parent_list_raises():
    mask, pos, ri, rnt, rns = _buffers(1, 4)
    with pytest.raises(ValueError, match="outside parent_list"):
        # score index 9 // topk 1 = slot 9, parent_list has 3 entries
        build_tree_kernel_efficient(
            torch.tensor([[-1, 0, 1]]),
            torch.tensor([[0, 1, 9]]),
            torch.tensor([5]),
            mask,
            pos,
            ri,
            rnt,
            rns,
            1,
            3,
            4,
            QLEN_ONLY,
        )


def test_unselected_parent_is_left_out_with_a_warning(caplog):
    # token 3's parent (score index 5) was not selected: the CUDA kernel prints
    # "invalid eagle tree" and leaves the token out of the retrieve lists
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        out = build([[-1, 0, 5]], [[0, 1, 2]], [5], topk=1, depth=3, n=4, mode=QLEN_ONLY)
    assert "invalid EAGLE tree" in caplog.text
    assert out["retrive_next_token"].tolist() == [[1, 2, -1, -1]]
    assert out["retrive_next_sibling"].tolist() == [[-1, -1, -1, -1]]
    # its row and position stop at the missing parent: root + itself, depth 1
    assert out["tree_mask"].view(4, 4)[3].int().tolist() == [1, 0, 0, 1]
    assert out["positions"].tolist() == [5, 6, 7, 6]


def test_single_step_empty_parent_list():
    # spec_steps 1: organize_draft_results gives an empty (float) parent_list; all tokens are root children
    mask, pos, ri, rnt, rns = _buffers(1, 3)
    build_tree_kernel_efficient(
        torch.empty(1, 0), torch.tensor([[0, 1]]), torch.tensor([4]), mask, pos, ri, rnt, rns, 2, 1, 3, QLEN_ONLY
    )
    assert pos.tolist() == [4, 5, 5]
    assert rnt.tolist() == [[1, -1, -1]] and rns.tolist() == [[-1, 2, -1]]
    assert mask.view(3, 3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]


# --------------------------------------------------------------------------------------
# verify_tree_greedy
# --------------------------------------------------------------------------------------


def _verify(candidates, retrive_index, next_token, next_sibling, target_predict, num_spec_step):
    bs, n = len(candidates), len(candidates[0])
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec_step), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), 0, dtype=torch.int32)
    verify_tree_greedy(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=torch.tensor(candidates),
        retrive_index=torch.tensor(retrive_index),
        retrive_next_token=torch.tensor(next_token),
        retrive_next_sibling=torch.tensor(next_sibling),
        target_predict=torch.tensor(target_predict),
    )
    return predicts.tolist(), accept_index.tolist(), accept_num.tolist()


def test_verify_upstream_sgl_kernel_case():
    # sgl-kernel tests/speculative/test_eagle_utils.py::test_verify_tree_greedy
    target_logits = torch.full((2, 6, 20), 1.0)
    target_logits[0, 0, 3] = 10
    target_logits[0, 3, 4] = 10
    target_logits[0, 4, 5] = 10
    target_logits[1, 0, 11] = 10
    target_logits[1, 4, 12] = 10
    for i in range(2):
        for j in range(6):
            if torch.max(target_logits[i][j]) < 10:
                target_logits[i][j][18] = 10
    got = _verify(
        candidates=[[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]],
        retrive_index=[[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]],
        next_token=[[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]],
        next_sibling=[[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]],
        target_predict=torch.argmax(target_logits, dim=-1).tolist(),
        num_spec_step=4,
    )
    assert got == (
        [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18],
        [[0, 3, 4, 5], [6, 10, 11, -1]],
        [3, 2],
    )


# the branching tree above (0 -> {1, 2}; 1 -> {3, 4}; 3 -> {5}), as build_tree links it
_TREE_LINKS = dict(next_token=[1, 3, -1, 5, -1, -1], next_sibling=[-1, 2, -1, 4, -1, -1])
_TREE_CANDIDATES = [99, 10, 20, 30, 40, 50]


def test_verify_branching_tree_by_hand():
    # request 0: target at root says 20 -> token 1 (10) rejected, its sibling token 2 (20)
    #   accepted; token 2 has no child: stop. bonus = target at token 2 (77)
    # request 1: root 10 -> token 1; at token 1 the target says 40 -> token 3 (30) rejected,
    #   sibling token 4 (40) accepted; no child: stop. bonus = target at token 4 (88)
    # request 2: root 10 -> 1, then 30 -> 3, then 50 -> 5: three accepted (all the steps);
    #   bonus = target at token 5 (66)
    # request 3: the root's prediction (55) matches no child: nothing accepted, bonus 55
    bs, n = 4, 6
    target = [
        [20, 0, 77, 0, 0, 0],
        [10, 40, 0, 0, 88, 0],
        [10, 30, 0, 50, 0, 66],
        [55, 0, 0, 0, 0, 0],
    ]
    predicts, accept_index, accept_num = _verify(
        candidates=[_TREE_CANDIDATES] * bs,
        retrive_index=[[b * n + i for i in range(n)] for b in range(bs)],
        next_token=[_TREE_LINKS["next_token"]] * bs,
        next_sibling=[_TREE_LINKS["next_sibling"]] * bs,
        target_predict=target,
        num_spec_step=4,  # spec_steps + 1 columns, as sglang allocates accept_index
    )
    assert accept_num == [1, 2, 3, 0]
    assert accept_index == [[0, 2, -1, -1], [6, 7, 10, -1], [12, 13, 15, 17], [18, -1, -1, -1]]
    expected = [-1] * (bs * n)
    expected[0], expected[2] = 20, 77
    expected[6], expected[7], expected[10] = 10, 40, 88
    expected[12], expected[13], expected[15], expected[17] = 10, 30, 50, 66
    expected[18] = 55
    assert predicts == expected


def test_verify_stops_after_the_step_budget():
    # same as request 2 above, but accept_index has 3 columns: at most 2 accepted;
    # the bonus is the target's prediction at token 3 (50)
    predicts, accept_index, accept_num = _verify(
        candidates=[_TREE_CANDIDATES],
        retrive_index=[list(range(6))],
        next_token=[_TREE_LINKS["next_token"]],
        next_sibling=[_TREE_LINKS["next_sibling"]],
        target_predict=[[10, 30, 0, 50, 0, 66]],
        num_spec_step=3,
    )
    assert (accept_num, accept_index) == ([2], [[0, 1, 3]])
    assert predicts == [10, 30, -1, 50, -1, -1]


def test_verify_chain_accept_all_and_none():
    # chain 0 -> 1 -> 2 -> 3, candidates [5, 6, 7, 8]
    chain = dict(
        candidates=[[5, 6, 7, 8]],
        retrive_index=[[0, 1, 2, 3]],
        next_token=[[1, 2, 3, -1]],
        next_sibling=[[-1] * 4],
        num_spec_step=4,
    )
    predicts, accept_index, accept_num = _verify(target_predict=[[6, 7, 8, 9]], **chain)
    assert (predicts, accept_index, accept_num) == ([6, 7, 8, 9], [[0, 1, 2, 3]], [3])
    predicts, accept_index, accept_num = _verify(target_predict=[[1, 7, 8, 9]], **chain)
    assert (predicts, accept_index, accept_num) == ([1, -1, -1, -1], [[0, -1, -1, -1]], [0])


def test_build_then_verify_round_trip():
    # the branching tree built by build_tree_kernel_efficient feeds verify_tree_greedy
    out = build(seq_lens=[7], mode=QLEN_ONLY, **TREE)
    predicts, accept_index, accept_num = _verify(
        candidates=[_TREE_CANDIDATES],
        retrive_index=out["retrive_index"].tolist(),
        next_token=out["retrive_next_token"].tolist(),
        next_sibling=out["retrive_next_sibling"].tolist(),
        target_predict=[[10, 40, 0, 0, 88, 0]],
        num_spec_step=4,
    )
    assert (accept_index, accept_num) == ([[0, 1, 4, -1]], [2])


# --------------------------------------------------------------------------------------
# the patch, in real sglang (one spawned process, CPU profile active): the installed release's
# layout (eagle_utils / eagle_info(_v2) up to 0.5.15, kernels.ops.speculative.spec_tree in 0.5.23)
# --------------------------------------------------------------------------------------
#: every place a release keeps the tree ops under; the patch must replace exactly the ones it plans
_CANDIDATES = [
    ("sglang.srt.speculative.eagle_utils", "sgl_build_tree_kernel_efficient"),
    ("sglang.srt.speculative.eagle_utils", "verify_tree_greedy_func"),
    ("sglang.srt.speculative.eagle_info_v2", "verify_tree_greedy_func"),
    ("sglang.srt.speculative.eagle_info", "verify_tree_greedy_func"),
    ("sglang.srt.speculative.eagle_utils", "sgl_build_tree_kernel_efficient_cpu"),
    ("sglang.srt.speculative.eagle_utils", "sgl_verify_tree_greedy_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_build_tree_kernel_efficient_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_verify_tree_greedy_cpu"),
]
_ABSENT = "<absent>"


def _cpu_registry():
    from eagle3_patches import cpu

    return cpu.get_registry()


def _call_verify(fn):
    """``fn`` called the way sglang calls it: by keyword, with the release's own names."""
    import inspect

    names = list(inspect.signature(fn).parameters)
    tensors = [
        torch.full((6,), -1, dtype=torch.int32),  # predicts
        torch.full((1, 4), -1, dtype=torch.int32),  # accept_index
        torch.empty((1,), dtype=torch.int32),  # accept_token_num
        torch.tensor([_TREE_CANDIDATES]),
        torch.tensor([list(range(6))]),
        torch.tensor([_TREE_LINKS["next_token"]]),
        torch.tensor([_TREE_LINKS["next_sibling"]]),
        torch.tensor([[10, 30, 0, 50, 0, 66]]),
    ]
    out = fn(**dict(zip(names, tensors)), topk=2)
    return [t.tolist() for t in out]


def _patch_checks_in_sglang():
    """Runs in the isolated child; returns facts for the parent to assert on."""
    import importlib
    import sys

    import sglang.srt.speculative.eagle_info as info
    import sglang.srt.speculative.eagle_utils as utils

    from eagle3_patches.cpu import spec_kernels

    def values():
        out = {}
        for mod_name, attr in _CANDIDATES:
            mod = sys.modules.get(mod_name)
            if mod is not None:
                out[(mod_name, attr)] = mod.__dict__.get(attr, _ABSENT)
        return out

    facts = {}
    reg = _cpu_registry()
    facts["state"] = reg.status()["cpu_spec_kernels"].state.value
    facts["reason"] = reg.status()["cpu_spec_kernels"].reason
    patched = values()
    facts["patched_are_cpu_ops"] = sorted(
        f"{m}.{a}" for (m, a), v in patched.items() if getattr(v, "__module__", None) == spec_kernels.__name__
    )

    # sglang's own wrapper (organize_draft_results + build_tree_kernel_efficient), upstream case;
    # the first argument (verified_id / bonus_tokens) is renamed across releases: positional
    parent_list, top = upstream_tree_inputs()
    draft_tokens = torch.zeros(2, 7, dtype=torch.long)
    results = {}
    for mode in utils.TreeMaskMode:
        tree_mask, positions, r_index, r_next, r_sib, _ = utils.build_tree_kernel_efficient(
            torch.tensor([29974, 13]),
            parent_list,
            top,
            draft_tokens,
            torch.tensor([5, 10]),
            15,
            topk=4,
            spec_steps=4,
            num_verify_tokens=8,
            tree_mask_mode=mode,
        )
        results[int(mode)] = dict(
            positions=positions.tolist(),
            retrive_index=r_index.tolist(),
            retrive_next_token=r_next.tolist(),
            retrive_next_sibling=r_sib.tolist(),
            mask_dtype=str(tree_mask.dtype),
        )
    facts["sglang_wrapper"] = results

    # the verify names sglang's verify paths call (eagle_utils; eagle_info too up to 0.5.13)
    facts["verify_calls"] = {"eagle_utils": _call_verify(utils.verify_tree_greedy_func)}
    if hasattr(info, "verify_tree_greedy_func"):
        facts["verify_calls"]["eagle_info"] = _call_verify(info.verify_tree_greedy_func)

    # on a CUDA machine the patch must stand back
    from eagle3_patches.registry import NotApplicable

    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        spec_kernels.CpuSpecKernels().check(info)
        facts["cuda_check"] = "passed"
    except NotApplicable as exc:
        facts["cuda_check"] = f"not-applicable: {exc}"
    finally:
        torch.cuda.is_available = real

    # revert restores every original exactly (and removes a global sglang never defined on CPU) ...
    reg.revert(["cpu_spec_kernels"])
    facts["state_after_revert"] = reg.status()["cpu_spec_kernels"].state.value
    stock = values()
    facts["changed_by_patch"] = sorted(f"{m}.{a}" for (m, a), v in patched.items() if stock[(m, a)] is not v)
    facts["after_revert_cpu_ops"] = sorted(
        f"{m}.{a}" for (m, a), v in stock.items() if getattr(v, "__module__", None) == spec_kernels.__name__
    )
    facts["after_revert_absent"] = sorted(f"{m}.{a}" for (m, a), v in stock.items() if v is _ABSENT)
    # ... the plan on stock sglang names exactly what the patch had changed
    facts["plan"] = sorted(f"{m.__name__}.{a}" for m, a, _ in spec_kernels.CpuSpecKernels().plan(info))
    facts["stock_verify_untouched"] = {
        name: list(map(repr, _call_verify_safely(importlib.import_module(f"sglang.srt.speculative.{name}"))))
        for name in facts["verify_calls"]
    }
    # and applies again
    reg.apply(["cpu_spec_kernels"])
    facts["reapplied"] = reg.status()["cpu_spec_kernels"].state.value
    facts["reapplied_same"] = values().keys() == patched.keys() and all(
        (v is _ABSENT) == (patched[k] is _ABSENT) for k, v in values().items()
    )
    return facts


def _call_verify_safely(module):
    """Stock sglang's verify on CPU: it returns its buffers untouched or raises (no CPU kernel)."""
    try:
        return _call_verify(module.verify_tree_greedy_func)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return [type(exc).__name__]


@pytest.fixture(scope="module")
def sglang_facts():
    from eagle3_patches.testing.isolation import run_isolated

    return run_isolated(_patch_checks_in_sglang, cpu_profile=True, timeout=300)


@pytest.mark.sglang
def test_patch_applies_on_cpu_and_replaces_what_it_plans(sglang_facts):
    assert sglang_facts["state"] == "applied", sglang_facts["reason"]
    assert sglang_facts["plan"], "the patch planned no replacement"
    assert sglang_facts["patched_are_cpu_ops"] == sglang_facts["plan"]
    assert sglang_facts["changed_by_patch"] == sglang_facts["plan"]


@pytest.mark.sglang
def test_sglang_wrapper_gives_upstream_values_in_every_mask_mode(sglang_facts):
    results = sglang_facts["sglang_wrapper"]
    assert sorted(results) == [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING]
    for mode, got in results.items():
        for key, expected in UPSTREAM_EXPECTED.items():
            assert got[key] == expected, (mode, key)
    assert results[QLEN_ONLY_BITPACKING]["mask_dtype"] == "torch.uint8"


@pytest.mark.sglang
def test_the_verify_sglang_calls_is_the_cpu_verify(sglang_facts):
    # tree 0 -> {1, 2}; 1 -> {3, 4}; 3 -> {5}; target path 10 -> 30 -> 50, bonus 66
    for where, (predicts, accept_index, accept_num) in sglang_facts["verify_calls"].items():
        assert accept_num == [3] and accept_index == [[0, 1, 3, 5]], where
        assert predicts == [10, 30, -1, 50, -1, 66], where


@pytest.mark.sglang
def test_stock_verify_does_not_verify_on_cpu(sglang_facts):
    """The bug, pinned: without the patch sglang's verify leaves its buffers as they were, or raises."""
    for where, got in sglang_facts["stock_verify_untouched"].items():
        assert got != ["[10, 30, -1, 50, -1, 66]", "[[0, 1, 3, 5]]", "[3]"], where


@pytest.mark.sglang
def test_patch_stands_back_where_cuda_is_available(sglang_facts):
    assert sglang_facts["cuda_check"].startswith("not-applicable: CUDA is available")


@pytest.mark.sglang
def test_revert_restores_the_originals(sglang_facts):
    assert sglang_facts["state_after_revert"] == "not-selected"
    assert sglang_facts["after_revert_cpu_ops"] == []
    assert "sglang.srt.speculative.eagle_utils.sgl_build_tree_kernel_efficient" in sglang_facts["after_revert_absent"]
    assert sglang_facts["reapplied"] == "applied"
    assert sglang_facts["reapplied_same"]


# --------------------------------------------------------------------------------------
# the real EAGLEWorker decode loop (tiny DeepSeek-V3 target + tiny EAGLE-3 draft, float32,
# triton backend under TRITON_INTERPRET=1): build_tree -> draft -> verify -> draft extend
# --------------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13]]


def _tree_mask_mode(eagle_worker) -> int:
    """The verify mask mode the worker chose (0.5.16+: ``EAGLEWorkerV2``'s draft worker holds it); -1: none."""
    for holder in (
        eagle_worker,
        getattr(eagle_worker, "_draft_worker", None),
        getattr(eagle_worker, "draft_worker", None),
    ):
        if hasattr(holder, "tree_mask_mode"):
            return int(holder.tree_mask_mode)
    return -1


def _eagle_decode_in_sglang(target, draft, topk, steps, num_draft, free_steps, revert=()):
    """``free_steps`` plain decode steps, then one with the target's verify logits forced to
    agree with the draft's first-child chain (a random draft is never accepted otherwise).
    ``revert``: CPU-profile patches taken off first (stock sglang there)."""
    from eagle3_patches.testing import sglang_harness as h

    if revert:
        import importlib

        importlib.import_module("sglang.srt.speculative.eagle_utils")  # the patches land on import
        _cpu_registry().revert(list(revert))

    sa = h.eagle3_server_args(
        str(target),
        str(draft),
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=num_draft,
    )
    target_worker, eagle_worker = h.eagle_workers(sa)
    batch = h.eagle_prefill_batch(target_worker, PROMPTS)
    h.eagle_step(eagle_worker, batch)  # prefill, then what the scheduler carries to the next step

    facts = {
        "state": _cpu_registry().status()["cpu_spec_kernels"].state.value,
        "accepted": [],
        "forced_path": None,
        "tree_mask_mode": _tree_mask_mode(eagle_worker),
        "mask_patch": _cpu_registry().status()["cpu_tree_mask_mode"].state.value,
    }

    def force_first_child_chain(verify_input, batch, logits_output):
        bs, n = len(batch.reqs), verify_input.draft_token_num
        cand = verify_input.draft_token.view(bs, n)
        next_token = getattr(verify_input, "retrive_next_token", None)
        if next_token is None:  # renamed in sglang 0.5.12
            next_token = verify_input.retrieve_next_token
        logits = logits_output.next_token_logits
        depths = []
        for b in range(bs):
            node, depth = 0, 0
            while (child := int(next_token[b, node])) != -1:
                logits[b * n + node, int(cand[b, child])] = logits[b * n + node].max() + 10.0
                node, depth = child, depth + 1
            depths.append(depth)
        facts["forced_path"] = depths

    owner, attr = h.verify_entry_point(eagle_worker)
    original_verify = getattr(owner, attr)

    def forced_verify(verify_input, batch, logits_output, *args, **kwargs):
        force_first_child_chain(verify_input, batch, logits_output)
        return original_verify(verify_input, batch, logits_output, *args, **kwargs)

    for step in range(free_steps + 1):
        if step == free_steps:
            setattr(owner, attr, forced_verify)
        batch.prepare_for_decode()
        result = h.eagle_step(eagle_worker, batch)  # sglang >= 0.5.13: the scheduler's bookkeeping too
        facts["accepted"].append(h.accept_lengths(result))
        if step == free_steps - 1:
            facts["free_output_ids"] = [list(req.output_ids) for req in batch.reqs]
    setattr(owner, attr, original_verify)
    return facts


def _plain_greedy_in_sglang(target, new_tokens):
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(str(target), attention_backend="triton", dtype="float32"))
    step = h.prefill(runner, PROMPTS)
    tokens = [[t] for t in step.next_token_ids.tolist()]
    for _ in range(new_tokens - 1):
        step = h.decode(runner, step)
        for row, t in zip(tokens, step.next_token_ids.tolist()):
            row.append(t)
    return tokens


@pytest.mark.sglang
def test_eagle_worker_tree_decode_steps_on_cpu(tiny):
    """topk 4, 3 steps, 8 draft tokens, batch 2: the decode loop runs on CPU with no other
    sgl_kernel op called than those the CPU profile provides in torch (its other sgl_kernel
    stand-ins raise when called); greedy outputs equal plain greedy decoding; a forced full match
    is accepted along the tree.  About 20 s: two spawned processes, the draft backend runs under
    the Triton interpreter.

    Across releases: <= 0.5.12 drive the v1 ``EAGLEWorker``; from 0.5.13 only ``EAGLEWorkerV2``
    exists and ``h.eagle_step`` does the scheduler's bookkeeping between steps; the verify hook
    moves (``h.verify_entry_point``); 0.5.13 - 0.5.15 need ``cpu_assign_extend_cache_locs`` and
    0.5.16 on the ``cpu_cache_loc_ops_*`` patches and ``cpu_tree_mask_mode``.  The plain reference runs on
    triton too: from 0.5.12 its MLA decode kernel reads V as the transposed K tile (``v = tl.trans(k)``),
    which the tiny target's latent widths allow (K 48 + 16 and V 48 both take 64-wide tiles)."""
    from eagle3_patches.testing.isolation import run_isolated

    facts = run_isolated(_eagle_decode_in_sglang, tiny["deepseek_v3"], tiny["draft"], 4, 3, 8, 1, timeout=300)
    assert facts["state"] == "applied"
    plain = run_isolated(_plain_greedy_in_sglang, tiny["deepseek_v3"], len(facts["free_output_ids"][0]), timeout=300)
    assert facts["free_output_ids"] == plain
    # the forced step accepts the whole first-child chain (at most spec_steps = 3 tokens)
    assert facts["accepted"][-1] == [min(d, 3) for d in facts["forced_path"]]
    assert all(a >= 1 for a in facts["accepted"][-1])
    # 0.5.16+: the mask the triton backend reads (sglang's own CPU choice is intel_amx's QLEN_ONLY)
    assert (facts["mask_patch"] == "applied") == (release() >= (0, 5, 16)), facts["mask_patch"]
    if facts["mask_patch"] == "applied":
        assert facts["tree_mask_mode"] == FULL_MASK


@pytest.mark.sglang
@only_release(">=0.5.16", "sglang picks the CPU verify mask (QLEN_ONLY, for intel_amx) from 0.5.16")
def test_stock_verify_mask_breaks_greedy_outputs_on_the_triton_backend(tiny):
    """The bug ``cpu_tree_mask_mode`` fixes, pinned: with the patch taken off, the v2 worker builds the
    QLEN_ONLY mask and the triton backend reads it as FULL_MASK; the greedy outputs leave plain decoding."""
    from eagle3_patches.testing.isolation import run_isolated

    facts = run_isolated(
        _eagle_decode_in_sglang, tiny["deepseek_v3"], tiny["draft"], 4, 3, 8, 1, ["cpu_tree_mask_mode"], timeout=300
    )
    assert facts["tree_mask_mode"] == QLEN_ONLY
    plain = run_isolated(_plain_greedy_in_sglang, tiny["deepseek_v3"], len(facts["free_output_ids"][0]), timeout=300)
    assert facts["free_output_ids"] != plain


def _cache_loc_ops_against_triton_in_sglang():
    """The CPU profile's KV-slot ops (``eagle3_patches.cpu.cache_loc_ops``) against sglang's own Triton
    kernels for the same job, run under the interpreter on the same inputs.  Returns
    ``{op: equal}`` for the ops whose patch is applied on this release, and the patch states."""
    import importlib

    from eagle3_patches.cpu import cache_loc_ops as ops

    for name in {p.module for p in ops.build_patches()}:  # the patches land on import
        try:
            importlib.import_module(name)
        except ImportError:  # not in this release
            pass
    states = {n: s.state.value for n, s in _cpu_registry().status().items() if n.startswith("cpu_")}
    g = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 1000, (5, 64), dtype=torch.int32, generator=g)
    rpi = torch.tensor([3, 0, 4], dtype=torch.int64)
    start = torch.tensor([2, 10, 0], dtype=torch.int32)
    end = start + torch.tensor([5, 3, 7], dtype=torch.int32)
    loc = torch.randint(0, 1000, (15,), dtype=torch.int64, generator=g)
    checks = {}

    def extend_cache_locs(module_name):
        m = importlib.import_module(module_name)
        ref = torch.zeros(15, dtype=torch.int64)
        m.assign_extend_cache_locs[(3,)](rpi, pool, start, end, ref, 64, 4)
        return ref

    try:  # sglang >= 0.5.16: the sgl_kernel CPU-build op names
        al = importlib.import_module("sglang.srt.mem_cache.allocation")
        cl = importlib.import_module("sglang.kernels.ops.speculative.cache_locs")
        eg = importlib.import_module("sglang.kernels.ops.speculative.eagle")
    except ImportError:
        al = cl = eg = None
    if states.get("cpu_cache_loc_ops_allocation") == "applied":
        ref, got = pool.clone(), pool.clone()
        al.assign_req_to_token_pool[(3,)](rpi, ref, start, end, loc, 64, 4)
        al.assign_req_to_token_pool_cpu(rpi, got, start, end, loc, 64)  # the name sglang calls
        checks["assign_req_to_token_pool_cpu"] = torch.equal(ref, got)
    # the verify-slot op: in cache_locs, and (0.5.16 - 0.5.22) in spec_utils for the accepted tokens' moves
    for patch, holder in (
        ("cpu_cache_loc_ops_cache_locs", "sglang.kernels.ops.speculative.cache_locs"),
        ("cpu_cache_loc_ops_spec_utils", "sglang.srt.speculative.spec_utils"),
    ):
        holder = importlib.import_module(holder) if states.get(patch) == "applied" else None
        if hasattr(holder, "assign_extend_cache_locs_cpu"):
            got = torch.zeros(15, dtype=torch.int64)
            holder.assign_extend_cache_locs_cpu(rpi, pool, start, end, got, 64)
            equal = torch.equal(extend_cache_locs(cl.__name__), got)
            checks["assign_extend_cache_locs_cpu"] = checks.get("assign_extend_cache_locs_cpu", True) and equal
    # the draft-slot op: in cache_locs from 0.5.23, in eagle_worker_common (0.5.16 - 0.5.22)
    for patch, holder in (
        ("cpu_cache_loc_ops_cache_locs", "sglang.kernels.ops.speculative.cache_locs"),
        ("cpu_cache_loc_ops_eagle_worker_common", "sglang.srt.speculative.eagle_worker_common"),
    ):
        holder = importlib.import_module(holder) if states.get(patch) == "applied" else None
        if hasattr(holder, "assign_draft_cache_locs_contiguous_cpu"):
            seq_lens = torch.tensor([5, 9, 20], dtype=torch.int64)
            ref, got = torch.zeros(18, dtype=torch.int64), torch.zeros(18, dtype=torch.int64)
            cl.assign_draft_cache_locs_contiguous[(3,)](rpi, pool, seq_lens, ref, 64, 2, 3)
            holder.assign_draft_cache_locs_contiguous_cpu(rpi, pool, seq_lens, got, 64, 2, 3)
            checks["assign_draft_cache_locs_contiguous_cpu"] = torch.equal(ref, got)
    if states.get("cpu_cache_loc_ops_eagle") == "applied":
        accept = torch.randint(0, 100, (3, 4), dtype=torch.int32, generator=g)
        lens = torch.tensor([1, 4, 2], dtype=torch.int32)
        ref, got = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
        eg.fill_bonus_tokens[(3,)](accept, lens, ref, 4)
        eg.fill_bonus_tokens_cpu(accept, lens, got, 4)
        checks["fill_bonus_tokens_cpu"] = torch.equal(ref, got)
        index = torch.tensor([[0, 1, -1, -1], [16, 18, 21, -1], [32, -1, -1, -1]], dtype=torch.int32)
        slots = torch.randperm(4096, generator=g)[:48].to(torch.int64)
        ref, got = torch.zeros(12, dtype=torch.int64), torch.zeros(12, dtype=torch.int64)
        eg.fill_accept_out_cache_loc[(12,)](index, slots, ref, 16)
        eg.fill_accept_out_cache_loc_cpu(index, slots, got)
        checks["fill_accept_out_cache_loc_cpu"] = torch.equal(ref, got)
    if states.get("cpu_assign_extend_cache_locs") == "applied":  # sglang 0.5.13 - 0.5.15
        m = importlib.import_module(ops.CpuAssignExtendCacheLocs.module)
        got = m.assign_extend_cache_locs_func(rpi, pool, start, end, 3, 5, "cpu")  # uniform width 5 ...
        ref = extend_cache_locs(m.__name__)  # ... against the kernel on the same (uneven) offsets
        checks["assign_extend_cache_locs_func"] = got.numel() == 15 and torch.equal(ref, got)
    return {"states": states, "checks": checks}


@pytest.mark.sglang
@only_release(">=0.5.13", "the EAGLE loop on CPU needs no KV-slot op of the CPU profile before 0.5.13")
def test_cpu_cache_loc_ops_match_sglang_triton_kernels():
    """sglang >= 0.5.13 needs the CPU profile's KV-slot ops in the decode loop (0.5.13 - 0.5.15:
    ``assign_extend_cache_locs_func`` has no CPU branch; from 0.5.16: sgl_kernel CPU-build ops); each one
    equals sglang's own Triton kernel run under the interpreter.  Earlier releases need none."""
    from support.releases import release

    from eagle3_patches.testing.isolation import run_isolated

    r = release()
    out = run_isolated(_cache_loc_ops_against_triton_in_sglang, timeout=300)
    expected = (
        {"assign_extend_cache_locs_func"}
        if r < (0, 5, 16)
        else {
            "assign_req_to_token_pool_cpu",
            "assign_extend_cache_locs_cpu",
            "assign_draft_cache_locs_contiguous_cpu",
            "fill_bonus_tokens_cpu",
            "fill_accept_out_cache_loc_cpu",
        }
    )
    assert set(out["checks"]) == expected, out
    assert all(out["checks"].values()), out
    if (0, 5, 16) <= r < (0, 5, 23):  # the ops these releases call outside kernels/ops (0.5.23 moved them there)
        assert out["states"]["cpu_cache_loc_ops_eagle_worker_common"] == "applied", out
        assert out["states"]["cpu_cache_loc_ops_spec_utils"] == "applied", out
