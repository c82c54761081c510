"""The accept length a draft is expected to reach, as its config states it (field :data:`FIELD`).

Read by the watchdog (it compares the live figure with it), the doctor (it checks the field and the launch it is
compared with) and the converter (which carries it across).  The field, in the draft's ``config.json``::

    "expected_accept_length": {"accept_length": 3.1, "speculative_num_steps": 3,
                               "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                               "temperature": 0.6}

or a bare number (then measured at the flags the draft is served with, at a temperature it does not state).
``temperature`` (0: greedy), and ``top_k`` / ``top_p`` where they were used, state the request sampling the figure
holds at: an accept length measured greedily does not hold at temperature, and the watchdog compares a window of
requests served at another temperature with nothing.  ``eagle3-patches measure-accept`` prints the field; a
publisher's model card gives the figure and the flags (and, at best, the sampling) it was measured at.
"""

from __future__ import annotations

from dataclasses import dataclass

from .safe_io import CheckpointError, checkpoint_error

FIELD = "expected_accept_length"
#: the flags the figure was measured at: (config key, ExpectedAccept attribute, sglang flag)
MEASURED_AT = (
    ("speculative_num_steps", "num_steps", "--speculative-num-steps"),
    ("speculative_eagle_topk", "topk", "--speculative-eagle-topk"),
    ("speculative_num_draft_tokens", "num_draft_tokens", "--speculative-num-draft-tokens"),
)
#: why a server launched with ``--speculative-adaptive`` (sglang 0.5.11+) is held to no accept length: sglang picks
#: ``--speculative-num-steps`` per batch from the acceptance it observes, among its candidate steps, which include
#: 0 (no drafting) at larger batches in the defaults of newer releases
ADAPTIVE_STEPS = (
    "served with --speculative-adaptive: sglang changes --speculative-num-steps at run time (down to 0, no "
    "drafting, at larger batches), so neither a figure measured at fixed steps nor a low accept length says "
    "what the draft does"
)


def adaptive_turned_off(
    algorithm: str | None,
    topk: int | None,
    dp_attention: bool,
    two_batch_overlap: bool,
    multi_layer_eagle: bool = False,
    pdmux: bool = False,
) -> str | None:
    """Why sglang falls back to fixed steps under ``--speculative-adaptive`` (its ``adaptive_unsupported_reason``,
    read in the 0.5.23 wheel and the earlier ones that have it: it logs a warning and serves at the static flags), or
    None where the steps adapt.  Every fallback of those releases is here: one left out makes the watchdog stand down
    on a server that runs fixed steps."""
    if algorithm not in (None, "EAGLE", "EAGLE3"):
        return f"--speculative-algorithm {algorithm}"
    if topk not in (None, 1):
        return f"--speculative-eagle-topk {topk}: only 1 is supported"
    if dp_attention:
        return "--enable-dp-attention"
    if multi_layer_eagle:
        return "--enable-multi-layer-eagle"
    if two_batch_overlap:
        return "--enable-two-batch-overlap"
    if pdmux:
        return "--enable-pdmux"
    return None


#: 64 bounds what any config states (an accept length is at most a verify step's draft tokens)
MAX_ACCEPT_LENGTH = 64.0
#: the highest temperature a figure states
MAX_TEMPERATURE = 100.0


def sampling_text(temperature: float | None, top_k: int | None = None, top_p: float | None = None) -> str:
    """``greedy (temperature 0)``, ``temperature 0.6`` (with its top-k / top-p where stated), or ``at a temperature
    not stated``."""
    if temperature is None:
        return "at a temperature not stated"
    if temperature == 0:
        return "greedy (temperature 0)"
    return (
        f"temperature {temperature:g}"
        + (f", top-k {top_k}" if top_k is not None else "")
        + (f", top-p {top_p:g}" if top_p not in (None, 1.0) else "")
    )


