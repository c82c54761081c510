"""EAGLE-3 aux layer ids: the two conventions, and what an id captures on each sglang release.

Two meanings of "aux layer id ``i``" are in use:

* ``output-of-layer`` (:data:`OUTPUT_OF_LAYER`) - this library's convention, and what
  sglang <= 0.5.12 and SpecForge mean: id ``i`` is the **output of target layer i**
  (0-based).  sglang 0.5.9 captures it by appending ``hidden_states + residual`` just
  before layer ``i + 1`` runs.  Valid ids: ``0 <= i <= num_layers - 2`` (capturing the
  output of the last layer would need a capture point before layer ``num_layers``,
  which is never reached).
* ``input-of-layer`` (:data:`INPUT_OF_LAYER`) - speculators' and vLLM's: id ``N`` is
  HF ``hidden_states[N]``, the input of layer ``N`` = the output of layer ``N - 1``.

What sglang does with the ids it reads from ``eagle_config.eagle_aux_hidden_state_layer_ids``
(its ``layers_to_capture``: the layers whose *input* is captured):

* before 0.5.13: ``[i + 1 for i in ids]`` always;
* from 0.5.13: ``ids`` as they are, unless the first id is 1, then ``+1`` as before;
* no ids: ``[2, n // 2, n - 3]`` (no +1).

The states are concatenated in layer order, not in config order; duplicates and
capture points that never coincide with a layer are dropped; a capture point of 0
crashes (``residual`` is None before layer 0).

A draft config written by eagle3-patches records its convention under
``eagle_config[CONVENTION_KEY]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging.version import Version

from ..errors import Eagle3ConfigError
from .releases import facts, parse_version

OUTPUT_OF_LAYER = "output-of-layer"
INPUT_OF_LAYER = "input-of-layer"
CONVENTIONS = (OUTPUT_OF_LAYER, INPUT_OF_LAYER)
#: key inside ``eagle_config`` naming the convention of ``eagle_aux_hidden_state_layer_ids``
CONVENTION_KEY = "eagle3_patches_layer_id_convention"
#: a plausibility bound on layer ids where the target is unknown (the deepest released models have < 200 layers)
MAX_LAYERS = 1024


def to_output_of_layer(ids: Iterable[int], convention: str) -> list[int]:
    """Translate ids to the ``output-of-layer`` convention."""
    ids = list(ids)
    if convention == OUTPUT_OF_LAYER:
        return ids
    if convention == INPUT_OF_LAYER:
        return [i - 1 for i in ids]
    raise ValueError(f"unknown layer-id convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def from_output_of_layer(ids: Iterable[int], convention: str) -> list[int]:
    ids = list(ids)
    if convention == OUTPUT_OF_LAYER:
        return ids
    if convention == INPUT_OF_LAYER:
        return [i + 1 for i in ids]
    raise ValueError(f"unknown layer-id convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def release_convention(version: str | Version) -> str:
    """The convention in which sglang ``version``'s own rule reads configured ids (a first id of 1 aside:
    from 0.5.13 that list is still shifted by +1, which ``layer_id_convention`` corrects when the config
    records its convention)."""
    return OUTPUT_OF_LAYER if facts(version).plus_one_always else INPUT_OF_LAYER


def default_capture_points(num_layers: int) -> list[int]:
    """sglang's ``layers_to_capture`` when the draft config names no ids (no +1)."""
    return [2, num_layers // 2, num_layers - 3]


def eagle_repository_points(num_layers: int) -> list[int]:
    """The layers whose input the original EAGLE repository feeds its EAGLE-3 draft on an ``num_layers``-layer
    target, in layer order, each once (``input-of-layer`` ids): SafeAILab/EAGLE ``eagle/model/modeling_llama_kv.py``
    and ``modeling_qwen3_kv.py``, ``LlamaModel.forward`` / ``Qwen3Model.forward``, which append ``hidden_states``
    before running layer ``idx`` when ``idx == len(self.layers) - 3 or idx == len(self.layers) // 2 or idx == 2``.
    On a target of fewer than 7 layers two of those coincide (fewer than 3 states)."""
    return sorted({2, num_layers // 2, num_layers - 3})


def capture_points(ids: Sequence[int] | None, version: str | Version, num_layers: int | None = None) -> list[int]:
    """sglang's ``layers_to_capture`` for the configured ``ids`` on ``version``: the layers whose input is captured."""
    if ids is None:
        if num_layers is None:
            raise ValueError("num_layers is needed for the default capture points")
        return default_capture_points(num_layers)
    ids = list(ids)
    if facts(version).plus_one_always or (ids and ids[0] == 1):
        return [i + 1 for i in ids]
    return ids


# pragma: no mutate core/ReplaceTrueWithFalse: nothing sets a field of a `Capture` or hashes one (the doctor caches it
# beside its key, `preflight.Setup.capture`); frozen only guards against a future caller
@dataclass(frozen=True)
class Capture:
    """What the target captures on one sglang release for one list of configured ids."""

    version: Version
    ids: tuple[int, ...] | None  # as configured (None: none configured, sglang's defaults)
    num_layers: int | None
    points: tuple[int, ...]  # sglang's layers_to_capture (capture before these layers)
    outputs: tuple[int, ...]  # outputs of these layers are captured, in concatenation (layer) order
    crash_points: tuple[int, ...]  # capture point 0: residual is None -> TypeError at the first forward
    never_reached: tuple[int, ...]  # capture points >= num_layers (or negative): silently nothing
    duplicates: tuple[int, ...]  # ids listed more than once: captured once
    reordered: bool  # configured order differs from layer order: states concatenated in layer order

    @property
    def n_states(self) -> int:
        return len(self.outputs)

    @property
    def broken(self) -> bool:
        """sglang would crash on these ids, or capture other states than asked (aux_capture_validation's bug)."""
        return bool(self.crash_points or self.never_reached or self.duplicates or self.reordered)

    @property
    def asked(self) -> int:
        return len(self.points)

    def describe(self) -> str:
        pts = list(self.points)
        where = f" of {self.num_layers}" if self.num_layers is not None else ""
        src = f"ids {list(self.ids)}" if self.ids is not None else "no ids (sglang's defaults)"
        return (
            f"on sglang {self.version}, {src} -> capture before layers {pts}: "
            f"the outputs of layers {list(self.outputs)}{where} ({self.n_states} state(s), in layer order)"
        )


def what_captures(ids: Sequence[int] | None, num_layers: int | None, version: str | Version) -> Capture:
    """What sglang ``version`` captures for configured ``ids`` on a target with ``num_layers`` layers.

    ``num_layers`` may be None (unknown target): range checks are then skipped except for
    points that can never be a layer (negative) or crash (0).
    """
    v = parse_version(version)
    if ids is None and num_layers is None:
        return Capture(v, None, None, (), (), (), (), (), False)
    points = capture_points(ids, v, num_layers)
    seen: set[int] = set()
    dups: list[int] = []
    for p, i in zip(points, ids if ids is not None else points):
        if p in seen:
            dups.append(i)
        seen.add(p)
    crash = tuple(p for p in points if p == 0)
    never = tuple(p for p in points if p < 0 or (num_layers is not None and p >= num_layers))
    valid = sorted({p for p in points if p >= 1 and (num_layers is None or p < num_layers)})
    uniq_in_order: list[int] = []
    for p in points:
        if p in valid and p not in uniq_in_order:
            uniq_in_order.append(p)
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: a sorted list is the smallest of its permutations: any
    # other order compares greater, so `!=` and `>` agree on every list
    reordered = uniq_in_order != sorted(uniq_in_order)
    return Capture(
        version=v,
        ids=tuple(ids) if ids is not None else None,
        num_layers=num_layers,
        points=tuple(points),
        outputs=tuple(p - 1 for p in valid),
        crash_points=crash,
        never_reached=never,
        duplicates=tuple(dups),
        reordered=reordered,
    )


def ids_for_sglang(outputs: Sequence[int], version: str | Version) -> list[int]:
    """The ids to write into ``eagle_config`` so that sglang ``version`` captures the outputs of ``outputs``.

    Raises :class:`Eagle3ConfigError` when that release cannot express the list
    (from 0.5.13 the output of layer 0 cannot be captured: ``[1, ...]`` gets +1).
    """
    outputs = list(outputs)
    if facts(version).plus_one_always:
        return outputs
    points = [o + 1 for o in outputs]
    if points and points[0] == 1:
        raise Eagle3ConfigError(
            f"sglang {version} cannot capture the output of layer 0 first",
            where="eagle_config.eagle_aux_hidden_state_layer_ids",
            found=f"output-of-layer ids {outputs}",
            expected="a first id whose capture point is not 1 (from 0.5.13, a first id of 1 is shifted by +1)",
            fix="serve this draft on sglang <= 0.5.12, or retrain it on other layers",
        )
    return points


def valid_output_range(num_layers: int) -> tuple[int, int]:
    """Inclusive range of output-of-layer ids sglang can capture on a target of ``num_layers`` layers."""
    return 0, num_layers - 2
