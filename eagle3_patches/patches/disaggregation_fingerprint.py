"""disaggregation_fingerprint

Bug: nothing checks that the two servers of a prefill/decode pair speculate alike.  With EAGLE-3 the prefill
server runs the draft's first step and sends the decode server, per request, one metadata row (the first token,
the draft's top-k and its last hidden state) that the decode server continues from.  sglang compares only the
page size (0.5.23 also the KV dtype) across the pair.  A prefill server launched without speculation, with another
draft, another top-k or without eagle3-patches sends a row the decode server takes as it is: a zero row (token 0,
probability 0, a zero hidden state) or another draft's state.

What users see: the pair serves, at a lower accept length, and the decode server (where the watchdog runs) cannot
tell that the cause is on the prefill side.

What the patch changes: the prefill server stamps a fingerprint into columns 1-11 of the request's row of
``output_ids`` in sglang's ``MetadataBuffers`` (16 int32 per request, of which sglang uses column 0): a marker, its
format, whether the request carries the draft's state, ``--speculative-eagle-topk``, ``--speculative-num-steps``,
``--speculative-num-draft-tokens``, a hash of the patch set and of the eagle3-patches settings that change it, 96
bits of the draft's digest (``checkpoint.digest`` with sampled blocks; a draft named by a hub id: the id) and the
attention-TP size.  No new transfer: the row travels whole already.  The decode server reads the row when
sglang commits a transfer (``DecodeTransferQueue._commit_transfer_to_req``) and, when it speculates, refuses a row
without the marker ("the prefill server does not speculate, or runs without eagle3-patches") and one whose
fingerprint differs from its own, and, with an MLA target and a per-head (Llama-class) draft, one from a prefill
server of another attention-TP size (sglang sends that draft's KV unsliced from one prefill rank, PR #13555; no
release fixes it): the request fails with sglang's own abort (an error to the client, the transfer-failure metric
counted), and one log line per distinct difference names both sides.  With the ``fake`` transfer backend, which
moves no bytes, it says once that nothing is verified; sglang's own health-check and warm-up requests (its fake
bootstrap host) are not checked.

Cost: per request, on the prefill side one 10-int copy into a host tensor; on the decode side one 16-int read and
a comparison.  Once per process, the draft's sampled digest (a few hundred KB read).

Releases: every release with ``MetadataBuffers.set_buf`` and ``DecodeTransferQueue._commit_transfer_to_req`` (read
in 0.5.9 and 0.5.23); sglang has no such check.  Upgrade the prefill servers before the decode servers: a decode
server under this patch refuses the rows of a prefill server without it (``EAGLE3_PATCHES_DISABLE`` on the decode
side switches the check off).

Upstream probe: none (sglang has no cross-server check of speculation).

Tests: ``tests/patches/test_disaggregation_fingerprint.py``: sglang's real ``MetadataBuffers`` and
``DecodeTransferQueue._commit_transfer_to_req`` on CPU with real ``Req`` objects: stock commits a zero row and
another draft's row silently; patched, a prefill row stamped by the same setup commits, a zero row, a row from a
prefill without speculation, another draft, another top-k or another patch set each abort the request naming both
sides, the fake backend is said once and not refused, sglang's own health-check requests are not checked, a decode
server without speculation checks nothing.  ``tests/e2e/test_pd_pair.py``: a real pair (mooncake's transfer engine
over TCP, sglang's router) serves with the fingerprint on, and a prefill server without speculation is refused by
the decode server, the reason in the client's error.

Not verified on CPU: the RDMA and nixl transports carrying the row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType

from packaging.specifiers import SpecifierSet

from .. import settings
from ..checkpoint.digest import checkpoint_digest
from ..checkpoint.formats import per_head_draft_beside_mla
from ..checkpoint.launch_args import attention_tp_size
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, State, expect_attr
from ..sglang_runtime import current_server_args
from ..version import __version__
from . import get_registry

logger = logging.getLogger("eagle3_patches")

NAME = "disaggregation_fingerprint"
#: "E3PF": the first column of a stamped row
MAGIC = 0x45335046
FORMAT = 1
#: the columns of ``MetadataBuffers.output_ids`` the fingerprint occupies (sglang writes column 0)
FIRST_COLUMN = 1
#: sampled blocks of each draft weight file in the draft's digest
DIGEST_BLOCKS = 64
SPECULATING = 1  # flag bit: the request carries the draft's state
DRAFT_BY_CONTENT = 2  # flag bit: the draft digest is of its files (else of the name it was given)
#: flag bit: an MLA target (one latent KV a token) with a per-head (Llama-class) draft, whose KV sglang sends unsliced
#: from one prefill rank when the two sides' attention-TP sizes differ (PR #13555)
PER_HEAD_DRAFT_KV = 4
#: the fingerprint's columns
COLUMNS = 11
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
#: What the two servers of a pair must agree on, declared once: this patch's check on the decode server and the pair
#: doctor (``doctor/pair.py``) both compare exactly these.  The speculative flags, as sglang resolves them
#: (``ServerArgs`` field -> flag; the doctor resolves a launch's flags as the single-server doctor does, e.g.
#: ``--speculative-num-draft-tokens`` is steps + 1 with topk 1), in the fingerprint's column order.  Beside them: the
#: algorithm (speculating or not), the draft (:func:`checkpoint.digest.checkpoint_digest`), the attention-TP size for
#: a per-head draft beside an MLA target, and eagle3-patches' own settings (:func:`agreed_settings`).
#: ``--speculative-adaptive`` is not among them: it changes only the decode side's own steps, never what the prefill
#: side sends.
SPECULATIVE_FLAGS = {
    "speculative_eagle_topk": "--speculative-eagle-topk",
    "speculative_num_steps": "--speculative-num-steps",
    "speculative_num_draft_tokens": "--speculative-num-draft-tokens",
}
FIX = (
    "launch the prefill and the decode servers with the same speculative flags and draft, both under eagle3-patches "
    "with the same EAGLE3_PATCHES_* settings (`eagle3-patches doctor --prefill CMD --decode CMD` names every "
    "difference)"
)


# pragma: no mutate core/ReplaceTrueWithFalse: nothing assigns to a fingerprint's fields (`with_flag` makes a new one);
# frozen says so
@dataclass(frozen=True)
class Fingerprint:
    """What one side speculates with, as the row carries it."""

    format: int
    flags: int
    topk: int
    steps: int
    draft_tokens: int
    patch_set: int
    draft: tuple[int, int, int]
    attention_tp: int = 0  # the ranks one attention replica spans (tp / dp under DP attention); 0: not known

    def row(self) -> list[int]:
        return [
            MAGIC,
            self.format,
            self.flags,
            self.topk,
            self.steps,
            self.draft_tokens,
            self.patch_set,
            *self.draft,
            self.attention_tp,
        ]

    @classmethod
    def from_row(cls, values: list[int]) -> Fingerprint | None:
        """The fingerprint in a row's columns (from :data:`FIRST_COLUMN`), or None when the row is not stamped."""
        if len(values) < COLUMNS or values[0] != MAGIC:
            return None
        fmt, flags, topk, steps, tokens, ps, d0, d1, d2, attention_tp = values[1:COLUMNS]
        return cls(fmt, flags, topk, steps, tokens, ps, (d0, d1, d2), attention_tp)

    def speculative(self) -> tuple[int, int, int]:
        """The values of :data:`SPECULATIVE_FLAGS`, in its order."""
        return self.topk, self.steps, self.draft_tokens

    @property
    def speculating(self) -> bool:
        return bool(self.flags & SPECULATING)

    def with_speculating(self, on: bool) -> Fingerprint:
        return self.with_flag(SPECULATING, on)

    def with_flag(self, bit: int, on: bool) -> Fingerprint:
        return Fingerprint(
            self.format,
            (self.flags | bit) if on else (self.flags & ~bit),
            self.topk,
            self.steps,
            self.draft_tokens,
            self.patch_set,
            self.draft,
            self.attention_tp,
        )

    def describe(self) -> str:
        if not self.speculating:
            return "no speculation"
        draft = "".join(f"{v & 0xFFFFFFFF:08x}" for v in self.draft)
        return (
            f"topk {self.topk}, steps {self.steps}, draft tokens {self.draft_tokens}, draft {draft[:16]}"
            f"{'' if self.flags & DRAFT_BY_CONTENT else ' (by name)'}, patch set {self.patch_set & 0xFFFFFFFF:08x}"
        )


