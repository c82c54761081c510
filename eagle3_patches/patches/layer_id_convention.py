"""layer_id_convention

Bug: from sglang 0.5.13 the meaning of ``eagle_config.eagle_aux_hidden_state_layer_ids`` depends on the first id:
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` adds 1 only when the first id is 1, otherwise it uses the
ids as they are.  Before 0.5.13 it always added 1.  So one draft config, e.g. ``[2, 30, 58]`` (Kimi-K2.5's
SpecForge drafters), captures the outputs of layers 2, 30, 58 on 0.5.12 and of layers 1, 29, 57 on 0.5.13.

What users see: nothing: the draft silently gets the wrong layers, and only a lower accept length shows it.

What the patch changes: this library has one convention (``eagle3_patches.checkpoint.layer_ids``): id ``i`` is the
**output of target layer i** (``output-of-layer``, sglang <= 0.5.12's meaning).  ``eagle3-patches convert``
records it in the draft config it writes, under ``eagle_config.eagle3_patches_layer_id_convention``.  The patch
wraps ``set_eagle3_layers_to_capture``: after sglang's own code ran, when the draft config records a convention
(or ``EAGLE3_PATCHES_LAYER_ID_CONVENTION`` names one) it sets ``layers_to_capture`` to what that convention means,
whatever the first id:

* ``output-of-layer``: ``[i + 1 for i in ids]`` (capture before layer i + 1 = the output of layer i);
* ``input-of-layer`` (speculators / vLLM): ``ids`` as they are.

A draft config that records no convention keeps sglang's rule (a draft made for 0.5.13 or later may rely on it)
and gets one warning when the ids mean different layers on sglang <= 0.5.12 and on this release.  The default
no-argument call (sglang's ``[2, n // 2, n - 3]``) is never changed.  ``eagle3-patches doctor`` says which layers
a config captures on a given release.

Releases: 0.5.13 and later (the rule is unchanged in every release checked since).

Upstream probe: none (the patch's check requires the first-id rule; another body is not-applicable).

Tests: ``tests/patches/test_layer_id_convention.py``, in the release matrix: on 0.5.13 the same config
``[2, 3, 4]`` on the tiny 6-layer target captures the outputs of layers 2, 3, 4 patched (as on 0.5.12) and 1, 2,
3 reverted, compared against forward hooks on the real decoder layers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from .. import settings
from ..checkpoint import layer_ids as L
from ..checkpoint.conversion_plan import served_sglang_config
from ..checkpoint.formats import SPECULATORS, detect_format, read_json
from ..checkpoint.layer_ids import (
    CONVENTION_KEY,
    CONVENTIONS,
    INPUT_OF_LAYER,
    OUTPUT_OF_LAYER,
)
from ..diagnostic import ERROR, WARNING, Diagnostic, Diagnostics
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr, expect_source
from ..sglang_runtime import server_arg
from ..sglang_version import installed_sglang_version
from .eagle3_draft_config_fields import installed_reads

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

NAME = "layer_id_convention"
SETTER = "set_eagle3_layers_to_capture"
#: environment override for draft configs that record no convention
ENV = settings.LAYER_ID_CONVENTION
_warned: set[tuple] = set()


def capture_points_for(ids, convention: str) -> list[int]:
    """sglang's ``layers_to_capture`` (capture before these layers) for ``ids`` in ``convention``."""
    if convention == OUTPUT_OF_LAYER:
        return [int(i) + 1 for i in ids]
    if convention == INPUT_OF_LAYER:
        return [int(i) for i in ids]
    raise ValueError(f"unknown layer-id convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def _read_draft_config(path: str | None) -> dict | None:
    """The served draft's config (None when it cannot be read: nothing recorded).  A hub id: the local cache
    only, never the network; a speculators-format draft: the config sglang was handed for it."""
    if not path:
        return None
    candidate = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - no hub library, or an id it refuses: unknown convention
            return None
        if not isinstance(cached, str):  # not in the cache
            return None
        candidate = cached
    try:  # bounded, and no link followed out of the checkpoint (or the hub cache's blobs/)
        config = read_json(Path(candidate), "the draft's config.json")
    except (OSError, ValueError):  # CheckpointError is a ValueError
        return None
    if not isinstance(config, dict):
        return None
    if detect_format(config) == SPECULATORS:
        # served directly (speculators_draft_config): sglang got the converter's config, whose ids and
        # recorded convention are the ones to read

        return served_sglang_config(os.path.dirname(candidate), str(installed_sglang_version()), installed_reads())
    return config


def draft_convention() -> tuple[str | None, str]:
    """(convention, where it came from) for the draft being served; (None, why) when none is recorded."""
    try:
        draft = server_arg("speculative_draft_model_path")
    except Exception:  # noqa: BLE001 - no global server args (a bare model): nothing recorded
        draft = None
    config = _read_draft_config(draft)
    eagle_config = (config or {}).get("eagle_config") or {}
    recorded = eagle_config.get(CONVENTION_KEY) if isinstance(eagle_config, dict) else None
    if recorded is not None:
        if recorded not in CONVENTIONS:
            raise Eagle3ConfigError(
                f"unknown EAGLE-3 layer-id convention {recorded!r}",
                where=f"draft config.json eagle_config.{CONVENTION_KEY} ({draft})",
                found=repr(recorded),
                expected=" or ".join(CONVENTIONS),
                fix=f"write {OUTPUT_OF_LAYER!r} (id i = the output of target layer i) or re-convert the draft "
                "with `eagle3-patches convert`",
            )
        return recorded, f"eagle_config.{CONVENTION_KEY} in {draft}/config.json"
    forced = settings.current().layer_id_convention
    if forced:
        if forced not in CONVENTIONS:
            raise Eagle3ConfigError(
                f"unknown EAGLE-3 layer-id convention {forced!r}",
                where=ENV,
                found=repr(forced),
                expected=" or ".join(CONVENTIONS),
                fix=f"set {ENV} to {OUTPUT_OF_LAYER} or {INPUT_OF_LAYER}",
            )
        return forced, ENV
    return None, f"the draft config ({draft}) records no eagle_config.{CONVENTION_KEY}"


def _conventional_set_layers(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    # pragma: no mutate core/NumberReplacer `-1`: every caller in sglang 0.5.13 - 0.5.23 passes the ids as the one
    # positional argument (`set_eagle3_layers_to_capture(ids)`: the model runner, the wrappers' delegations) or none, so
    # the first argument is the last
    layer_ids = args[0] if args else kwargs.get("layer_ids")
    if layer_ids is None or not instance.pp_group.is_last_rank:
        return result
    convention, source = draft_convention()
    stock = list(instance.model.layers_to_capture)
    if convention is None:
        as_before = capture_points_for(layer_ids, OUTPUT_OF_LAYER)
        key = (tuple(layer_ids), tuple(stock))
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: `as_before` is the ids + 1, and sglang's own rule
        # (0.5.13 - 0.5.23) gives the ids or, for a first id of 1, the ids + 1: `stock` is never above `as_before`, so
        # it differs exactly when it is below
        if stock != as_before and key not in _warned:
            _warned.add(key)
            logger.warning(
                "eagle3-patches: EAGLE-3 aux layer ids %s capture the outputs of layers %s on this sglang, but of "
                "layers %s on sglang <= 0.5.12 (the +1 rule changed in 0.5.13); %s. If the draft was trained for "
                "sglang <= 0.5.12 (SpecForge), set eagle_config.%s = %r in its config (or %s=%s).",
                list(layer_ids),
                [p - 1 for p in stock],
                list(layer_ids),
                source,
                CONVENTION_KEY,
                OUTPUT_OF_LAYER,
                ENV,
                OUTPUT_OF_LAYER,
            )
        return result
    points = capture_points_for(layer_ids, convention)
    instance.model.layers_to_capture = points
    if points != stock:
        logger.info(
            "eagle3-patches: aux layer ids %s (%s, from %s) -> layers_to_capture %s (sglang's own rule gave %s)",
            list(layer_ids),
            convention,
            source,
            points,
            stock,
        )
    return result


class LayerIdConvention(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 90
    summary = "aux layer ids mean the draft config's recorded convention on sglang >= 0.5.13 (the +1 rule changed)"
    module = "sglang.srt.models.deepseek_v2"
    applies_to = SpecifierSet(">=0.5.13")

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        """The ids capture other layers than the draft config's convention means (any release: before 0.5.13 a draft
        stating input-of-layer ids, from 0.5.13 the first-id rule); the patch fixes it from 0.5.13 when the draft
        config records its convention."""
        out = Diagnostics()
        cap = setup.capture()
        if cap is None or cap.broken:
            return out
        dv = setup.draft_view  # a capture is read from the draft's config
        intended = dv.output_ids or []  # a capture implies aux ids, so output ids
        if list(cap.outputs) == list(intended) or (cap.num_layers is None and any(i < 0 for i in intended)):
            return out
        try:
            proposal = L.ids_for_sglang(sorted(intended), setup.version)
            conv = L.OUTPUT_OF_LAYER if setup.rf.plus_one_always else L.INPUT_OF_LAYER
            fix = (
                f'for sglang {setup.version} write {proposal} with eagle_config.{L.CONVENTION_KEY} = "{conv}" (or '
                "serve "
                "on a release that reads the ids as the draft means them)"
            )
        except Eagle3ConfigError as exc:
            fix = exc.fix
        stated = "states" if dv.convention_stated else "is assumed to use"
        out.add(
            ERROR if dv.convention_stated else WARNING,
            "aux-ids-convention",
            f"on sglang {setup.version} these ids capture the outputs of layers {list(cap.outputs)}, but the draft "
            "config "
            f"{stated} the {dv.convention} convention, i.e. the outputs of layers {intended}: "
            "the draft is fed states one layer off (accept length drops, no error)",
            where=setup.dcfg(dv.aux_ids_where),
            found=f"{list(cap.ids or ())} ({dv.convention})",
            expected=f"capture of the outputs of layers {intended}",
            fix=fix,
        )
        return out

    def when_patched(self, d: Diagnostic, setup: PatchSetup) -> Diagnostic:
        """Fixed only where the patch knows the convention: recorded in the draft config, or set in the launch's
        environment."""
        if setup.draft_view.convention_stated or setup.settings.layer_id_convention:
            return super().when_patched(d, setup)
        return d

    def check(self, module: ModuleType) -> None:
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(
            expect_attr(module.DeepseekV2ForCausalLM, SETTER),
            "layer_ids[0] == 1",
            "self.model.layers_to_capture = list(layer_ids)",
        )
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(expect_attr(module.DeepseekV2Model, "forward"), "layers_to_capture")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.DeepseekV2ForCausalLM, SETTER, _conventional_set_layers)


PATCH = LayerIdConvention()
