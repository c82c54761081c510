"""Draft config fields that change the draft's computation, and which sglang release reads each one.

An EAGLE-3 draft trained with an extra norm (EAGLE-3.1's ``fc_norm`` / ``norm_output``, ``norm_before_fc`` with
its ``input_norm``) loads on a release whose ``LlamaForCausalLMEagle3`` never reads the field, and is served
without that norm: no error, a lower accept length.  What a release reads is taken from its own source
(:func:`fields_read` parses ``sglang/srt/models/llama_eagle3.py``, nothing imported): for the installed sglang
the file itself (:func:`installed_source`), for any other release the table :data:`FIRST_READ`, observed from
the released wheels by ``tools/draft_fields_table.py`` (a test compares it with the installed release's source).
The MLA draft (``Eagle3DeepseekV2ForCausalLM``, ``models/kimi_k25_eagle3.py``) reads its own fields, on its own
releases: :data:`MLA_DRAFT_MODULE` and its table :data:`MLA_FIRST_READ` (every function taking ``module``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .releases import NEWEST_CHECKED, rel

#: the fields that change what the draft computes when set true, and what each adds
MATH_FIELDS = {
    "norm_before_fc": "an RMSNorm over the concatenated aux states before fc (input_norm.weight)",
    "fc_norm": "an RMSNorm on each aux state before fc (fc_norm.<i>.weight)",
    "use_aux_norm": "fc_norm's older name",
    "norm_output": "the final norm applied to the hidden state the draft hands to its next step",
    "norm_before_residual": "the midlayer's input norm applied before the residual is taken",
}
#: the first sglang release whose ``llama_eagle3.py`` reads each of :data:`MATH_FIELDS` at the top of the config
#: or in its ``eagle_config`` (a name missing here: no release up to the newest observed reads it); observed from
#: the released wheels by ``python tools/draft_fields_table.py`` (``--check`` compares)
FIRST_READ: dict[str, tuple[int, int, int]] = {
    "eagle_config.norm_before_fc": (0, 5, 17),
    "fc_norm": (0, 5, 12),
    "norm_before_fc": (0, 5, 17),
    "norm_output": (0, 5, 12),
    "use_aux_norm": (0, 5, 12),
}
#: the same for the MLA draft's ``kimi_k25_eagle3.py`` (0.5.12, the first release with the file, reads none of
#: them: it logs "skipping unexpected weight" for ``fc_norm.<i>.weight`` and serves without the norms)
MLA_FIRST_READ: dict[str, tuple[int, int, int]] = {
    "fc_norm": (0, 5, 13),
    "norm_output": (0, 5, 13),
    "use_aux_norm": (0, 5, 13),
}
#: the newest release :data:`FIRST_READ` was observed on: the newest checked (``tools/draft_fields_table.py --check``
#: is part of checking a release)
OBSERVED_UP_TO = rel(NEWEST_CHECKED)
#: the weights a field adds to the draft, named as sglang's ``LlamaForCausalLMEagle3`` (0.5.12+, and the backport)
#: and speculators' ``Eagle3DraftModel`` both name them (``{i}``: one per aux state); ``norm_output`` reuses ``norm``
FIELD_WEIGHTS = {
    "norm_before_fc": "input_norm.weight",
    "fc_norm": "fc_norm.{i}.weight",
    "use_aux_norm": "fc_norm.{i}.weight",
}
#: the module of the draft class, relative to the ``sglang`` package directory
DRAFT_MODULE = "srt/models/llama_eagle3.py"
#: the module of the MLA draft class (``Eagle3DeepseekV2ForCausalLM``; its weights are named as the Llama draft's,
#: :data:`FIELD_WEIGHTS`, but it maps no older ``aux_norm_*`` names)
MLA_DRAFT_MODULE = "srt/models/kimi_k25_eagle3.py"
#: each draft module's table of first reads
FIRST_READ_BY_MODULE = {DRAFT_MODULE: FIRST_READ, MLA_DRAFT_MODULE: MLA_FIRST_READ}
#: a draft config's own block of EAGLE settings, where some releases read a field first
EAGLE_CONFIG = "eagle_config"


def _is_config(node: ast.AST) -> bool:
    """``config``, ``self.config`` or ``x.config``: the draft's config object."""
    return (isinstance(node, ast.Name) and node.id == "config") or (
        isinstance(node, ast.Attribute) and node.attr == "config"
    )


