"""speculators_draft_config

Bug: many public EAGLE-3 drafts are saved by ``speculators`` (vllm-project): ``config.json`` has no ``model_type``,
only ``speculators_model_type: "eagle3"`` (architectures ``Eagle3DraftModel``), the llama fields inside
``transformer_layer_config``, the aux ids in speculators' meaning (HF ``hidden_states[N]``), ``layers.0.*``
tensors.  sglang reads a draft's config with transformers' ``AutoConfig``, which cannot read this one, so
``--speculative-draft-model-path`` cannot point at such a draft.  vLLM reads these drafts as they are (a config
adapter, ``vllm/transformers_utils/configs/speculators/``); with sglang, a user had to run ``eagle3-patches
convert`` and keep a second copy of the draft.

What users see: ``ValueError: Unrecognized model in DRAFT. Should have a model_type key in its config.json`` when
the draft's config is read (from 0.5.12 already in the launcher), or, when the directory's name happens to contain a
model type (``.../Llama-3.1-8B-eagle3``), transformers guesses that model type and sglang fails later on an
architecture it does not know (``Eagle3DraftModel``).

What the patch changes: the seam is the one call every release makes to read a model's config:
``AutoConfig.from_pretrained`` in sglang's config reader (``get_config`` in ``utils/hf_transformers_utils.py`` up
to 0.5.11; the HF parser of ``utils/hf_transformers/config.py`` from 0.5.12, behind the ``hf_transformers_utils``
shim).  The reader module gets an ``AutoConfig`` subclass whose ``from_pretrained``, for a local directory whose
``config.json`` is in speculators format, returns in memory the config ``eagle3-patches convert`` would write
(``LlamaForCausalLMEagle3``, the llama fields of ``transformer_layer_config``, ``rope_theta`` / ``rope_scaling``
from ``rope_parameters``, ``dtype``, ``draft_vocab_size``, ``target_hidden_size`` from ``fc.weight`` when null),
built by the converter's own code, not a copy (``eagle3_patches/checkpoint/conversion_plan.py``: ``plan_conversion``,
``build_config``), with the aux ids (``eagle_config``) in the running release's convention (sglang <= 0.5.12:
output of layer, ``N - 1``; from 0.5.13: speculators' ids as they are), the convention recorded as the converter
records it.
``config.json`` is read through the safe open; the draft's ``config.py`` (named by ``auto_map``) is never executed,
whatever ``--trust-remote-code`` says.  Every other model, and every draft in SGLang format, goes to transformers
untouched; everything sglang does after reading a config (its own post-processing, ``--json-model-override-args``,
its cache) runs unchanged on it.

The tensors need nothing more: ``layers.0.*`` reaches ``midlayer`` through ``eagle3_draft_strict_loading``
(0.5.8 - 0.5.11; without it the patch refuses to serve a speculators draft there rather than serve it with a random
midlayer) or natively (0.5.12+); ``d2t``, ``t2d`` and ``embed_tokens.weight`` keep their names and bytes, as in a
converted draft.  The EAGLE-3.1 draft norms (``norm_before_fc``, ``fc_norm``, ``norm_output``) are carried into that
config where the running release reads them (its own ``llama_eagle3.py``, parsed) or an active patch backports them
(``eagle3_draft_norms``), their weights keeping the names speculators and sglang share (``input_norm.weight``,
``fc_norm.<i>.weight``).  A draft the converter's rules refuse for this release (such a norm the release does not
read, named with the first release that does; ``norm_before_residual`` true or missing, which no release reads; a
norm weight without its option; a non-llama decoder layer; unknown or missing tensors) is refused with the
converter's message where the config is read: in every rank's target ``ModelRunner.__init__`` before it loads any
weight, and from 0.5.12 already in the launcher (``ServerArgs``).

Releases: 0.5.8 and later (no release checked reads the format; 0.5.12 loads ``layers.0.*`` natively, but
the config still cannot be read).  Not in the fork series: it reuses the converter, which a forked sglang without
this library does not have; a fork build serves converted drafts (docs/checkpoints.md).  Local directories only: a
hub id is left to sglang (0.5.12+ resolves it to a local snapshot before reading the config; on 0.5.9 download the
draft first).

Upstream probe: sglang's config reader module names ``speculators_model_type``.

Tests: ``tests/patches/test_speculators_draft_config.py``, ``tests/e2e/test_server.py``, on the trained tiny draft
as the real ``speculators`` 0.9.0 wrote it (``tools/make_speculators_fixture.py``, next to a tripwire
``config.py``, ``trust_remote_code`` on): stock sglang's ``ModelConfig`` cannot read it (asserted); patched, the
config sglang builds equals the converted draft's field for field (the ids in the release's convention), the
tripwire never fires, SGLang-format drafts read exactly as stock reads them, a draft norm is carried where the
release (or, with ``eagle3_draft_norms``, the backport) reads it and refused naming the first release where not, the
refusals carry the converter's very message and stop the target's ``ModelRunner`` in ``__init__`` without
``load_model`` (and, from 0.5.12, ``ServerArgs`` in the launcher), and on 0.5.9 without the strict loader the draft is
refused.  The real
draft ``ModelRunner`` loads the direct and the converted draft into the same parameters bit for bit (equal to the
file's tensors), and the real target captures the outputs of layers 1, 2, 3 for both.  Through the real server: the
direct and the converted draft give the same greedy outputs (equal to the server without speculation) and the same
accept length, request by request.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet

from ..checkpoint import layer_ids as L
from ..checkpoint.conversion_plan import served_sglang_config
from ..checkpoint.formats import SPECULATORS
from ..checkpoint.layer_ids import CONVENTION_KEY
from ..checkpoint.releases import facts
from ..diagnostic import ERROR, INFO, Diagnostic, Diagnostics
from ..errors import Eagle3ConfigError
from ..registry import (
    NotApplicable,
    Patch,
    Saver,
    State,
    expect_source,
    in_source,
    source_of,
)
from ..sglang_version import installed_sglang_version
from . import get_registry
from .eagle3_draft_config_fields import installed_reads

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

NAME = "speculators_draft_config"
STRICT_LOADING = "eagle3_draft_strict_loading"
#: ``from_pretrained`` arguments that make transformers read another file than ``config.json``, or return more
_NOT_CONFIG_JSON = ("_configuration_file", "gguf_file", "subfolder", "return_unused_kwargs")
_logged: set[str] = set()


def reader_module(module: ModuleType) -> ModuleType:
    """The module whose ``AutoConfig`` sglang's ``get_config`` calls: ``hf_transformers_utils`` itself up to
    0.5.11, ``hf_transformers.config`` (behind the shim) from 0.5.12."""
    get_config = vars(module).get("get_config")
    if get_config is None:
        raise NotApplicable(f"{module.__name__} has no get_config")
    owner = sys.modules.get(getattr(inspect.unwrap(get_config), "__module__", ""), None)
    if owner is None or not isinstance(vars(owner).get("AutoConfig"), type):
        raise NotApplicable(f"{getattr(owner, '__name__', '?')} (where get_config lives) has no AutoConfig")
    return owner


def _needs_strict_loading(version) -> str | None:
    """Why this release cannot load the draft's ``layers.0.*`` tensors in this process, or None."""
    # pragma: no mutate core/ReplaceOrWithAnd: on sglang 0.5.9 `loads_layers0_keys` is false, so both go on to ask
    # whether `eagle3_draft_strict_loading` is active; on 0.5.12 and later the mutant refuses the draft (the strict
    # loader is not-applicable there), which
    # `tests/patches/test_speculators_draft_config.py::test_patched_reads_the_speculators_config_as_the_converted_one`
    # sees, as the matrix runs it
    if version is None or facts(version).loads_layers0_keys:
        return None
    import importlib.util

    registry = get_registry()
    state = registry.status()[STRICT_LOADING].state
    if state in (State.APPLIED, State.PENDING, State.IN_SOURCE):
        return None
    spec = importlib.util.find_spec(registry[STRICT_LOADING].module)
    if spec is not None and in_source(spec.origin, STRICT_LOADING):
        return None  # a fork build: the mapping is in sglang's source
    return (
        f"sglang {version} drops speculators' layers.0.* tensors (the whole midlayer) and {STRICT_LOADING}, "
        f"which maps them onto midlayer.*, is {state.value} in this process"
    )


