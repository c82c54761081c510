"""The facts about sglang releases, in one place: the release eagle3-patches is pinned to, the newest release it
has been checked against, and what each release has that is not a bug this library patches (the +1 rule,
``layers.0`` loading, the fc width, which release has Kimi-K2.5, from which release each kind of draft is served).
A library message that names one of these releases is formatted from here, never retyped
(``tests/unit/test_release_facts.py`` refuses the literal elsewhere).  What a bug does, and the releases it
applies to (so the first release with the upstream fix), lives in its patch module (``applies_to``,
``upstream()``, ``preflight()``).  Never imports sglang or the patches.

Comparisons use the release a version behaves as (:func:`~eagle3_patches.sglang_version.base_release`:
``0.5.10.post1`` behaves as ``0.5.10``, ``0.5.13rc1`` as ``0.5.13``).

A new sglang release, once the matrix ran green on it (docs/development.md, "A new sglang release"): set
:data:`NEWEST_CHECKED` to it; ``tools/matrix.py`` reads it from here (``newest-known``).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ..sglang_version import base_release

#: the release eagle3-patches is pinned to (pyproject ``serve`` extra; ``tools/matrix.py``'s ``pinned``)
PINNED = Version("0.5.9")
#: the oldest release the table was read from
OLDEST_KNOWN = Version("0.5.8")
#: the newest release eagle3-patches has been checked against (the release matrix, docs/compat.md; the table of
#: this module; ``tools/matrix.py``'s ``newest-known``, which CI runs)
NEWEST_CHECKED = Version("0.5.23")
#: the first release with ``models/kimi_k25.py`` (Kimi-K2.5)
KIMI_K25_FROM = Version("0.5.9")
#: the first release that loads the ``sglang.srt.plugins`` entry points in its processes
PLUGINS_FROM = Version("0.5.11")
#: the first release with ``--speculative-adaptive`` (adaptive speculative steps)
ADAPTIVE_STEPS_FROM = Version("0.5.11")
#: the environment variable that turns sglang's spec v2 (the overlap scheduler for EAGLE) on or off
SPEC_V2 = "SGLANG_ENABLE_SPEC_V2"
#: the first release where :data:`SPEC_V2` defaults to true (``srt/environ.py``: ``EnvBool(False)`` in 0.5.9 and
#: 0.5.10, ``EnvBool(True)`` from 0.5.11)
SPEC_V2_DEFAULT_ON_FROM = Version("0.5.11")
#: the first release with one EAGLE worker (``EAGLEWorkerV2``, whatever :data:`SPEC_V2` says)
ONE_WORKER_FROM = Version("0.5.13")
#: the first release whose ``LlamaForCausalLMEagle3.load_weights`` maps ``layers.0.*`` onto ``midlayer``
LAYERS0_KEYS_FROM = Version("0.5.12")
#: the first release that builds ``fc`` ``hidden_in * len(ids)`` wide (before, always ``hidden_in * 3``)
FC_WIDTH_FROM_IDS_FROM = Version("0.5.12")
#: the first release that shifts the layer ids by +1 only when the first id is 1 (before, always)
PLUS_ONE_ONLY_FROM_1_FROM = Version("0.5.13")
#: HiCache's storage tier (L3, ``--hicache-storage-backend``) and the draft's pages, read from the wheels
#: (``managers/cache_controller.py``, ``mem_cache/hybrid_cache/hybrid_cache_controller.py``, the backends): the first
#: release that writes them beside the target's through the backend's generic ``batch_set`` / ``batch_get``, every
#: failure swallowed at debug level
HICACHE_DRAFT_L3_FROM = Version("0.5.11")
#: the first release that picks the draft's L3 path per backend (``_maybe_register_draft_with_storage``: mooncake's
#: zero-copy pool, the generic path, or "HiCache draft L3 disabled" for the rest)
HICACHE_DRAFT_L3_PER_BACKEND_FROM = Version("0.5.13")
#: the first release that keeps the draft as a sidecar pool of the unified radix cache (``batch_set_v2``), whose
#: pages a prefix needs to be a hit, and gives a per-head draft rank-specific keys on mooncake
HICACHE_DRAFT_SIDECAR_FROM = Version("0.5.19")
#: the first release serving each kind of draft as it is: DFlash (``models/dflash.py``, ``--speculative-algorithm
#: DFLASH``), the MLA EAGLE-3 draft (``models/kimi_k25_eagle3.py``), an EAGLE-3 draft of more than one layer
DFLASH_FROM = Version("0.5.11")
MLA_DRAFT_FROM = Version("0.5.12")
MULTI_LAYER_DRAFT_FROM = Version("0.5.12")
# What the EAGLE-3 draft's prefill (draft extend) reads for a multimodal request, read from the wheels
# (``models/llama_eagle3.py`` / ``models/kimi_k25_eagle3.py`` ``forward``, ``speculative/eagle_worker_v2.py``
# ``_draft_extend_for_prefill``, ``managers/mm_utils.py`` ``general_mm_embed_routine``).  Before
# :data:`MM_DRAFT_EMBEDS_FROM` the Llama draft embeds its own (shifted) token ids, the image positions' ids clamped
# into the vocabulary by the target's ``embed_mm_inputs``.
#: the first release whose Llama EAGLE-3 draft reads the target's merged input embeddings (``mm_input_embeds``)
MM_DRAFT_EMBEDS_FROM = Version("0.5.10")
#: the first release that re-embeds the last row of every sequence of a batched multimodal prefill (sglang PR #27647
#: for the MLA draft, #27846 for the Llama draft); before it, only the flattened batch's last row, and every other
#: sequence's last position keeps the target's row
MM_DRAFT_LAST_ROWS_FROM = Version("0.5.14")
#: the first release that shifts ``mm_input_embeds`` left by one per sequence, as it shifts the draft's token ids
#: (``rotated_mm``, sglang PRs #36507 / #37548); before it, every prefix row is one position late
MM_DRAFT_ROWS_SHIFTED_FROM = Version("0.5.20")
#: the first release that hands the draft a copy of the merged embeddings (``input_embeds.clone()`` for EAGLE, as
#: sglang issue #35440 / PR #35465 ask); before it, the tensor is the one the target's forward may overwrite in place
#: (fused residual-add norms on the GPU) before the draft reads it
MM_DRAFT_EMBEDS_COPIED_FROM = Version("0.5.21")
#: the first release whose EAGLE-3 draft runs its prefill through the breakable prefill CUDA graph
#: (``init_prefill_cuda_graph(force_for_draft_worker=True)`` in ``eagle_worker_v2.py``) when that graph is on
DRAFT_PREFILL_GRAPH_FROM = Version("0.5.14")
#: the first release that keeps the breakable prefill CUDA graph on by default for a multimodal Kimi-K2.5 target
#: (``KimiK25ForConditionalGeneration`` in ``configs/model_config.py``'s
#: ``multimodal_breakable_cuda_graph_supported_model_archs``; before, a multimodal target turns it off unless the
#: launch asks for it)
KIMI_K25_MM_PREFILL_GRAPH_FROM = Version("0.5.18")
#: the first release whose breakable prefill graph feeds an EAGLE-3 draft its embeddings from outside the graph
#: (``_use_draft_input_embeds`` in ``model_executor/runner/prefill_cuda_graph_runner.py``, what sglang PR #38330
#: proposes); before it the graph embeds the image positions' pad ids, out of the vocabulary, and the server fails
#: at start (its warm-up sends an image)
DRAFT_PREFILL_GRAPH_EMBEDS_FROM = Version("0.5.22")
#: the first release where ``--enable-breakable-cuda-graph`` is an alias of ``--cuda-graph-backend-prefill
#: breakable`` (a deprecated flag of ``server_args.py``)
BREAKABLE_GRAPH_ALIAS_FROM = Version("0.5.19")


def parse_version(v: str | Version) -> Version:
    """A :class:`Version`; raises ``ValueError`` with a readable message for junk."""
    if isinstance(v, Version):
        return v
    try:
        return Version(str(v).strip())
    except InvalidVersion:
        raise ValueError(f"not a version number: {v!r} (expected e.g. {PINNED})") from None


def rel(v: Version) -> tuple[int, int, int]:
    """``v``'s release as a 3-tuple (the form of the tables that hold release tuples)."""
    a, b, c = base_release(v).release
    return (a, b, c)


