"""Which kind of speculative draft a checkpoint is, in which layout, and whether an sglang release serves it.

:data:`LAYOUTS` is the one table: every kind and layout of draft that reaches users (EAGLE-1/2, EAGLE-3,
EAGLE-3.1, multi-layer EAGLE-3, MTP/NextN, DFlash, P-EAGLE; sglang's own layouts, speculators', the original
EAGLE repository's, NVIDIA ModelOpt's and NeMo Automodel's exports), with the first sglang release that serves
each as it is and the ``--speculative-algorithm`` that does.  :func:`classify` tells them apart from
``config.json`` and tensor names / shapes (the safetensors header); :func:`verdict` judges a release.  The
algorithm guard's "is it EAGLE-3?" (:mod:`.draft_kind`) and the doctor's ``draft-kind`` finding both read
:func:`classify`: one rule.

Where each release fact was read (the released wheels' ``sglang/srt``): ``models/llama_eagle3.py``
(``LlamaForCausalLMEagle3``; one decoder layer only before 0.5.12: ``ValueError("EAGLE3 currently only supports
1 layer")``, ``num_hidden_layers`` layers from 0.5.12), ``models/llama_eagle.py`` (``LlamaForCausalLMEagle``),
``models/kimi_k25_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``, from 0.5.12), ``models/dflash.py`` and
``speculative/spec_info.py`` (``DFlashDraftModel``, ``SpeculativeAlgorithm.DFLASH``, from 0.5.11),
``models/deepseek_nextn.py`` and ``configs/model_config.py`` (``_config_draft_model``: a target architecture
given as the draft is mapped to its NextN/MTP class).  No release checked reads speculators'
``speculators_model_type`` nor ``parallel_drafting``, and none registers the original EAGLE repository's or
NeMo Automodel's architecture names for a draft.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import releases as R
from .draft_fields import FIRST_READ, MLA_FIRST_READ
from .formats import MLA_DRAFT_ARCH, SGLANG_EAGLE3, detect_format

KIND_EAGLE1 = "EAGLE-1/2"
KIND_EAGLE3 = "EAGLE-3"
KIND_EAGLE31 = "EAGLE-3.1"
KIND_MULTI = "multi-layer EAGLE-3"
KIND_MTP = "MTP/NextN"
KIND_DFLASH = "DFlash"
KIND_PEAGLE = "P-EAGLE"
#: the kinds fed the target's aux hidden states through ``fc``: served with ``--speculative-algorithm EAGLE3``
EAGLE3_KINDS = frozenset({KIND_EAGLE3, KIND_EAGLE31, KIND_MULTI})

SERVED = "served"
CONVERT = "served after `eagle3-patches convert`"
NOT_SERVED = "not served"

#: an EAGLE-3 draft's fc takes one hidden state per aux layer (3 in sglang); an EAGLE-1/2 draft's takes 2 x hidden
#: (the token's embedding and the hidden state)
MIN_AUX_STATES = 3
#: EAGLE-3.1's fields (a per-state norm before fc, a normed output state), as sglang's ``kimi_k25_eagle3.py`` names
#: them; :data:`~.draft_fields.FIRST_READ` says which release reads each
EAGLE31_FIELDS = ("fc_norm", "use_aux_norm", "norm_output")
FC_NAMES = ("fc.weight", "model.fc.weight")
_OLDEST = R.rel(R.OLDEST_KNOWN)


@dataclass(frozen=True)
class Layout:
    key: str
    kind: str
    name: str  # the layout, as a user knows it
    detected_by: str  # what marks it in config.json / the header
    algorithms: tuple[str, ...]  # the --speculative-algorithm values that serve it
    served_from: tuple[int, int, int] | None  # the first release serving it as it is; None: none through the newest
    fix: str  # how to get it served where a release does not serve it as it is
    convert: bool = False  # `eagle3-patches convert` writes a layout every release in the table serves
    patched: str | None = None  # the patch of this library that serves it as it is
    owner: str | None = None  # the doctor's finding that already reports it unserved (one rule, not two)
    owned_from: tuple[int, int, int] | None = None  # the first release whose unserved verdict ``owner`` reports

    def owned_by(self, version) -> str | None:
        """The finding that reports this layout unserved on ``version`` (None: ``draft-kind-not-served`` does)."""
        if self.owner is None or (self.owned_from is not None and R.facts(version).release < self.owned_from):
            return None
        return self.owner


def _v(t: tuple[int, ...] | None) -> str:
    return ".".join(map(str, t)) if t else "-"


_E31_FROM = max(FIRST_READ[f] for f in EAGLE31_FIELDS if f in FIRST_READ)
#: the same for the MLA draft's class (``kimi_k25_eagle3.py`` reads them from its second release on)
_MLA_E31_FROM = max(MLA_FIRST_READ[f] for f in EAGLE31_FIELDS if f in MLA_FIRST_READ)

#: every kind and layout, in the order :func:`classify` tries them
LAYOUTS: tuple[Layout, ...] = (
    Layout(
        "peagle",
        KIND_PEAGLE,
        "parallel drafting (NeMo Automodel, speculators)",
        "`parallel_drafting: true`",
        (),
        None,
        f"no sglang release through {R.NEWEST_CHECKED} serves parallel drafting (sglang issue 23171): serve it "
        "with vLLM (>= 0.16), or train an EAGLE-3 draft",
    ),
    Layout(
        "speculators-eagle",
        KIND_EAGLE1,
        "speculators (EAGLE-1 / HASS)",
        "`speculators_model_type: eagle`, architectures `EagleSpeculator`",
        ("EAGLE",),
        None,
        "no sglang release has a model class for speculators' EAGLE-1 layout (fusion_fc, transformer.*): serve it "
        "with vLLM, or train an EAGLE-3 draft",
    ),
    Layout(
        "speculators-eagle3",
        KIND_EAGLE3,
        "speculators",
        "`speculators_model_type: eagle3` / `transformer_layer_config`, architectures `Eagle3DraftModel`",
        ("EAGLE3",),
        None,
        "serve it under eagle3-patches (as it is), or `eagle3-patches convert` it",
        convert=True,
        patched="speculators_draft_config",
        owner="draft-speculators-format",
    ),
    Layout(
        "dflash",
        KIND_DFLASH,
        "DFlash (z-lab, NVIDIA ModelOpt export)",
        "architectures `DFlashDraftModel` or a `dflash_config`",
        ("DFLASH",),
        R.rel(R.DFLASH_FROM),
        f"sglang >= {R.DFLASH_FROM} with --speculative-algorithm DFLASH",
    ),
    Layout(
        "kimi-eagle31-mla",
        KIND_EAGLE31,
        "MLA draft for Kimi-K2.x with EAGLE-3.1's norms (`kimi-k2.6-eagle3.1-mla`, `kimi-k2.7-coder-eagle3.1-mla`)",
        "architectures `Eagle3DeepseekV2ForCausalLM` setting `fc_norm` / `use_aux_norm` / `norm_output`",
        ("EAGLE3",),
        _MLA_E31_FROM,
        f"sglang >= {_v(_MLA_E31_FROM)} (its models/kimi_k25_eagle3.py reads the fields) with --speculative-algorithm "
        "EAGLE3",
        owner="draft-config-ignored",
        owned_from=R.rel(R.MLA_DRAFT_FROM),  # before, the class itself is missing
    ),
    Layout(
        "kimi-eagle3-mla",
        KIND_EAGLE3,
        "MLA draft for Kimi-K2.x (NVIDIA ModelOpt `kimik2` export)",
        "architectures `Eagle3DeepseekV2ForCausalLM`",
        ("EAGLE3",),
        R.rel(R.MLA_DRAFT_FROM),
        f"sglang >= {R.MLA_DRAFT_FROM} (models/kimi_k25_eagle3.py) with --speculative-algorithm EAGLE3",
    ),
    Layout(
        "automodel-eagle3",
        KIND_EAGLE3,
        "NeMo Automodel",
        "architectures `LlamaEagle3DraftModel` (`*Eagle3DraftModel`)",
        ("EAGLE3",),
        None,
        "`eagle3-patches convert SRC DST --aux-layer-ids I,J,K` (the layers its training captured) writes it as "
        "LlamaForCausalLMEagle3",
        convert=True,
    ),
    Layout(
        "automodel-eagle",
        KIND_EAGLE1,
        "NeMo Automodel",
        "architectures `LlamaEagleDraftModel` (`*EagleDraftModel`)",
        ("EAGLE",),
        None,
        'set "architectures": ["LlamaForCausalLMEagle"] in config.json and launch with --speculative-algorithm EAGLE',
    ),
    Layout(
        "mtp-nextn",
        KIND_MTP,
        "an exported NextN / MTP layer",
        "architectures `*NextN` / `*MTP` (e.g. `DeepseekV3ForCausalLMNextN`)",
        ("NEXTN", "EAGLE"),
        _OLDEST,
        "launch with --speculative-algorithm NEXTN",
    ),
    Layout(
        "sglang-eagle3-multilayer",
        KIND_MULTI,
        "SGLang, more than one decoder layer",
        "`LlamaForCausalLMEagle3` with `num_hidden_layers` > 1",
        ("EAGLE3",),
        R.rel(R.MULTI_LAYER_DRAFT_FROM),
        f"sglang >= {R.MULTI_LAYER_DRAFT_FROM} (earlier releases build one decoder layer and refuse more)",
        owner="draft-num-layers",
    ),
    Layout(
        "sglang-eagle31",
        KIND_EAGLE31,
        "SGLang with EAGLE-3.1's norms",
        "an SGLang EAGLE-3 config setting `fc_norm` / `use_aux_norm` / `norm_output`",
        ("EAGLE3",),
        _E31_FROM,
        f"sglang >= {_v(_E31_FROM)}, which reads the fields",
        owner="draft-config-ignored",
    ),
    Layout(
        "sglang-eagle3-layers0",
        KIND_EAGLE3,
        "SGLang config with `layers.0.*` names (NVIDIA ModelOpt / NeMo export)",
        "an SGLang EAGLE-3 config, tensors `layers.0.*` instead of `midlayer.*`",
        ("EAGLE3",),
        R.rel(R.LAYERS0_KEYS_FROM),
        f"serve it under eagle3-patches, or sglang >= {R.LAYERS0_KEYS_FROM}",
        patched="eagle3_draft_strict_loading",
        owner="keys-speculators-names",
    ),
    Layout(
        "sglang-eagle3",
        KIND_EAGLE3,
        "SGLang / SpecForge",
        "architectures `LlamaForCausalLMEagle3` (or `eagle_config.use_aux_hidden_state`), `midlayer.*`",
        ("EAGLE3",),
        _OLDEST,
        "launch with --speculative-algorithm EAGLE3",
    ),
    Layout(
        "eagle-repo-eagle3",
        KIND_EAGLE3,
        "original EAGLE repository (SafeAILab/EAGLE)",
        "a non-EAGLE architecture (`LlamaForCausalLM`) whose `fc.weight` takes 3 or more x hidden, `midlayer.*`",
        ("EAGLE3",),
        None,
        "sglang loads it as a plain LlamaForCausalLM: `eagle3-patches convert SRC DST --target T` (or "
        "--num-target-layers N) writes it as LlamaForCausalLMEagle3 with the aux ids the EAGLE repository feeds (the "
        "states before layers 2, n//2 and n-3 of an n-layer target); its weights as safetensors",
        convert=True,
    ),
    Layout(
        "eagle1-name-eagle3-fc",
        KIND_EAGLE3,
        "an EAGLE-1/2 class name on an EAGLE-3 draft",
        "architectures `*ForCausalLMEagle` whose `fc.weight` takes 3 or more x hidden",
        ("EAGLE3",),
        None,
        'set "architectures": ["LlamaForCausalLMEagle3"] in config.json (the EAGLE-1/2 class builds a 2 x hidden fc), '
        "or `eagle3-patches convert SRC DST` (with --aux-layer-ids where its config names none)",
        convert=True,
    ),
    Layout(
        "sglang-eagle",
        KIND_EAGLE1,
        "SGLang",
        "architectures `*ForCausalLMEagle` (e.g. `LlamaForCausalLMEagle`)",
        ("EAGLE",),
        _OLDEST,
        "launch with --speculative-algorithm EAGLE",
    ),
    Layout(
        "eagle-repo-eagle",
        KIND_EAGLE1,
        "original EAGLE repository (SafeAILab/EAGLE)",
        "a non-EAGLE architecture (`LlamaForCausalLM`) whose `fc.weight` takes 2 x hidden",
        ("EAGLE",),
        None,
        'set "architectures": ["LlamaForCausalLMEagle"] in config.json (as sglang\'s published EAGLE-1/2 copies do) '
        "and launch with --speculative-algorithm EAGLE",
    ),
    Layout(
        "mtp-builtin",
        KIND_MTP,
        "a target with built-in MTP layers",
        "`num_nextn_predict_layers` > 0 on a target architecture",
        ("NEXTN", "EAGLE"),
        _OLDEST,
        "launch with --speculative-algorithm NEXTN (sglang builds the draft from the target's own MTP layers)",
    ),
)
BY_KEY = {lay.key: lay for lay in LAYOUTS}


@dataclass(frozen=True)
class DraftKind:
    layout: Layout
    evidence: str  # what in the files says so (a checkpoint's strings, bounded)

    @property
    def kind(self) -> str:
        return self.layout.kind

    @property
    def is_eagle3(self) -> bool:
        return self.layout.kind in EAGLE3_KINDS

    def describe(self) -> str:
        return f"kind {self.kind}, layout {self.layout.name}"


@dataclass(frozen=True)
class Verdict:
    status: str  # SERVED / CONVERT / NOT_SERVED
    text: str
    fix: str | None = None


def verdict(layout: Layout, version, *, with_patches: bool = False) -> Verdict:
    """Whether sglang ``version`` serves a draft of ``layout`` as it is (under eagle3-patches when
    ``with_patches``), after ``eagle3-patches convert``, or not; with the release that serves it where one does."""
    algo = " or ".join(layout.algorithms)
    if layout.served_from is not None and R.facts(version).release >= layout.served_from:
        return Verdict(SERVED, f"served by sglang {version} (--speculative-algorithm {algo})")
    if layout.patched is not None and with_patches:
        return Verdict(SERVED, f"served under eagle3-patches on sglang {version} ({layout.patched})")
    first = (
        f"sglang {_v(layout.served_from)} is the first release that serves it as it is"
        if layout.served_from
        else f"no release through {R.NEWEST_CHECKED} serves it as it is"
    )
    if layout.convert:
        return Verdict(CONVERT, f"not served by sglang {version} as it is; {first}", layout.fix)
    return Verdict(NOT_SERVED, f"not served by sglang {version}; {first}", layout.fix)


# ---------------------------------------------------------------- classification
def _shown(value) -> str:
    return repr(value)[:80]  # a checkpoint's value: bounded (the report escapes it)


def _archs(config: Mapping) -> list[str]:
    a = config.get("architectures")
    return [x for x in a if isinstance(x, str)] if isinstance(a, list) else []


def _int(v) -> int | None:
    return v if type(v) is int and v > 0 else None


def _fc_width(tensors: Mapping[str, Sequence[int]]) -> int | None:
    for key in FC_NAMES:
        shape = tensors.get(key)
        if shape is not None and len(shape) == 2:
            return int(shape[1])
    return None


def _fc_states(config: Mapping, width: int | None) -> tuple[int, int] | None:
    """(number of hidden states fc takes, the hidden size it is a multiple of), from ``fc.weight``'s in-width."""
    if not width:
        return None
    for hidden in (_int(config.get("target_hidden_size")), _int(config.get("hidden_size"))):
        if hidden and width % hidden == 0:
            return width // hidden, hidden
    return None


