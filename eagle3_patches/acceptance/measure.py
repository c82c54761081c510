# long module: measure-accept in the order it runs (device, draft, target states, the replay)
"""``eagle3-patches measure-accept``: a draft's expected accept length, measured offline on target states the user
trusts, the way sglang's EAGLE worker would accept its drafts, greedily or at a temperature.

For each sequence the draft runs teacher-forced (:mod:`.draft_reference`); then the server's decode is replayed:
the first verify step starts where the target's own tokens start (after the prompt), the draft proposes
``steps`` tokens as a chain (topk 1), the verify step accepts a leading run of them, and the next verify step starts
after the accepted tokens and the target's own one.  The figures are those of sglang's ``accept len``: accepted draft
tokens + 1 per verify step, and per position k how often draft token k was accepted (sglang's per-request acceptance
histogram, summed).

Which draft tokens are accepted (:func:`walk`, one implementation for both): draft token k of the verify step at
base t is accepted, given tokens 1..k-1 were, with probability ``a_k(t)``.  Greedy, ``a_k(t)`` is 1 where the
draft's token equals the target's token in the data, else 0, and the replay is the walk a greedy server makes.  At
temperature T (:mod:`.sampling`), ``a_k(t)`` is ``q(x)``, the target's probability at T (after top-k / top-p) of
the draft's argmax x (sglang's default verify), or ``sum_x min(p(x), q(x))`` (``--speculative-use-rejection-
sampling``); a verify step then accepts exactly j tokens with probability ``a_1 ... a_j (1 - a_{j+1})`` and the next
one starts at t + j + 1 with that weight, so the histogram holds expected counts, and the accept length is
``1 + sum_k a_1 ... a_k`` per verify step, weighted by how likely each verify step is.  ``q`` at a draft position
is the target's distribution in the data's context there (its final state through its ``lm_head``): exact where the
draft's earlier tokens in the chain are the data's tokens (always, greedy), an approximation where an accepted draft
token differs from the data's (possible at T > 0, with probability ``q`` of that token).

What it assumes: the tokens the states come with are what the target produced (greedily for the greedy figure: true
of a greedy server's dump; of training data only where the target generated the responses), and each request ends
where its data ends (sglang accepts no draft token past a request's finish, so the last verify steps of a request
accept fewer: the same here).  topk > 1 (tree drafts) is not replayed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.d2t import check_d2t
from ..checkpoint.draft_names import PREFIXED_HEAD, draft_tensor_name
from ..checkpoint.expected_accept import FIELD as EXPECTED_FIELD
from ..checkpoint.formats import config_dtype, list_weight_files, read_config
from ..checkpoint.safe_io import open_checkpoint_file
from ..diagnostic import first_few
from ..errors import Eagle3ConfigError
from ..terminal import escape_terminal, progress_bar
from . import draft_reference, training_data
from . import sampling as sm
from .draft_reference import REQUIRED, SPEC_V1, DraftForward, draft_shape
from .target_states import FINAL, TargetStates, dump_shards, open_dump, shown_ids

#: skipped sequences the human report names (the rest are counted)
_SHOWN_SKIPPED = 20


class MeasureError(Eagle3ConfigError):
    """The measurement cannot run on what it was given."""

    default_code = "measure-accept"


@dataclass
class Acceptance:
    """What the replay measured: greedy, or at a temperature (:attr:`sampling`), where the histogram holds expected
    counts and :attr:`rejection_sampling` the figure of ``--speculative-use-rejection-sampling`` beside sglang's
    default verify's."""

    steps: int
    histogram: list  # verify steps that accepted 0..steps draft tokens (ints greedy; expected counts at temperature)
    sequences: int
    skipped: list[str] = field(default_factory=list)
    worker: str = SPEC_V1  # the draft worker whose positions were replayed (draft_reference.CHAIN_OFFSET)
    sampling: sm.Sampling = field(default_factory=sm.Sampling)
    #: how the verify step accepts: ``greedy``, ``target-only`` (sglang's verify at temperature) or
    #: ``rejection-sampling``
    verify: str = sm.GREEDY
    #: at temperature: the figure of ``--speculative-use-rejection-sampling`` (sum_x min(p, q) per position)
    rejection_sampling: Acceptance | None = None

    @property
    def verify_steps(self) -> float:
        return sum(self.histogram)

    def _measured(self) -> float:
        """The verify steps, refused where there are none: no figure comes from data that cannot give one."""
        n = self.verify_steps
        if not n:
            raise MeasureError(
                "the data gives no verify step to measure",
                found=f"{self.sequences} sequence(s) replayed, {len(self.skipped)} skipped as too short"
                + (f" ({escape_terminal(first_few(self.skipped, 3, '; '))[:300]})" if self.skipped else ""),
                expected="a token the target produced (loss mask 1, or decoded in a dump) after its first position, "
                "with a token after it to draft for",
                fix="measure on the target's responses: a dump of generated tokens, or training data with a loss mask",
            )
        return n

    @property
    def accept_length(self) -> float:
        """Accepted draft tokens + 1 per verify step (sglang's ``accept len``); refused without verify steps."""
        n = self._measured()
        return sum((a + 1) * c for a, c in enumerate(self.histogram)) / n

    @property
    def per_position(self) -> list[float]:
        """Per draft position k = 1..steps, the fraction of verify steps that accepted draft token k."""
        n = self._measured()
        return [sum(self.histogram[k:]) / n for k in range(1, self.steps + 1)]

    def _shown_steps(self) -> int | float:
        n = self.verify_steps
        return n if self.sampling.greedy else round(n, 1)

    def config_field(self, num_draft_tokens: int) -> dict:
        """The draft config field that states this figure (docs/troubleshooting.md), with the sampling it holds
        at."""
        extra = {"speculative_use_rejection_sampling": True} if self.verify == sm.REJECTION_SAMPLING else {}
        return {
            EXPECTED_FIELD: {
                "accept_length": round(self.accept_length, 3),
                "speculative_num_steps": self.steps,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": num_draft_tokens,
                **self.sampling.fields(),
                **extra,
                "measured_by": "eagle3-patches measure-accept",
                "verify_steps": self._shown_steps(),
            }
        }

    def _figures(self) -> dict:
        return {
            "accept_length": self.accept_length,
            "per_position": self.per_position,
            "histogram": self.histogram,
            "verify_steps": self.verify_steps,
            "verify": self.verify,
        }

    def to_json(self, num_draft_tokens: int) -> str:
        s = self.sampling
        rs = self.rejection_sampling
        return json.dumps(
            {
                **self._figures(),
                "sequences": self.sequences,
                "skipped": self.skipped,
                "spec_worker": self.worker,
                "temperature": s.fields()["temperature"],
                "top_k": s.top_k,
                "top_p": s.top_p,
                "sampling": s.describe(),
                "rejection_sampling": None if rs is None else {**rs._figures(), **rs.config_field(num_draft_tokens)},
                **self.config_field(num_draft_tokens),
            },
            indent=2,
            allow_nan=False,
        )

    def format(self, num_draft_tokens: int) -> str:
        flags = (
            f"--speculative-num-steps {self.steps} --speculative-eagle-topk 1 --speculative-num-draft-tokens "
            f"{num_draft_tokens}"
        )
        if self.sampling.greedy:
            lines = [
                f"expected accept length {self.accept_length:.3f} at {flags}, {self.sampling.describe()}, over "
                f"{self.verify_steps} verify steps of {self.sequences} sequence(s), the draft run as sglang's spec "
                f"{self.worker} worker runs it",
                "draft token k accepted in this fraction of verify steps:",
            ]
        else:
            lines = [
                f"expected accept length {self.accept_length:.3f} at {flags}, {self.sampling.describe()}, with "
                "sglang's default verify (target-only: the draft's argmax x accepted with the target's probability "
                f"q(x) at this sampling), over {self.verify_steps:.1f} expected verify steps of {self.sequences} "
                f"sequence(s), the draft run as sglang's spec {self.worker} worker runs it",
                "draft token k accepted in this expected fraction of verify steps:",
            ]
        lines += [f"  k={k}: {p:.3f}" for k, p in enumerate(self.per_position, start=1)]
        lines += [
            "to state it in the draft's config.json (the watchdog and the doctor read it):",
            "  " + json.dumps(self.config_field(num_draft_tokens)),
        ]
        rs = self.rejection_sampling
        if rs is not None:
            lines += [
                f"with --speculative-use-rejection-sampling (sglang 0.5.14+: the draft samples x from p = "
                f"softmax(draft logits / T), accepted with min(1, q(x) / p(x)); per position sum_x min(p(x), q(x))): "
                f"expected accept length {rs.accept_length:.3f}",
            ]
            lines += [f"  k={k}: {p:.3f}" for k, p in enumerate(rs.per_position, start=1)]
            lines += ["  its field: " + json.dumps(rs.config_field(num_draft_tokens))]
            lines.append(
                "q at each draft position is the target's distribution in the data's context: exact where the "
                "draft's earlier tokens are the data's, an approximation where an accepted draft token is not"
            )
        lines += [f"skipped: {escape_terminal(s)}" for s in self.skipped[:_SHOWN_SKIPPED]]
        if len(self.skipped) > _SHOWN_SKIPPED:
            lines.append(f"skipped: {len(self.skipped) - _SHOWN_SKIPPED} more (--json lists them all)")
        return "\n".join(lines)