@dataclass(frozen=True)
class ExpectedAccept:
    accept_length: float
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    source: str = ""
    #: the requests' temperature the figure holds at (0: greedy), None where it is not stated
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None

    @property
    def gain(self) -> float:
        """Tokens a verify step yields beyond the target's own one."""
        return self.accept_length - 1.0

    def not_comparable(self, num_steps, topk, num_draft_tokens) -> str | None:
        """Why a server run with these flags cannot be held to this figure, or None when it can."""
        served = {"num_steps": num_steps, "topk": topk, "num_draft_tokens": num_draft_tokens}
        for _, attr, flag in MEASURED_AT:
            mine = getattr(self, attr)
            if mine is not None and served[attr] is not None and int(served[attr]) != mine:
                return f"measured at {flag} {mine}, served with {served[attr]}"
        return None

    def sampling(self) -> str:
        """The sampling the figure holds at, in words (:func:`sampling_text`)."""
        return sampling_text(self.temperature, self.top_k, self.top_p)

    def describe(self) -> str:
        at = ", ".join(f"{flag} {getattr(self, attr)}" for _, attr, flag in MEASURED_AT if getattr(self, attr))
        return (
            f"{self.accept_length:g}"
            + (f" at {at}" if at else "")
            + f", {self.sampling()}"
            + (f" ({self.source})" if self.source else "")
        )


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def from_value(value, *, source: str) -> ExpectedAccept:
    """The figure in ``value`` (the field's value), or a :class:`CheckpointError` naming what is wrong."""

    def bad(found: str) -> CheckpointError:
        return checkpoint_error(
            "expected-accept-length",
            f"{FIELD} cannot be read",
            where=source,
            found=found[:200],
            expected=f"a number in (1, {MAX_ACCEPT_LENGTH:g}], or an object with accept_length and the "
            "speculative_num_steps / speculative_eagle_topk / speculative_num_draft_tokens it was measured at (and "
            f"its temperature in 0..{MAX_TEMPERATURE:g}, top_k >= 1, top_p in (0, 1])",
            fix="correct the field (`eagle3-patches measure-accept` prints it) or remove it",
        )

    fields = value if isinstance(value, dict) else {"accept_length": value}
    length = _number(fields.get("accept_length"))
    if length is None or not 1.0 < length <= MAX_ACCEPT_LENGTH:
        raise bad(f"accept_length {fields.get('accept_length')!r}")
    at: dict[str, int | None] = {}
    for key, attr, _ in MEASURED_AT:
        raw = fields.get(key)
        if raw is None:
            at[attr] = None
            continue
        if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= 1024:
            raise bad(f"{key} {raw!r}")
        at[attr] = raw
    # a verify step yields at most its draft tokens (the root included) and at most steps + 1
    if at["num_draft_tokens"] is not None and length > at["num_draft_tokens"]:
        raise bad(f"accept_length {length:g} above speculative_num_draft_tokens {at['num_draft_tokens']}")
    if at["num_steps"] is not None and length > at["num_steps"] + 1:
        raise bad(f"accept_length {length:g} above speculative_num_steps + 1 = {at['num_steps'] + 1}")
    temperature, top_p = _number(fields.get("temperature")), _number(fields.get("top_p"))
    if "temperature" in fields and (temperature is None or not 0.0 <= temperature <= MAX_TEMPERATURE):
        raise bad(f"temperature {fields.get('temperature')!r}")
    top_k = fields.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise bad(f"top_k {top_k!r}")
    if "top_p" in fields and (top_p is None or not 0.0 < top_p <= 1.0):
        raise bad(f"top_p {fields.get('top_p')!r}")
    return ExpectedAccept(
        length, at["num_steps"], at["topk"], at["num_draft_tokens"], source, temperature, top_k, top_p
    )


def from_config(config: dict, *, where: str) -> ExpectedAccept | None:
    """The figure a draft config states, None when it states none; malformed: :class:`CheckpointError`."""
    if FIELD not in config:
        return None
    return from_value(config[FIELD], source=f"{where}: {FIELD}")