def _is_eagle_config(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == EAGLE_CONFIG


def fields_read(source: str) -> frozenset[str]:
    """The config fields a draft module's source reads: ``config.X``, ``getattr(config, "X", ...)``,
    ``hasattr(config, "X")``, and ``eagle_config.get("X")`` (recorded as ``eagle_config.X``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_config(node.value):
            found.add(node.attr)
        elif isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            key = node.args[1] if len(node.args) > 1 else None
            if (
                isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and _is_config(first)
                and isinstance(key, ast.Constant)
                and isinstance(key.value, str)
            ):
                found.add(key.value)
            elif (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and _is_eagle_config(node.func.value)
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.add(f"{EAGLE_CONFIG}.{first.value}")
    return frozenset(found)


def installed_source(module: str = DRAFT_MODULE) -> tuple[Path, str] | None:
    """The installed sglang's draft module (path, text), found without importing sglang; None without one (or
    without that module: the MLA draft's before 0.5.12)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / module
    try:
        return path, path.read_text(encoding="utf-8")
    except OSError:
        return None


def read_by_release(release: tuple[int, ...], module: str = DRAFT_MODULE) -> frozenset[str]:
    """The read names of ``module``'s table (:data:`FIRST_READ_BY_MODULE`) that ``release`` reads."""
    return frozenset(name for name, first in FIRST_READ_BY_MODULE[module].items() if tuple(release) >= first)


def newest_read(module: str = DRAFT_MODULE) -> frozenset[str]:
    """The read names the newest observed release (:data:`OBSERVED_UP_TO`) reads."""
    return read_by_release(OBSERVED_UP_TO, module)


def read_name(field: str, read: Iterable[str]) -> str | None:
    """The name under which a release reading ``read`` reads ``field`` (the top level first, then
    ``eagle_config``), or None: it never reads it."""
    read = set(read)
    return next((n for n in (field, f"{EAGLE_CONFIG}.{field}") if n in read), None)


def weights_of(field: str, num_aux: int) -> list[str]:
    """The weights a draft with ``field`` set has for it (:data:`FIELD_WEIGHTS`), for ``num_aux`` aux states."""
    pattern = FIELD_WEIGHTS.get(field)
    if pattern is None:
        return []
    return [pattern.format(i=i) for i in range(num_aux)] if "{i}" in pattern else [pattern]


def field_of_weight(name: str) -> str | None:
    """The field whose weight (:data:`FIELD_WEIGHTS`) ``name`` is (a ``model.`` prefix allowed), or None; a weight
    two fields add names the first (``fc_norm``, not its older name)."""
    name = name.removeprefix("model.")
    for field, pattern in FIELD_WEIGHTS.items():
        if re.fullmatch(re.escape(pattern).replace(re.escape("{i}"), r"\d+"), name):
            return field
    return None


def candidate_names() -> list[str]:
    """Every name under which a release could read one of :data:`MATH_FIELDS`."""
    return [n for f in MATH_FIELDS for n in (f, f"{EAGLE_CONFIG}.{f}")]


def set_fields(config: dict) -> list[tuple[str, str, Any]]:
    """The :data:`MATH_FIELDS` a draft config sets to a true value: (field, its read name, value); a field can be
    set both at the top and in ``eagle_config``."""
    out = []
    eagle = config.get(EAGLE_CONFIG)
    for field in MATH_FIELDS:
        for name, block in ((field, config), (f"{EAGLE_CONFIG}.{field}", eagle)):
            if isinstance(block, dict) and block.get(field) not in (None, False):  # 0 == False, 0.0 too
                out.append((field, name, block.get(field)))
    return out


def ignored(config: dict, read: Iterable[str]) -> list[tuple[str, str, Any]]:
    """The fields of :func:`set_fields` a release that reads the names ``read`` never sees.  ``use_aux_norm`` set
    where the release reads it counts as ``fc_norm``'s older name, read."""
    read = set(read)
    return [(field, name, value) for field, name, value in set_fields(config) if name not in read]


def first_reading(name: str, module: str = DRAFT_MODULE) -> str:
    """``sglang >= X`` for the first release whose ``module`` reads ``name`` (a read name), or that none does."""
    first = FIRST_READ_BY_MODULE[module].get(name)
    if first is None:
        return "no sglang release up to " + ".".join(map(str, OBSERVED_UP_TO)) + " reads it"
    return "sglang >= " + ".".join(map(str, first))


def reads_it(name: str, module: str = DRAFT_MODULE) -> str:
    """:func:`first_reading` as a sentence: ``sglang >= X reads it`` or that no release does."""
    first = first_reading(name, module)
    return f"{first} reads it" if first.startswith("sglang") else first