def sglang_config_for(path, kwargs: dict) -> dict | None:
    """The SGLang-format config dict to hand sglang for ``AutoConfig.from_pretrained(path, **kwargs)``, or None
    (not a local speculators draft: transformers reads it as always).  Raises :class:`Eagle3ConfigError`."""
    if not isinstance(path, (str, os.PathLike)) or any(k in kwargs for k in _NOT_CONFIG_JSON):
        return None

    version = installed_sglang_version()
    config = served_sglang_config(path, str(version) if version is not None else None, installed_reads())
    if config is None:
        return None
    why = _needs_strict_loading(version)
    if why:
        raise Eagle3ConfigError(
            "this speculators-format draft cannot be served directly here: its decoder layer would stay at random init",
            where=str(path),
            found=why,
            fix=f"enable {STRICT_LOADING} (remove it from EAGLE3_PATCHES_DISABLE), or convert the draft once with "
            f"`eagle3-patches convert {path} {os.fspath(path).rstrip('/')}-sglang` and serve that",
        )
    key = os.path.realpath(path)
    if key not in _logged:
        _logged.add(key)
        ec = config["eagle_config"]
        src = config["eagle3_patches_converted_from"]
        logger.info(
            "eagle3-patches: %s is a speculators-format EAGLE-3 draft; sglang %s reads it as the equivalent "
            "LlamaForCausalLMEagle3 config (aux ids %s in speculators' meaning -> %s, %s)",
            path,
            version,
            src["eagle_aux_hidden_state_layer_ids"],
            ec["eagle_aux_hidden_state_layer_ids"],
            ec[CONVENTION_KEY],
        )
    return config