# ---------------------------------------------------------------------- where the draft runs
def pick_device(spec: str | None) -> Any:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N``; without one, the first visible GPU where CUDA is available,
    else the CPU."""
    import torch

    if spec is None:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    m = re.fullmatch(r"(cpu|cuda)(?::(\d{1,4}))?", spec)
    if m is None:
        raise MeasureError(
            "the device is not one the measurement runs on",
            where="--device",
            found=spec,
            expected="cpu, cuda or cuda:N",
            fix="pass --device cpu or --device cuda:N (or leave it out: the first GPU, else the CPU)",
        )
    if m[1] == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(m[2] or 0)
    if index >= count:
        raise MeasureError(
            "this machine has no such GPU",
            where="--device",
            found=f"{spec}, with {count} CUDA device(s) visible to torch",
            expected=f"cuda:0 .. cuda:{count - 1}" if count else "cpu (torch sees no CUDA device)",
            fix="pick a visible GPU (CUDA_VISIBLE_DEVICES decides which are), or --device cpu",
        )
    return torch.device("cuda", index)


def pick_dtype(spec: str, config: dict, device: Any) -> Any:
    """``--dtype``: a torch floating dtype by name, or ``auto``: float32 on the CPU (the reference, as trained and
    tested), on a GPU the dtype the draft's config states (as sglang serves it), bfloat16 where it states none (or
    no floating type of 16 bits or more)."""
    import torch

    name = spec
    if spec == "auto":
        if device.type == "cpu":
            return torch.float32
        name = config_dtype(config) or "bfloat16"
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize < 2:
        if spec == "auto":  # a config stating an odd dtype: the GPU default, not a refusal
            return torch.bfloat16
        raise MeasureError(
            "the dtype is not one the draft runs in",
            where="--dtype",
            found=spec,
            expected="auto, float32, bfloat16 or float16",
            fix="pass one of them",
        )
    return dtype


# ---------------------------------------------------------------------- the draft
def _tensor_file_map(path: Path) -> dict[str, str]:
    """{tensor name: shard file} of a safetensors checkpoint, from its index or its headers."""
    from ..checkpoint.safetensors_header import read_header

    wf = list_weight_files(path)
    if wf.weight_map:
        return dict(wf.weight_map)
    out: dict[str, str] = {}
    for f in wf.files:
        for name in read_header(f, root=path).tensors:
            out.setdefault(name, f.name)
    return out


def _load(path: Path, wanted: dict[str, str], dtype: Any) -> dict[str, Any]:
    """{name: tensor} for ``wanted`` = {name: file}, through the safe open: floats as ``dtype``, on the CPU."""
    from safetensors import safe_open

    out: dict[str, Any] = {}
    by_file: dict[str, list[str]] = {}
    for name, file in wanted.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with open_checkpoint_file(path, file, what="weights") as cf, safe_open(cf.library_path, "pt") as f:
            for name in names:
                t = f.get_tensor(name)
                out[name] = t.to(dtype) if t.is_floating_point() else t  # d2t stays the integers it is stored as
    return out


def _target_tensor(files: dict[str, str], suffix: str) -> str | None:
    """The target's tensor named ``suffix`` or ``*.suffix`` (the shortest such name: ``lm_head.weight`` before a
    wrapper's ``language_model.lm_head.weight``), None where it has none."""
    hit = sorted((n for n in files if n == suffix or n.endswith("." + suffix)), key=len)
    return hit[0] if hit else None