def differences(mine: Fingerprint, theirs: Fingerprint) -> list[str]:
    """What the prefill side's fingerprint (``theirs``) has that this decode side's does not."""
    if theirs.format != mine.format:
        return [f"fingerprint format: prefill {theirs.format}, decode {mine.format}"]
    if not theirs.speculating:
        return ["speculation: the prefill server sent no draft state"]
    out = []
    # pragma: no mutate core/ReplaceTrueWithFalse: `speculative()` returns one value a flag, so the lengths are equal
    for label, a, b in zip(SPECULATIVE_FLAGS.values(), theirs.speculative(), mine.speculative(), strict=True):
        if a != b:
            out.append(f"{label}: prefill {a}, decode {b}")
    if (theirs.draft, theirs.flags & DRAFT_BY_CONTENT) != (mine.draft, mine.flags & DRAFT_BY_CONTENT):
        out.append("the draft: its digest differs between the two sides")
    if theirs.patch_set != mine.patch_set:
        out.append("the eagle3-patches patch set or settings differ between the two sides")
    if mine.flags & PER_HEAD_DRAFT_KV and 0 not in (theirs.attention_tp, mine.attention_tp):
        if theirs.attention_tp != mine.attention_tp:
            out.append(
                f"attention-TP size: prefill {theirs.attention_tp}, decode {mine.attention_tp}, with an MLA target and "
                "a per-head (Llama-class) draft: sglang sends the draft's KV unsliced from one prefill rank and it "
                "arrives misplaced (sglang PR #13555); serve an MLA draft or give both sides one attention-TP size"
            )
    return out