def _speculators_aware(original: Any) -> type:
    """A subclass of sglang's ``AutoConfig`` whose ``from_pretrained`` reads speculators drafts as SGLang ones."""

    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        config = None if args else sglang_config_for(pretrained_model_name_or_path, kwargs)
        if config is None:
            return original.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        # what AutoConfig.from_pretrained does with the converted draft's config.json: the class of its
        # model_type, from_dict, the path as name_or_path
        return CONFIG_MAPPING[config["model_type"]].from_dict(
            config, name_or_path=os.fspath(pretrained_model_name_or_path)
        )

    return type(
        original.__name__,
        (original,),
        {
            "from_pretrained": classmethod(from_pretrained),
            "__doc__": f"{original.__doc__ or ''}\n\neagle3-patches ({NAME}): speculators-format EAGLE-3 drafts are "
            "read "
            "as the equivalent LlamaForCausalLMEagle3 config.",
            "__module__": __name__,
        },
    )


class SpeculatorsDraftConfig(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 45  # before the strict loader, which loads this config's draft
    summary = (
        "a speculators-format draft (speculators_model_type: eagle3) is served as it is, as vLLM serves it: no"
        " conversion"
    )
    module = "sglang.srt.utils.hf_transformers_utils"
    applies_to = SpecifierSet(">=0.5.8")
    #: the change reuses the converter (eagle3_patches.checkpoint.conversion_plan), which a forked sglang without
    #: this library does not have: a fork build serves converted drafts (docs/checkpoints.md)
    in_fork_series = False
    remedy = "fixed"

    def upstream(self, module: ModuleType) -> str | None:
        reader = reader_module(module)  # NotApplicable where there is no reader: the registry reports it
        try:
            source = source_of(reader)
        except (OSError, TypeError):
            return None
        if "speculators_model_type" in source:
            return f"{reader.__name__} reads speculators_model_type itself"
        return None

    def check(self, module: ModuleType) -> None:
        reader = reader_module(module)
        expect_source(reader, "AutoConfig.from_pretrained(")  # where sglang reads a model's config
        if not hasattr(vars(reader)["AutoConfig"], "from_pretrained"):
            raise NotApplicable(f"{reader.__name__}.AutoConfig has no from_pretrained")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        reader = reader_module(module)
        saver.set(reader, "AutoConfig", _speculators_aware(vars(reader)["AutoConfig"]))

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        """A speculators-format draft: stock sglang cannot read its config (and, before 0.5.12, drops its
        ``layers.0.*`` tensors)."""
        out = Diagnostics()
        dv = setup.draft
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: every other format the reader gives (`eagle`,
        # `model`, `sglang-eagle3`: `checkpoint/formats.py`) sorts before `speculators`, so `<` is `!=` on every value
        # `dv.format` takes
        if dv is None or dv.format != SPECULATORS:
            return out
        out.add(
            ERROR,
            "draft-speculators-format",
            "the draft is in speculators format: stock sglang cannot read its config (no model_type, only "
            "speculators_model_type), its ids mean HF hidden_states[N] (one layer later than sglang's), and its "
            "layers.0.* keys are dropped silently by sglang < 0.5.12",
            where=setup.dcfg("speculators_model_type"),
            found=f"architectures {dv.architectures}",
            expected='architectures ["LlamaForCausalLMEagle3"], eagle_config, midlayer.* keys',
            fix="serve it under eagle3-patches (`eagle3-patches run`, or the sglang plugin from 0.5.11), which reads "
            "it "
            f"as it is ({NAME}); or convert it once: eagle3-patches convert {setup.draft_dir} {setup.draft_dir}-sglang",
        )
        return out

    def when_patched(self, d: Diagnostic, setup: PatchSetup) -> Diagnostic:
        if not (setup.rf.loads_layers0_keys or setup.patched(STRICT_LOADING)):
            return d.replace(
                what=f"{d.what} - {NAME} reads the config, but {STRICT_LOADING} (which maps layers.0.* onto "
                f"midlayer.* on sglang {setup.version}) is not active: the launch is refused at start",
                fix=f"enable {STRICT_LOADING}, or convert the draft",
            )
        dv = setup.draft_view
        ids = ""
        if dv.aux_ids:
            outputs = L.to_output_of_layer(dv.aux_ids, L.INPUT_OF_LAYER)
            ids = (
                f"; aux ids {dv.aux_ids} (speculators' meaning) are handed to sglang {setup.version} as "
                f"{L.from_output_of_layer(outputs, L.release_convention(setup.version))} (the outputs of layers "
                f"{outputs})"
            )
        return d.replace(
            severity=INFO,
            what=f"the draft is in speculators format; eagle3-patches ({NAME}) serves it as it is: sglang reads the "
            f"equivalent LlamaForCausalLMEagle3 config, as `eagle3-patches convert` would write it{ids}",
            found="",
            expected="",
            fix="",
        )


PATCH = SpeculatorsDraftConfig()