def load_draft(
    draft: os.PathLike | str, target: os.PathLike | str | None, *, device: str | None = None, dtype: str = "auto"
) -> tuple[DraftForward, Any, dict]:
    """The draft's forward, its draft-to-target id map (``hot[i]``: the target id of draft id i, on the CPU) and
    config.

    The embedding is the target's (``target``'s ``embed_tokens``), as sglang's EAGLE-3 worker shares it; without
    ``target``, the draft's own ``embed_tokens`` when it has one.  A draft without ``lm_head`` uses the target's
    (sglang's ``load_lm_head_from_target``).  The weights are placed on ``device`` in ``dtype``
    (:func:`pick_device`, :func:`pick_dtype`).
    """
    import torch

    where = pick_device(device)  # a device this machine lacks is refused before anything is read
    dpath = Path(draft)
    config = read_config(dpath, "draft")
    shape, why = draft_shape(config)
    if shape is None:
        raise MeasureError(
            "this draft's forward is not implemented by the measurement",
            where=str(dpath / "config.json"),
            found=why,
            expected="an sglang-format single-layer Llama EAGLE-3 draft",
            fix="convert it first (`eagle3-patches convert`) where it is in another layout; otherwise measure it "
            "on a server (its `accept len` log line)",
        )
    floats = pick_dtype(dtype, config, where)
    files = _tensor_file_map(dpath)
    names = {draft_tensor_name(n)[0]: n for n in files}
    if PREFIXED_HEAD in names and "lm_head.weight" not in names:
        raise MeasureError(
            "the draft's head is stored under a name sglang does not load: the server would run the draft with a "
            "head it was never given, so no figure measured with this one holds for it",
            where=f"{dpath}: {PREFIXED_HEAD}",
            found=PREFIXED_HEAD,
            expected="lm_head.weight (sglang's draft head sits outside model.)",
            fix=f"rename {PREFIXED_HEAD} to lm_head.weight in the draft's safetensors (and its index)",
        )
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise MeasureError(
            "the draft lacks tensors its forward needs",
            where=str(dpath),
            found=f"missing {missing[:6]}",
            expected=f"every one of {list(REQUIRED)}",
            fix="convert the checkpoint into sglang's layout (`eagle3-patches convert`) or check it with "
            "`eagle3-patches doctor`",
        )
    wanted = [n for n in (*REQUIRED, "lm_head.weight", "d2t", "embed_tokens.weight") if n in names]
    raw = _load(dpath, {names[n]: files[names[n]] for n in wanted}, floats)
    params = {n: raw[names[n]] for n in wanted}
    embed = params.pop("embed_tokens.weight", None)
    need_head = "lm_head.weight" not in params
    if target is not None:
        tpath = Path(target)
        tfiles = _tensor_file_map(tpath)
        pick = {}
        for suffix in ("embed_tokens.weight",) + (("lm_head.weight",) if need_head else ()):
            hit = _target_tensor(tfiles, suffix)
            if hit is None:
                raise MeasureError(
                    f"the target has no {suffix}",
                    where=str(tpath),
                    found=f"{len(tfiles)} tensors, none named *{suffix}",
                    expected="the target checkpoint the draft serves with",
                    fix="pass the target's checkpoint directory with --target",
                )
            pick[suffix] = hit
        got = _load(tpath, {n: tfiles[n] for n in pick.values()}, floats)
        embed = got[pick["embed_tokens.weight"]]
        if need_head:
            params["lm_head.weight"] = got[pick["lm_head.weight"]]
    if embed is None or "lm_head.weight" not in params:
        raise MeasureError(
            "the draft shares tensors with its target",
            where=str(dpath),
            found="no embed_tokens.weight" if embed is None else "no lm_head.weight",
            expected="the target's embedding (and head) to run the draft as sglang does",
            fix="pass the target's checkpoint directory with --target",
        )
    vocab_draft = params["lm_head.weight"].shape[0]
    if embed.shape[1] != shape.hidden or params["lm_head.weight"].shape[1] != shape.hidden:
        raise MeasureError(
            "the draft and the embedding / head disagree in width",
            where=str(dpath),
            found=f"embedding {list(embed.shape)}, lm_head {list(params['lm_head.weight'].shape)}",
            expected=f"width {shape.hidden} (the draft's hidden_size)",
            fix="pass the target this draft was trained for",
        )
    if "d2t" in params:
        d2t = params.pop("d2t")
        problem = check_d2t(d2t.numpy(), target_vocab=int(embed.shape[0]), draft_vocab=vocab_draft)
        if problem is not None:  # the checks the doctor and the strict loader make: one rule
            raise MeasureError(
                "d2t does not map the draft vocabulary into the target's",
                where=str(dpath),
                found=problem.what,
                expected=f"{vocab_draft} offsets: i + d2t[i] distinct target ids in 0..{embed.shape[0] - 1}",
                fix=problem.fix,
            )
        # pragma: no mutate core/NumberReplacer `-1`: `check_d2t` refuses a d2t that is not one-dimensional just above,
        # so `shape[0]` and `shape[-1]` are the same number
        hot = d2t.to(torch.int64) + torch.arange(d2t.shape[0])
    else:
        hot = torch.arange(vocab_draft)
    params = {n: t.to(where) for n, t in params.items()}
    return DraftForward(params, embed.to(where), shape), hot, config


