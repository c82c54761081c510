"""What each sglang release does on the EAGLE-3 path (the release table of
``shared/notes/eagle3-path-and-bugs.md``, as data).  Never imports sglang.

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


def parse_version(v: str | Version) -> Version:
    """A :class:`Version`; raises ``ValueError`` with a readable message for junk."""
    if isinstance(v, Version):
        return v
    try:
        return Version(str(v).strip())
    except InvalidVersion:
        raise ValueError(f"not a version number: {v!r} (expected e.g. 0.5.9)") from None


def _rel(v: Version) -> tuple[int, ...]:
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
    def kimi_delegation(self) -> bool:
        """``KimiK25ForConditionalGeneration`` delegates the EAGLE-3 hooks to its language model (0.5.10+)."""
        return self.release >= (0, 5, 10)

    @property
    def loads_layers0_keys(self) -> bool:
        """``LlamaForCausalLMEagle3`` maps speculators' ``layers.0.*`` onto ``midlayer`` (0.5.12+)."""
        return self.release >= (0, 5, 12)

    @property
    def fc_width_from_ids(self) -> bool:
        """``fc`` is built ``hidden_in * len(ids)`` wide (0.5.12+); before, always ``hidden_in * 3``."""
        return self.release >= (0, 5, 12)

    @property
    def plus_one_always(self) -> bool:
        """ids are always shifted by +1 (before 0.5.13); from 0.5.13 only when the first id is 1."""
        return self.release < (0, 5, 13)

    @property
    def cuda_graph_order_bug(self) -> bool:
        """CUDA graphs are captured with the default layers before the configured ids are set (< 0.5.11)."""
        return self.release < (0, 5, 11)

    @property
    def allreduce_fusion_partial_sums(self) -> bool:
        """With flashinfer all-reduce fusion the captured state is a per-rank partial sum (< 0.5.14)."""
        return self.release < (0, 5, 14)

    @property
    def raises_on_missing_states(self) -> bool:
        """``AuxHiddenStatePacker`` raises when fewer states than asked were captured (0.5.23)."""
        return self.release >= (0, 5, 23)


def facts(version: str | Version) -> ReleaseFacts:
    return ReleaseFacts(parse_version(version))


#: used only when the patch registry cannot be built (a partial install): the ranges the
#: patch modules declared when this table was written
_FALLBACK_PATCH_RANGES = {
    "kimi_k25_eagle3_delegation": ">=0.5.9,<0.5.10",
    "aux_capture_validation": ">=0.5.8,<0.5.13",
    "cuda_graph_capture_order": ">=0.5.8,<0.5.11",
    "tp_allreduce_fusion_capture": ">=0.5.8,<0.5.14",
    "eagle3_draft_strict_loading": ">=0.5.8",
    "eagle3_fc_guard": ">=0.5.8",
    "eagle3_algorithm_guard": ">=0.5.8",
}


def patch_covers(patch_name: str, version: str | Version) -> bool:
    """Whether eagle3-patches' patch ``patch_name`` applies to sglang ``version``.

    Reads the patch's declared ``applies_to`` from the registry (importing the patch
    modules, never sglang); falls back to :data:`_FALLBACK_PATCH_RANGES` when the registry
    cannot be built; False for an unknown patch.
    """
    from packaging.specifiers import SpecifierSet

    v = Version(".".join(map(str, _rel(parse_version(version)))))
    try:
        import eagle3_patches

        reg = eagle3_patches.get_registry()
    except Exception:  # noqa: BLE001 - a partial install: use the table
        rng = _FALLBACK_PATCH_RANGES.get(patch_name)
        return rng is not None and v in SpecifierSet(rng)
    if patch_name not in reg.names():
        return False
    spec = getattr(reg[patch_name], "applies_to", None)
    return True if not spec else v in spec
