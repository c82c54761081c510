"""Facts about sglang releases that are not a bug this library patches (the +1 rule, ``layers.0`` loading,
the fc width, which release has Kimi-K2.5).  What a bug does, and from which release it is fixed, lives in
its patch module (``applies_to``, ``upstream()``, ``preflight()``).  Never imports sglang or the patches.

Comparisons use the release tuple only (``0.5.10.post1`` behaves as ``0.5.10``,
``0.5.13rc1`` as ``0.5.13``).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

#: the release eagle3-patches is pinned to (pyproject ``serve`` extra)
PINNED = Version("0.5.9")
#: the oldest and newest releases the table was read from
OLDEST_KNOWN = (0, 5, 8)
NEWEST_KNOWN = (0, 5, 23)
#: the first release whose ``LlamaForCausalLMEagle3.load_weights`` maps ``layers.0.*`` onto ``midlayer``
LAYERS0_KEYS_FROM = (0, 5, 12)


def parse_version(v: str | Version) -> Version:
    """A :class:`Version`; raises ``ValueError`` with a readable message for junk."""
    if isinstance(v, Version):
        return v
    try:
        # pragma: no mutate eagle3/DropNormalisation: packaging's `Version` strips surrounding whitespace itself
        # (`Version(" 0.5.13\n")` is 0.5.13): the `strip()` changes nothing
        return Version(str(v).strip())
    except InvalidVersion:
        raise ValueError(f"not a version number: {v!r} (expected e.g. 0.5.9)") from None


def _rel(v: Version) -> tuple[int, ...]:
    # pragma: no mutate core/NumberReplacer `, 1)`, `, -1)`: a `packaging` version's release has at least one number
    # (`Version` refuses an empty one), so with two zeros added it already has three: the third zero is never within
    # `[:3]`
    # pragma: no mutate eagle3/DropLiteralElement: a `packaging` version's release has at least one number (`Version`
    # refuses an empty one), so with two zeros added it already has three: the third zero is never within `[:3]` (any
    # one of the three zeros dropped)
    r = tuple(v.release) + (0, 0, 0)
    return r[:3]


@dataclass(frozen=True)
class ReleaseFacts:
    version: Version

    @property
    def release(self) -> tuple[int, ...]:
        return _rel(self.version)

    @property
    def in_table(self) -> bool:
        return OLDEST_KNOWN <= self.release <= NEWEST_KNOWN

    @property
    def has_kimi_k25(self) -> bool:
        """``models/kimi_k25.py`` exists (0.5.9+)."""
        return self.release >= (0, 5, 9)

    @property
    def has_plugins(self) -> bool:
        """sglang loads the ``sglang.srt.plugins`` entry points in its processes (0.5.11+)."""
        return self.release >= (0, 5, 11)

    @property
    def loads_layers0_keys(self) -> bool:
        """``LlamaForCausalLMEagle3`` maps speculators' ``layers.0.*`` onto ``midlayer`` (0.5.12+)."""
        return self.release >= LAYERS0_KEYS_FROM

    @property
    def fc_width_from_ids(self) -> bool:
        """``fc`` is built ``hidden_in * len(ids)`` wide (0.5.12+); before, always ``hidden_in * 3``."""
        return self.release >= (0, 5, 12)

    @property
    def plus_one_always(self) -> bool:
        """ids are always shifted by +1 (before 0.5.13); from 0.5.13 only when the first id is 1."""
        return self.release < (0, 5, 13)


def facts(version: str | Version) -> ReleaseFacts:
    return ReleaseFacts(parse_version(version))