class TargetHead:
    """The target's ``lm_head`` (``weight`` [vocab, H], on the draft's device and in its dtype): the logits of the
    token after a position, from the target's final normed state there."""

    def __init__(self, weight, source: str):
        self.weight = weight
        self.source = source

    def logits(self, final):
        """float32 logits [rows, vocab] of the final states ``final`` [rows, H] (the matmul in the weight's dtype,
        as sglang's ``LogitsProcessor`` runs it)."""
        return (final.to(self.weight.dtype) @ self.weight.T).float()


#: the target config fields that change its logits beyond ``lm_head`` (sglang's ``LogitsProcessor`` applies them);
#: none of the targets this library serves states one, and the measurement does not implement them
_SCALED_LOGITS = ("logit_scale", "final_logit_softcapping", "logits_scaling")


def load_target_head(target: os.PathLike | str | None, like: Any) -> TargetHead:
    """The target's ``lm_head`` (the embedding where the target ties them), cut to the config's ``vocab_size`` as
    sglang cuts the logits, placed like the tensor ``like`` (the draft's weights): device and dtype."""
    if target is None:
        raise MeasureError(
            "--temperature needs the target's lm_head to turn its final states into its distribution: pass the "
            "target's checkpoint with --target",
            where="--target",
            found="no --target",
            expected="the target checkpoint the draft serves with",
            fix="add --target /models/target",
        )
    tpath = Path(target)
    config = read_config(tpath, "target")
    nested = config.get("text_config")
    text: dict = nested if isinstance(nested, dict) else {}
    for key in _SCALED_LOGITS:
        value = text.get(key, config.get(key))
        if value not in (None, 1, 1.0):
            raise MeasureError(
                "the target's logits are scaled beyond its lm_head, which the measurement does not implement",
                where=str(tpath / "config.json"),
                found=f"{key} {value!r}"[:120],
                expected=f"none of {', '.join(_SCALED_LOGITS)}",
                fix="measure greedily (leave out --temperature)",
            )
    files = _tensor_file_map(tpath)
    name = _target_tensor(files, "lm_head.weight")
    if name is None and (text.get("tie_word_embeddings") or config.get("tie_word_embeddings")):
        name = _target_tensor(files, "embed_tokens.weight")
    if name is None:
        raise MeasureError(
            "the target has no lm_head.weight",
            where=str(tpath),
            found=f"{len(files)} tensors, none named *lm_head.weight (and its config ties no embeddings)",
            expected="the target checkpoint the draft serves with",
            fix="pass the target's checkpoint directory with --target",
        )
    weight = _load(tpath, {name: files[name]}, like.dtype)[name]
    vocab = text.get("vocab_size", config.get("vocab_size"))
    if type(vocab) is int and 0 < vocab < weight.shape[0]:
        weight = weight[:vocab]  # a padded head: sglang keeps the logits of the vocabulary
    return TargetHead(weight.to(like.device), f"{tpath}: {name}")