@dataclass(frozen=True)
class ReleaseFacts:
    version: Version

    @property
    def base(self) -> Version:
        return base_release(self.version)

    @property
    def release(self) -> tuple[int, int, int]:
        return rel(self.version)

    @property
    def in_table(self) -> bool:
        return OLDEST_KNOWN <= self.base <= NEWEST_CHECKED

    @property
    def has_kimi_k25(self) -> bool:
        """``models/kimi_k25.py`` exists (:data:`KIMI_K25_FROM`)."""
        return self.base >= KIMI_K25_FROM

    @property
    def has_plugins(self) -> bool:
        """sglang loads the ``sglang.srt.plugins`` entry points in its processes (:data:`PLUGINS_FROM`)."""
        return self.base >= PLUGINS_FROM

    @property
    def loads_layers0_keys(self) -> bool:
        """``LlamaForCausalLMEagle3`` maps speculators' ``layers.0.*`` onto ``midlayer`` (:data:`LAYERS0_KEYS_FROM`)."""
        return self.base >= LAYERS0_KEYS_FROM

    @property
    def fc_width_from_ids(self) -> bool:
        """``fc`` is built ``hidden_in * len(ids)`` wide (:data:`FC_WIDTH_FROM_IDS_FROM`); before, ``hidden_in * 3``."""
        return self.base >= FC_WIDTH_FROM_IDS_FROM

    @property
    def has_mla_draft(self) -> bool:
        """``models/kimi_k25_eagle3.py`` (the MLA EAGLE-3 draft's class) exists (:data:`MLA_DRAFT_FROM`)."""
        return self.base >= MLA_DRAFT_FROM

    @property
    def plus_one_always(self) -> bool:
        """ids are always shifted by +1 (before :data:`PLUS_ONE_ONLY_FROM_1_FROM`); from it only when the first
        id is 1."""
        return self.base < PLUS_ONE_ONLY_FROM_1_FROM


def facts(version: str | Version) -> ReleaseFacts:
    return ReleaseFacts(parse_version(version))


def env_bool(value: str | None) -> bool | None:
    """An environment value as sglang's ``EnvBool`` parses it; None for unset or a value it does not accept."""
    if value is None:
        return None
    v = value.lower()
    return True if v in ("true", "1", "yes", "y") else False if v in ("false", "0", "no", "n") else None


def spec_v2_on(value: str | None, version: Version) -> bool:
    """Whether ``version`` runs spec v2 with :data:`SPEC_V2` set to ``value`` (None: unset): the value as sglang's
    ``EnvBool`` parses it, else the release's default (:data:`SPEC_V2_DEFAULT_ON_FROM`)."""
    parsed = env_bool(value)
    return base_release(version) >= SPEC_V2_DEFAULT_ON_FROM if parsed is None else parsed