def _flag(config: Mapping, name: str) -> bool:
    ec = config.get("eagle_config")
    return config.get(name) is True or (isinstance(ec, Mapping) and ec.get(name) is True)


def classify(config: Mapping, tensors: Mapping[str, Sequence[int]] | None = None) -> DraftKind | None:
    """The kind and layout of the draft whose ``config.json`` is ``config`` and whose tensors (name -> shape, from
    the safetensors headers; may be empty or only ``fc.weight``) are ``tensors``; None when it is no draft this
    table knows (a target model without MTP layers, for one).

    The kind is decided from the config and ``fc.weight``'s shape alone (what the algorithm guard reads); the
    tensor names only tell two layouts of one kind apart (``layers.0.*`` against ``midlayer.*``)."""
    tensors = tensors or {}
    archs = _archs(config)
    first = _shown(archs)

    def found(key: str, why: str) -> DraftKind:
        return DraftKind(BY_KEY[key], why)

    if config.get("parallel_drafting") is True:
        return found("peagle", "config.json: parallel_drafting true")
    spec_type = config.get("speculators_model_type")
    if spec_type == "eagle" or "EagleSpeculator" in archs:
        return found(
            "speculators-eagle", f"config.json: speculators_model_type {_shown(spec_type)}, architectures {first}"
        )
    if (
        spec_type is not None
        or isinstance(config.get("transformer_layer_config"), Mapping)
        or ({"Eagle3DraftModel", "Eagle3Speculator"} & set(archs))
    ):
        if spec_type not in (None, "eagle3"):
            return None  # a speculators model type this table does not know
        return found("speculators-eagle3", f"config.json: speculators format, architectures {first}")
    if isinstance(config.get("dflash_config"), Mapping) or any(a.startswith("DFlash") for a in archs):
        return found("dflash", f"config.json: architectures {first}, dflash_config")
    if MLA_DRAFT_ARCH in archs:
        set31 = [f for f in EAGLE31_FIELDS if _flag(config, f)]
        if set31:
            return found("kimi-eagle31-mla", f"config.json: architectures {first}, {', '.join(set31)} true")
        return found("kimi-eagle3-mla", f"config.json: architectures {first}")
    if any(re.fullmatch(r"\w+Eagle3DraftModel", a) for a in archs):
        return found("automodel-eagle3", f"config.json: architectures {first}")
    if any(re.fullmatch(r"\w+EagleDraftModel", a) for a in archs):
        return found("automodel-eagle", f"config.json: architectures {first}")
    if any(a.endswith(("NextN", "MTP")) for a in archs):
        return found("mtp-nextn", f"config.json: architectures {first}")
    if detect_format(dict(config)) == SGLANG_EAGLE3:
        why = f"config.json: SGLang EAGLE-3 format, architectures {first}"
        layers = _int(config.get("num_hidden_layers"))
        if layers is not None and layers > 1:
            return found("sglang-eagle3-multilayer", f"{why}, num_hidden_layers {layers}")
        set31 = [f for f in EAGLE31_FIELDS if _flag(config, f)]
        if set31:
            return found("sglang-eagle31", f"{why}, {', '.join(set31)} true")
        if any(re.match(r"^(model\.)?layers\.0\.", n) for n in tensors):
            return found("sglang-eagle3-layers0", f"{why}, tensors named layers.0.*")
        return found("sglang-eagle3", why)
    width = _fc_width(tensors)
    states = _fc_states(config, width)
    named_eagle = any("eagle" in a.lower() for a in archs)
    if states is not None and states[0] >= MIN_AUX_STATES:
        why = f"fc.weight takes {width} = {states[0]} x hidden ({states[1]}) inputs"
        return found("eagle1-name-eagle3-fc" if named_eagle else "eagle-repo-eagle3", why)
    if named_eagle:
        return found("sglang-eagle", f"config.json: architectures {first}")
    if states is not None and states[0] == 2:
        return found("eagle-repo-eagle", f"architectures {first}, fc.weight takes {width} = 2 x hidden inputs")
    nextn = _int(config.get("num_nextn_predict_layers"))
    if nextn is not None:
        return found("mtp-builtin", f"config.json: architectures {first}, num_nextn_predict_layers {nextn}")
    return None


# ---------------------------------------------------------------- the table, for docs/checkpoints.md
def layouts_table() -> str:
    """The markdown table of every kind and layout by release (generated into docs/checkpoints.md)."""
    pinned, newest = str(R.PINNED), str(R.NEWEST_CHECKED)
    rows = [
        f"| kind | layout | detected by | sglang {pinned} | sglang {newest} | first release serving it as it is "
        "| under eagle3-patches | how to serve it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lay in LAYOUTS:
        cells = []
        for v in (pinned, newest):
            s = verdict(lay, v).status
            cells.append({SERVED: "served", CONVERT: "after convert", NOT_SERVED: "not served"}[s])
        under = f"served (`{lay.patched}`)" if lay.patched else "as stock"
        algo = " / ".join(lay.algorithms) or "-"
        first = f"{_v(lay.served_from)}" if lay.served_from else "none"
        fix = lay.fix.replace("|", "\\|")
        rows.append(
            f"| {lay.kind} | {lay.name} | {lay.detected_by} | {cells[0]} | {cells[1]} | {first} ({algo}) | {under} "
            f"| {fix} |"
        )
    return "\n".join(rows)
