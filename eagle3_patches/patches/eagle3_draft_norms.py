"""eagle3_draft_norms

Bug: sglang's ``LlamaForCausalLMEagle3`` before 0.5.17 lacks the draft norms that EAGLE-3.1-style drafts are
trained with: 0.5.9-0.5.11 read none of ``fc_norm`` (or its older name ``use_aux_norm``: an RMSNorm on each aux
state before ``fc``, weights ``fc_norm.<i>.weight``), ``norm_output`` (the final norm applied to the hidden state
the draft hands to its next step) and ``norm_before_fc`` (top level or in ``eagle_config``: one RMSNorm over the
concatenated aux states before ``fc``, weight ``input_norm.weight``); 0.5.12-0.5.16 read the first two, not
``norm_before_fc``.  The draft loads and is served without those norms.

What users see: a healthy server whose accept length is well below what the draft's training promised; with
``eagle3_draft_config_fields`` and ``eagle3_draft_strict_loading`` alone, the launch is refused at start instead
(the field is ignored; ``input_norm.weight`` / ``fc_norm.<i>.weight`` have no parameter).

What the patch changes: it adds to the draft's ``LlamaModel`` what sglang 0.5.23 has for each field the installed
release's ``llama_eagle3.py`` does not read (``eagle3_patches/checkpoint/draft_fields.py`` parses it): the same
modules under the same names (``input_norm``, ``fc_norm.<i>``, built from the same config fields, so the same
checkpoint loads), applied in the same order (``input_norm`` over the concatenated states, then ``fc_norm`` per
aux state, then ``fc``, only when ``fc`` runs), and with ``norm_output`` the normed hidden state handed on.  Built
in ``LlamaModel.__init__`` after sglang's own; in ``forward`` the normed states replace
``forward_batch.spec_info.hidden_states`` for the call (restored after it), and the output is swapped for
``norm_output``.  Where it adds ``fc_norm``, ``load_weights`` maps the older weight names ``aux_norm_low`` /
``aux_norm_mid`` / ``aux_norm_high`` onto ``fc_norm.0`` / ``.1`` / ``.2``, as sglang 0.5.12 does.  With the patch
active, ``eagle3_draft_config_fields`` and the doctor count these fields as read (the patch's
``backports_draft_fields``) and the strict loader and the doctor expect their weights; ``norm_before_residual``,
which no release reads, is still refused.  A draft that sets none of the fields runs exactly as on stock.

Cost: for a draft that sets them, the norms it was trained with (two RMSNorms over the aux states per draft
prefill or extend step); none otherwise.

Releases: 0.5.8 up to 0.5.16 (each part on the releases before the first that reads its field, as observed from
the released wheels in ``FIRST_READ``: ``fc_norm`` / ``use_aux_norm`` / ``norm_output`` below 0.5.12,
``norm_before_fc`` below 0.5.17).

Upstream probe: the installed ``llama_eagle3.py`` reads every field the patch backports (0.5.17 and later).

Tests: ``tests/patches/test_eagle3_draft_norms.py``: a tiny EAGLE-3.1-style draft (``fc_norm``, ``norm_output``,
``norm_before_fc`` with non-trivial ``input_norm`` / ``fc_norm`` weights, and one with the older ``aux_norm_*``
weight names) loaded into real draft ``ModelRunner`` objects with the strict loader on, fed the same prefill: the
``fc`` output, the midlayer's output, the hidden state handed on and the logits on 0.5.9 with the patch equal
sglang 0.5.23's stock outputs (computed in the 0.5.23 environment when it exists); on stock 0.5.9 they differ.
``tests/patches/test_eagle3_draft_config_fields.py`` and ``tests/checkpoint/test_doctor_fields.py``: the fields
are accepted with the patch and refused without it; ``norm_before_residual`` is refused either way.

Not verified on CPU: the draft-extend CUDA graph captures the normed states through the swapped
``spec_info.hidden_states`` (the same tensors reach ``fc`` eagerly, as the tests show).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet

from ..checkpoint import draft_fields as F
from ..checkpoint.formats import SGLANG_EAGLE3
from ..checkpoint.releases import NEWEST_CHECKED
from ..diagnostic import Diagnostics
from ..registry import Patch, Saver, expect_attr, expect_source, source_of
from .eagle3_draft_config_fields import ignored_fields, release_reads, setup_module

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

NAME = "eagle3_draft_norms"
#: the read names (as :mod:`~eagle3_patches.checkpoint.draft_fields` spells them) this patch makes the draft read,
#: each on the releases before :data:`~eagle3_patches.checkpoint.draft_fields.FIRST_READ` says sglang reads it
BACKPORTED = ("fc_norm", "use_aux_norm", "norm_output", "norm_before_fc", "eagle_config.norm_before_fc")
#: what the patch adds to the draft's ``LlamaModel`` (sglang 0.5.23's attribute) for each field it backports
PARTS = {
    "norm_before_fc": "input_norm",
    "eagle_config.norm_before_fc": "input_norm",
    "fc_norm": "fc_norm",
    "use_aux_norm": "fc_norm",
    "norm_output": "norm_output",
}
#: older checkpoint names of ``fc_norm``'s weights, mapped as sglang 0.5.12's ``LlamaForCausalLMEagle3.load_weights``
#: maps them (its ``legacy_name_map``)
LEGACY_FC_NORM_NAMES = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}
#: the parts a draft ``LlamaModel`` built under the patch carries (the instance attribute holding them)
_ADDED = "_eagle3_backported_norms"
_FIRST_NATIVE = max(F.FIRST_READ[n] for n in BACKPORTED)


def parts_for(missing: set[str] | frozenset[str]) -> frozenset[str]:
    """The parts (``input_norm``, ``fc_norm``, ``norm_output``) that add the read names ``missing``."""
    return frozenset(PARTS[n] for n in missing if n in PARTS)


def add_norms(model: Any, parts: frozenset[str], rms_norm: Any, module_list: Any) -> None:
    """What sglang 0.5.23's ``LlamaModel.__init__`` builds for ``parts`` from the draft's config."""
    config = model.config
    width = model.hidden_size_in
    num_aux = getattr(model, "num_aux_hidden_states", None) or model.fc.in_features // width
    if "input_norm" in parts:
        eagle_config = getattr(config, "eagle_config", None) or {}
        model.norm_before_fc = bool(eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False)))
        model.input_norm = rms_norm(width * num_aux, eps=config.rms_norm_eps) if model.norm_before_fc else None
    if "fc_norm" in parts:
        use_fc_norm = getattr(config, "fc_norm", None) or getattr(config, "use_aux_norm", False)
        model.fc_norm = (
            module_list([rms_norm(width, eps=config.rms_norm_eps) for _ in range(num_aux)]) if use_fc_norm else None
        )
    if "norm_output" in parts:
        model.norm_output = getattr(config, "norm_output", False)
    setattr(model, _ADDED, parts)


def fc_input(model: Any, parts: frozenset[str], hidden_states: Any) -> Any:
    """The states ``fc`` receives: ``input_norm`` over the whole, then ``fc_norm`` per aux state (0.5.23's order);
    a part sglang has natively is left to sglang."""
    import torch

    if "input_norm" in parts and model.input_norm is not None:
        hidden_states = model.input_norm(hidden_states)
    if "fc_norm" in parts and model.fc_norm is not None:
        chunks = hidden_states.chunk(len(model.fc_norm), dim=-1)
        hidden_states = torch.cat([norm(chunk) for norm, chunk in zip(model.fc_norm, chunks)], dim=-1)
    return hidden_states


def _init(wrapped, instance, args, kwargs, *, parts: frozenset[str], rms_norm: Any, module_list: Any):
    wrapped(*args, **kwargs)
    add_norms(instance, parts, rms_norm, module_list)


def _forward(wrapped, instance, args, kwargs):
    parts: frozenset[str] = getattr(instance, _ADDED, frozenset())
    # pragma: no mutate core/ReplaceAndWithOr `input_norm" in parts or instance.input_norm`: `input_norm` is a part the
    # patch adds on every release of its range (below 0.5.17): the mutant also swaps the states of a draft without the
    # norm, and with no norm `fc_input` returns the same tensor (as for `fc_norm` above)
    normed = ("input_norm" in parts and instance.input_norm is not None) or (
        # pragma: no mutate core/ReplaceAndWithOr: where `fc_norm` is not a part the patch adds (0.5.12 - 0.5.16),
        # sglang's own `__init__` sets `fc_norm` (read from 0.5.23's source): `normed` only decides whether the states
        # are swapped, and with no norm added `fc_input` returns the same tensor
        "fc_norm" in parts and instance.fc_norm is not None
    )
    spec: Any = (args[2] if len(args) > 2 else kwargs["forward_batch"]).spec_info if normed else None
    states = getattr(spec, "hidden_states", None)
    # fc runs on the target's states, which are wider than the draft's own (sglang's condition: != embeds' width)
    if states is not None and states.shape[-1] != instance.config.hidden_size:
        spec.hidden_states = fc_input(instance, parts, states)
        try:
            out = wrapped(*args, **kwargs)
        finally:
            spec.hidden_states = states
    else:
        out = wrapped(*args, **kwargs)
    if "norm_output" in parts and instance.norm_output:
        to_logits, _ = out
        return to_logits, [to_logits]  # the normed state handed on, as 0.5.23 hands it with norm_output
    return out


def legacy_name(name: str) -> str:
    for legacy, new in LEGACY_FC_NORM_NAMES.items():
        if legacy in name:
            name = name.replace(legacy, new)
    return name


def _load_weights(wrapped, instance, args, kwargs):
    # pragma: no mutate core/NumberReplacer `-1`: `load_weights` takes one argument (`weights`): in a positional call
    # `args` has one element, `args[-1]` is `args[0]`
    weights = args[0] if args else kwargs.pop("weights")
    # pragma: no mutate core/NumberReplacer `2`: `load_weights` takes one argument: `args[1:]` and `args[2:]` are both
    # empty
    return wrapped(((legacy_name(n), t) for n, t in weights), *args[1:], **kwargs)


class Eagle3DraftNorms(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 65  # after the strict loader and the fc guard, whose fork-path diffs edit the same file first
    summary = f"EAGLE-3.1 draft norms (fc_norm, norm_output, norm_before_fc) backported from sglang {NEWEST_CHECKED}"
    module = "sglang.srt.models.llama_eagle3"
    applies_to = SpecifierSet(f">=0.5.8,<{'.'.join(map(str, _FIRST_NATIVE))}")
    #: the draft config fields (read names) a draft reads with this patch on a release it covers
    backports_draft_fields = frozenset(BACKPORTED)

    def missing(self, module: ModuleType) -> frozenset[str]:
        """The backported read names the installed ``llama_eagle3.py`` does not read itself."""
        return frozenset(BACKPORTED) - F.fields_read(source_of(module))

    def upstream(self, module: ModuleType) -> str | None:
        try:
            missing = self.missing(module)
        except (OSError, TypeError, SyntaxError):
            return None
        return None if missing else f"{module.__name__} reads {', '.join(BACKPORTED)} itself"

    def check(self, module: ModuleType) -> None:
        model = expect_attr(module, "LlamaModel")
        expect_source(expect_attr(model, "__init__"), "self.hidden_size_in", "self.fc = ", "rms_norm_eps")
        expect_source(expect_attr(model, "forward"), "spec_info.hidden_states", "self.fc(hidden_states)")
        expect_attr(module, "RMSNorm")
        expect_attr(module.LlamaForCausalLMEagle3, "load_weights")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        from torch import nn

        parts = parts_for(self.missing(module))
        model = module.LlamaModel
        init = functools.partial(_init, parts=parts, rms_norm=module.RMSNorm, module_list=nn.ModuleList)
        saver.wrap(model, "__init__", init)
        saver.wrap(model, "forward", _forward)
        if "fc_norm" in parts:
            saver.wrap(module.LlamaForCausalLMEagle3, "load_weights", _load_weights)

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        """The backported fields a draft sets that the release never reads (``draft-config-ignored``): served
        without them on stock; read with the patch.  Where the launch runs under eagle3-patches with this patch
        switched off, ``eagle3_draft_config_fields`` reports them (refused at start)."""
        dv = setup.draft
        if setup.checkpoint_only or dv is None or dv.format != SGLANG_EAGLE3 or not self.covers(setup.version):
            return Diagnostics()
        if setup.with_patches and not setup.patched(self.name):
            return Diagnostics()
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: every other draft module (the MLA draft's,
        # kimi_k25_eagle3.py) sorts before the Llama draft's (tests/unit/test_draft_fields.py holds it)
        if setup_module(setup) != F.DRAFT_MODULE:
            # the norms are added to LlamaForCausalLMEagle3 only: eagle3_draft_config_fields judges the MLA draft
            return Diagnostics()
        read, source = release_reads(setup)
        return ignored_fields(
            dv.config, read, version=setup.version, source=source, config_path=setup.dcfg(), among=BACKPORTED
        )


PATCH = Eagle3DraftNorms()