def _int32(b: bytes) -> int:
    return int.from_bytes(b[:4], "little", signed=True)


def _draft_digest(server_args) -> tuple[bytes, bool]:
    path = getattr(server_args, "speculative_draft_model_path", None) or ""
    if path and os.path.isdir(path):
        return bytes.fromhex(checkpoint_digest(path, "draft", blocks=DIGEST_BLOCKS)), True
    revision = getattr(server_args, "speculative_draft_model_revision", None) or ""
    return hashlib.sha256(f"{path}@{revision}".encode()).digest(), False


def agreed_settings(cfg: settings.Settings, on: Iterable[str]) -> dict[str, object]:
    """What of eagle3-patches' settings two sides must run alike (with :data:`SPECULATIVE_FLAGS`, the declaration
    both this patch and the pair doctor compare): the patches ``on``, which is what the settings that select patches
    (:data:`settings.SELECTING`) decide, however each list is spelt or ordered and whatever instrument it names; and the
    value of every other setting marked ``behaviour`` (what the draft is fed).  The instruments' settings (the
    watchdog, the probe, the dump) are not among them: they watch one side and change nothing it sends."""
    out: dict[str, object] = {"patches": sorted(on)}
    for s in settings.DECLARED:
        if s.behaviour and s.var not in settings.SELECTING:
            value = getattr(cfg, s.attr)
            out[s.var] = sorted(value) if isinstance(value, frozenset) else value
    return out


def selection() -> dict:
    """What of eagle3-patches this process runs, as two sides must agree on it: the library's version and
    :func:`agreed_settings`, the patches on read from the registry (a patch waiting for its module counts as on: the
    two sides import sglang's modules in their own order; one that failed to apply, off)."""
    states = get_registry().status()
    on = (n for n, s in states.items() if s.state not in (State.NOT_SELECTED, State.DISABLED, State.FAILED))
    return {"eagle3_patches": __version__, **agreed_settings(settings.current(), on)}