# ---------------------------------------------------------------------- the target states
def read_states(
    data: os.PathLike | str,
    config: dict,
    *,
    max_sequences: int | None = None,
    max_tokens: int | None = None,
    final: bool = False,
) -> Iterator[TargetStates]:
    """The sequences in ``data``, read one at a time as the iterator reaches them: a ``hidden_state_dump``
    directory (its layer ids checked against the draft's, its width against the draft's target hidden size), or
    SpecForge's or speculators' offline training data (:mod:`.training_data`; they record no layer ids: the width
    is checked, the layers are the user's word).  At most ``max_sequences``, and none after the one at which
    ``max_tokens`` tokens were read.  ``final``: with the target's final states (:attr:`TargetStates.final`), which
    a dump written with ``EAGLE3_PATCHES_DUMP_FINAL_STATES`` and SpecForge's files hold; data that cannot hold them
    are refused at the call (a SpecForge file without them when the iterator reaches it).  What is wrong with the
    data as a whole (no such files, other layers) is refused at the call; a file's problem when the iterator
    reaches it."""
    for flag, value in (("--max-sequences", max_sequences), ("--max-tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise MeasureError(f"{flag} must be a positive integer", found=repr(value)[:40], expected="an integer >= 1")
    eagle = config.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if dump_shards(data):
        dump = open_dump(data)
        if isinstance(ids, list) and dump.layer_ids is not None and list(ids) != dump.layer_ids:
            raise MeasureError(
                "the dump captured other layers than the draft was trained on",
                where=str(data),
                found=f"layer_ids {shown_ids(dump.layer_ids)}",
                expected=f"the draft's eagle_aux_hidden_state_layer_ids {shown_ids(list(ids))}",
                fix="dump with the draft's ids (serve with the draft, or EAGLE3_PATCHES_DUMP_LAYER_IDS)",
            )
        hidden = config.get("target_hidden_size") or config.get("hidden_size")
        layers = dump.layer_ids or (ids if isinstance(ids, list) else None)
        if type(hidden) is int and layers and dump.width != len(layers) * hidden:
            raise MeasureError(
                "the dump's hidden states are not the width the draft's layers give",
                where=str(data),
                found=f"width {dump.width}",
                expected=f"{len(layers)} layers x the target's hidden size {hidden} = {len(layers) * hidden}",
                fix="dump the target this draft was trained for, at the draft's eagle_aux_hidden_state_layer_ids",
            )
        if final and dump.final_width is None:
            raise _no_distribution(
                data,
                "this hidden_state_dump holds no final hidden states (aux hidden states and token ids only)",
                f"{FINAL} in some shards only"
                if any(FINAL in h.tensors for h in dump.shards)
                else f"no {FINAL} in its {len(dump.shards)} shard(s)",
            )
        states: Iterator[TargetStates] = dump.sequences(max_sequences=max_sequences, max_tokens=max_tokens, final=final)
        return _nonempty(states, data)
    kind = training_data.detect(data)
    if kind is None:
        raise MeasureError(
            "no target states found",
            where=str(data),
            found="no hidden_state_dump shard (shard-*.safetensors), SpecForge file (data_<i>.ckpt) or "
            "speculators file (data_<i>.pt)",
            expected="a hidden_state_dump directory, or the offline training data the draft was trained on",
            fix="dump a known-good server's states with EAGLE3_PATCHES_DUMP_DIR (docs/e2e.md)",
        )
    if kind == training_data.SPECFORGE:
        read = training_data.read_specforge(data, limit=max_sequences, final=final)
    elif final:
        raise _no_distribution(
            data,
            "speculators' data hold no state the target's distribution can be rebuilt from (the last captured layer, "
            "before the target's final norm, at layer ids the files do not record)",
            "speculators data_<i>.pt files",
        )
    else:
        read = training_data.read_speculators(data, limit=max_sequences)
    return _nonempty(_until_tokens(read, max_tokens), data)


def _no_distribution(data: os.PathLike | str, what: str, found: str) -> MeasureError:
    """The refusal of ``--temperature`` on data that cannot give the target's distribution: what is missing, and
    what would provide it."""
    return MeasureError(
        f"--temperature needs the target's distribution at each position: {what}; a hidden_state_dump written with "
        "EAGLE3_PATCHES_DUMP_FINAL_STATES=1, or SpecForge's data (its hidden_state), with --target, provides it",
        where=str(data),
        found=found,
        expected=f"the target's final normed hidden states ({FINAL} in a dump, hidden_state in SpecForge's files)",
        fix="dump a known-good server with EAGLE3_PATCHES_DUMP_FINAL_STATES=1 (docs/e2e.md), or measure greedily",
    )


def _until_tokens(states: Iterator[TargetStates], max_tokens: int | None) -> Iterator[TargetStates]:
    tokens = 0
    for st in states:
        tokens += int(st.tokens.shape[0])
        yield st
        if max_tokens is not None and tokens >= max_tokens:
            return  # before the next file is loaded


def _nonempty(states: Iterator[TargetStates], data: os.PathLike | str) -> Iterator[TargetStates]:
    any_read = False
    for st in states:
        any_read = True
        yield st
    if not any_read:
        raise MeasureError(
            "the data holds no whole sequence",
            where=str(data),
            found="every sequence starts after position 0 (a prefix served from the radix cache) or is one token",
            expected="sequences from their first token",
            fix="dump with --disable-radix-cache",
        )


# ---------------------------------------------------------------------- the replay
def replay(
    forward: DraftForward,
    hot,
    sequences: Iterable[TargetStates],
    steps: int,
    worker: str = SPEC_V1,
    *,
    progress: bool = False,
    sampling: sm.Sampling | None = None,
    head: TargetHead | None = None,
) -> Acceptance:
    """topk 1: the verify steps a server would run over ``sequences`` (module docstring), taken one at a time as the
    iterable yields them: greedy, or at ``sampling``'s temperature (the sequences with their final states, ``head``
    the target's lm_head), where the result also holds the rejection-sampling figure; ``progress``: a bar on stderr
    of the tokens replayed and the figure so far."""
    sampling = sampling or sm.Sampling()
    if not sampling.greedy and head is None:
        raise MeasureError("a replay at temperature needs the target's lm_head", found="no head", fix="pass --target")
    bar = progress_bar(unit="tok", unit_scale=True, desc="measure-accept") if progress else None
    try:
        return _replay(forward, hot, sequences, steps, worker, bar, sampling, head)
    finally:
        if bar is not None:
            bar.close()


def walk(accept: list[list[float]], labelled: list[bool], steps: int, histogram: list[float]) -> None:
    """Adds one sequence's verify steps to ``histogram`` (expected counts of verify steps that accepted 0..steps
    draft tokens).  ``accept[k - 1][t]``: the probability that draft token k of the verify step at base t is
    accepted given tokens 1..k-1 were (0 or 1 greedy); ``labelled[i]``: token i is one the target produced.

    A verify step starts at base t when token t + 1 was just produced by the target (a prompt token: the next base
    is t + 1), drafts for tokens t + 2 .. t + steps + 1, and accepts exactly j of them with probability
    ``a_1 ... a_j (1 - a_{j+1})`` (no draft token past the data's end, none at a token the target did not produce);
    the next verify step starts at t + j + 1 with that weight.  Greedy, the weights are 0 or 1: the walk a server
    makes, one verify step after the other."""
    L = len(labelled)
    weight = [0.0] * (L + steps + 2)
    weight[0] = 1.0
    for t in range(L - 2):  # the token just produced (t + 1) and at least one to draft for
        w = weight[t]
        if not w:
            continue
        if not labelled[t + 1]:  # a prompt token: the next verify step starts after the next target token
            weight[t + 1] += w
            continue
        reach = 1.0  # the probability that draft tokens 1..k-1 were accepted
        accepted = 0
        for k in range(1, steps + 1):
            if t + k + 1 > L - 1:
                # pragma: no mutate core/ReplaceBreakWithContinue: the test `t + k + 1 > L - 1` only turns true as k
                # grows: once it holds, every later k continues too, as the break would have stopped
                break  # the request ends with its data: sglang accepts nothing past the finish either
            a = accept[k - 1][t] if labelled[t + k + 1] else 0.0
            stop = reach * (1.0 - a)  # exactly k - 1 accepted
            if stop:
                histogram[k - 1] += w * stop
                weight[t + k] += w * stop
            reach *= a
            accepted = k
            if not reach:
                break
        if reach:
            histogram[accepted] += w * reach
            weight[t + accepted + 1] += w * reach


def _check(st: TargetStates, forward: DraftForward, head: TargetHead | None) -> None:
    """Refuses states the draft (and, at temperature, the target's head) cannot run on, naming what is wrong."""
    import torch

    tokens = st.tokens
    if st.aux.shape[-1] != forward.params["fc.weight"].shape[1]:
        raise MeasureError(
            "the target states do not have the width the draft's fc takes",
            where=st.source,
            found=f"{st.aux.shape[-1]} wide",
            expected=f"{forward.params['fc.weight'].shape[1]} (k aux layers x the target's hidden size)",
            fix="dump or prepare the states at the draft's eagle_aux_hidden_state_layer_ids",
        )
    vocab = int(forward.embed.shape[0]) if head is None else min(int(forward.embed.shape[0]), head.weight.shape[0])
    # pragma: no mutate core/NumberReplacer `-1`: every reader builds `tokens` one-dimensional (the dump reader from
    # a list; the training-data readers refuse anything but `[L]` or `[1, L]` and squeeze the latter)
    if int(tokens.shape[0]) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise MeasureError(
            "the target states hold token ids outside the target's vocabulary",
            where=st.source,
            found=f"token ids {int(tokens.min())}..{int(tokens.max())}",
            expected=f"ids in 0..{vocab - 1} (the rows of the embedding the draft runs with)",
            fix="measure on states of the target the draft serves with (pass it with --target)",
        )
    named = (("the target states", st.aux),) + (() if head is None or st.final is None else (("final", st.final),))
    for what, t in named:
        if not bool(torch.isfinite(t).all()):
            raise MeasureError(
                "the target states hold NaN or infinite values"
                + ("" if what == "the target states" else " in their final states"),
                where=st.source,
                found=f"{int((~torch.isfinite(t)).sum())} non-finite of {t.numel()}",
                expected="finite hidden states",
                fix="dump or prepare the states again from a server whose outputs are finite",
            )
    if head is not None:
        width = head.weight.shape[1]
        if st.final is None or st.final.shape != (tokens.shape[0], width):
            raise MeasureError(
                "the target's final states do not fit its lm_head",
                where=st.source,
                found="no final states" if st.final is None else f"final states {list(st.final.shape)}",
                expected=f"[{int(tokens.shape[0])}, {width}]: one row per token, the width of {head.source}",
                fix="measure on states of the target passed with --target",
            )


def _replay(
    forward: DraftForward,
    hot,
    sequences: Iterable[TargetStates],
    steps: int,
    worker: str,
    bar,
    sampling: sm.Sampling,
    head: TargetHead | None,
) -> Acceptance:
    import torch

    if steps < 1:
        raise MeasureError("--speculative-num-steps must be at least 1", found=str(steps))
    greedy = sampling.greedy
    result = Acceptance(
        steps, [0.0] * (steps + 1), 0, worker=worker, sampling=sampling, verify=sm.GREEDY if greedy else sm.TARGET_ONLY
    )
    rejection = (
        None if greedy else Acceptance(steps, [0.0] * (steps + 1), 0, [], worker, sampling, sm.REJECTION_SAMPLING)
    )
    for st in sequences:
        _check(st, forward, None if greedy else head)
        L = int(st.tokens.shape[0])
        if L < 3:
            result.skipped.append(f"{st.source}: {L} tokens, shorter than one verify step")
            continue
        result.sequences += 1
        labelled = [bool(x) for x in st.labelled.tolist()]
        with torch.no_grad():  # the caller's autograd mode is left as it was
            if greedy:
                ids = forward.predict(st.tokens, st.aux, steps, worker=worker)  # on the draft's device
                tokens = st.tokens
                accept = [
                    (hot[i[: L - k - 1].cpu()] == tokens[k + 1 :]).double().tolist() for k, i in enumerate(ids, start=1)
                ]
                walk(accept, labelled, steps, result.histogram)
            else:
                assert head is not None and rejection is not None
                both = forward.reduce(st.tokens, st.aux, steps, _sampled_head(head, st.final, hot, sampling), worker)
                walk([b[: L - k - 1, 0].tolist() for k, b in enumerate(both, 1)], labelled, steps, result.histogram)
                walk([b[: L - k - 1, 1].tolist() for k, b in enumerate(both, 1)], labelled, steps, rejection.histogram)
        if bar is not None:
            bar.update(L)
            if result.verify_steps:  # none yet after a sequence of prompt only: no figure to show
                bar.set_postfix_str(f"accept length {result.accept_length:.3f}", refresh=False)
    if greedy:  # 0/1 weights: whole counts
        result.histogram = [int(c) for c in result.histogram]
    else:
        assert rejection is not None
        rejection.sequences, rejection.skipped = result.sequences, result.skipped
        result.rejection_sampling = rejection
    return result


def _sampled_head(head: TargetHead, final, hot, sampling: sm.Sampling):
    """The draft's per-block reduction at temperature: per row (base t of step k), ``[q(argmax), sum min(p, q)]``
    with ``q`` the target's distribution for token t + k + 1 (its final state at t + k through its lm_head)."""
    import torch

    device = head.weight.device
    final = final.to(device)
    hot = hot.to(device)
    rows = max(1, draft_reference.BLOCK_ELEMENTS // head.weight.shape[0])  # target-vocabulary rows held at once

    def reduce(logits, step, start):
        out = torch.empty(logits.shape[0], 2, dtype=torch.float32, device=device)
        for i in range(0, logits.shape[0], rows):
            draft = logits[i : i + rows]
            at = start + i + step  # the final state that gives the distribution of the drafted token
            q = sm.target_probs(head.logits(final[at : at + draft.shape[0]]), sampling)
            out[i : i + rows, 0] = sm.target_only(q, hot[draft.argmax(-1)])
            out[i : i + rows, 1] = sm.rejection_sampling(q, sm.draft_probs(draft, sampling), hot)
        return out

    return reduce


def expected_accept_length(
    draft: os.PathLike | str,
    sequences: Iterable[TargetStates],
    *,
    target: os.PathLike | str | None = None,
    steps: int = 3,
    worker: str = SPEC_V1,
    sampling: sm.Sampling | None = None,
) -> Acceptance:
    forward, hot, _ = load_draft(draft, target)
    sampling = sampling or sm.Sampling()
    head = None if sampling.greedy else load_target_head(target, forward.params["fc.weight"])
    return replay(forward, hot, sequences, steps, worker, sampling=sampling, head=head)