def fingerprint_of(server_args) -> Fingerprint:
    """This server's fingerprint, from its resolved ``ServerArgs`` and this process's patch set."""
    algorithm = str(getattr(server_args, "speculative_algorithm", None) or "").upper()
    speculating = algorithm in SPECULATIVE_ALGORITHMS
    # pragma: no mutate core/NumberReplacer: a side that does not speculate has a zero draft digest, and the columns
    # read 4 bytes each of 11, 12 or 13 zero bytes as 0
    digest, by_content = _draft_digest(server_args) if speculating else (bytes(12), False)
    ps = hashlib.sha256(json.dumps(selection(), sort_keys=True).encode()).digest()
    topk, steps, draft_tokens = (int(getattr(server_args, field, None) or 0) for field in SPECULATIVE_FLAGS)
    return Fingerprint(
        format=FORMAT,
        flags=(SPECULATING if speculating else 0) | (DRAFT_BY_CONTENT if by_content else 0),
        topk=topk,
        steps=steps,
        draft_tokens=draft_tokens,
        patch_set=_int32(ps),
        draft=(_int32(digest[0:4]), _int32(digest[4:8]), _int32(digest[8:12])),
        attention_tp=_attention_tp(server_args),
    ).with_flag(PER_HEAD_DRAFT_KV, speculating and _per_head_draft_beside_mla(server_args))


def _attention_tp(server_args) -> int:
    """sglang's attention-TP size (``compute_dp_attention_world_info``): ``tp / dp`` under DP attention, else tp."""
    return attention_tp_size(server_args.tp_size, server_args.dp_size, bool(server_args.enable_dp_attention))


def _per_head_draft_beside_mla(server_args) -> bool:
    """An MLA target (its config states ``kv_lora_rank``) with a draft that is not the MLA class; False where either
    checkpoint is not a local directory (a hub id) or cannot be read."""
    target = getattr(server_args, "model_path", None) or ""
    draft = getattr(server_args, "speculative_draft_model_path", None) or ""
    # pragma: no mutate eagle3/DropGuard: reading a path that is no checkpoint directory raises Eagle3ConfigError, which
    # the handler below turns into False too; the guard only spares the read
    # pragma: no mutate core/ReplaceAndWithOr: as above
    if not (os.path.isdir(target) and os.path.isdir(draft)):
        return False
    try:
        return per_head_draft_beside_mla(target, draft)
    except Eagle3ConfigError:
        return False


#: id(ServerArgs) -> (the ServerArgs, its fingerprint), computed at the first request a server handles
_mine: dict[int, tuple[object, Fingerprint]] = {}
_said: set[str] = set()  # the log lines said once per process


def local_fingerprint(server_args=None) -> Fingerprint:
    """The fingerprint of the server whose ``ServerArgs`` these are (default: this process's), computed once."""
    sa = server_args if server_args is not None else current_server_args()
    if id(sa) not in _mine:
        _mine[id(sa)] = (sa, fingerprint_of(sa))
    return _mine[id(sa)][1]


def _say_once(key: str, level: int, message: str) -> None:
    if key not in _said:
        _said.add(key)
        logger.log(level, message)


# ------------------------------------------------------------------ prefill: stamp
def _stamped_set_buf(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    # pragma: no mutate core/NumberReplacer `-1`: sglang passes the request alone
    req = args[0] if args else kwargs["req"]
    fp = local_fingerprint().with_speculating(getattr(req, "hidden_states_tensor", None) is not None)
    import torch

    row = fp.row()
    instance.output_ids[req.metadata_buffer_index, FIRST_COLUMN : FIRST_COLUMN + len(row)] = torch.tensor(
        row, dtype=instance.output_ids.dtype
    )
    return result


# ------------------------------------------------------------------ decode: verify
def _row(instance, decode_req) -> list[int]:
    idx = decode_req.metadata_buffer_index
    return instance.metadata_buffers.output_ids[idx, FIRST_COLUMN : FIRST_COLUMN + COLUMNS].tolist()


def _fake_host(decode_req) -> bool:
    """sglang's own requests with nothing transferred: its health check and warm-up (``FAKE_BOOTSTRAP_HOST``)."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    return getattr(decode_req.req, "bootstrap_host", None) == FAKE_BOOTSTRAP_HOST


def refusal(theirs: Fingerprint | None, mine: Fingerprint) -> Eagle3ConfigError | None:
    """Why the decode side refuses a row (None: it agrees)."""
    if theirs is None:
        found = "no eagle3-patches fingerprint in the request's metadata row"
        what = (
            "the prefill server sent no eagle3-patches fingerprint: it does not speculate, or runs without "
            "eagle3-patches; the decode server would continue from a zero draft state"
        )
    else:
        diffs = differences(mine, theirs)
        if not diffs:
            return None
        found = "; ".join(diffs)
        what = "the prefill server speculates otherwise than this decode server: its draft state does not fit"
    return Eagle3ConfigError(
        what,
        where="the prefill/decode pair (this is the decode server)",
        found=f"{found} (prefill: {theirs.describe() if theirs else 'not stamped'}; decode: {mine.describe()})",
        expected="the prefill server's fingerprint equal to this decode server's",
        fix=FIX,
    )


def _verified_commit(wrapped, instance, args, kwargs):
    # pragma: no mutate core/NumberReplacer `-1`: sglang passes the request alone
    decode_req = args[0] if args else kwargs["decode_req"]
    row = _row(instance, decode_req)
    result = wrapped(*args, **kwargs)
    if result is False:  # 0.5.9: the metadata is not there yet
        return result
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req = decode_req.req
    if isinstance(getattr(req, "finished_reason", None), FINISH_ABORT) or instance.spec_algorithm.is_none():
        return result
    if getattr(instance.scheduler.server_args, "disaggregation_transfer_backend", None) == "fake":
        _say_once(
            "fake",
            logging.WARNING,
            "eagle3-patches: the fake transfer backend moves no bytes: the decode server starts every request from a "
            "zero draft state and nothing about the prefill side is verified",
        )
        return result
    if _fake_host(decode_req):
        return result  # sglang's health check or warm-up: no prefill server sent it
    exc = refusal(Fingerprint.from_row(row), local_fingerprint(instance.scheduler.server_args))
    if exc is not None:
        d = exc.diagnostic
        _say_once(d.found, logging.ERROR, f"{exc}\n  (first refused: request {getattr(req, 'rid', '?')})")
        from http import HTTPStatus

        message = f"eagle3-patches: {d.what}. Found: {d.found}. Fix: {d.fix}"
        prepare_abort(req, message, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
    return result


class DisaggregationFingerprint(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 7
    summary = "the decode server of a prefill/decode pair refuses a request whose prefill side speculates otherwise"
    module = "sglang.srt.disaggregation.decode"
    # pragma: no mutate eagle3/ShiftReleaseBound: no release before 0.5.9 (PINNED) is checked or served, so a bound at
    # 0.5.7 or 0.5.9 covers the same releases
    # pragma: no mutate eagle3/CloseReleaseBound: as above, `>0.5.8` covers the same releases
    applies_to = SpecifierSet(">=0.5.8")
    remedy = "refused"
    in_fork_series = False  # it compares eagle3-patches' own fingerprints: a forked sglang runs without the library

    def check(self, module: ModuleType) -> None:
        expect_attr(expect_attr(module, "MetadataBuffers"), "set_buf")
        expect_attr(expect_attr(module, "DecodeTransferQueue"), "_commit_transfer_to_req")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.MetadataBuffers, "set_buf", _stamped_set_buf)
        saver.wrap(module.DecodeTransferQueue, "_commit_transfer_to_req", _verified_commit)


PATCH = DisaggregationFingerprint()
