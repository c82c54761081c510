"""A draft checkpoint's tensor names as sglang's EAGLE-3 loader reads them: the one map the doctor, the converter and
measure-accept share.

``LlamaForCausalLMEagle3.load_weights`` (sglang/srt/models/llama_eagle3.py, every release read: 0.5.9 - the newest
checked) takes a name holding ``d2t`` as the draft-to-target map and one holding ``t2d`` as nothing it loads, and
looks every other name up as written, else with ``model.`` in front: ``fc.weight`` and ``model.fc.weight`` reach the
same parameter.  Its ``lm_head`` sits outside ``model.``, so ``model.lm_head.weight`` is looked up as
``model.model.lm_head.weight`` and dropped without a word: the draft then runs a head it was never given.  A
speculators checkpoint's ``layers.0.*`` (with or without ``model.``) is sglang's ``midlayer.*`` (0.5.12+ maps it
itself; before, the converter or ``speculators_draft_config`` renames it).
"""

from __future__ import annotations

import re

#: a speculators checkpoint's decoder layer, with or without the ``model.`` prefix
_LAYER0 = re.compile(r"^(model\.)?layers\.0\.")
#: the name a draft's own head must have; ``model.`` + it is not read (see the module docstring)
HEAD = "lm_head.weight"
PREFIXED_HEAD = "model." + HEAD


def draft_tensor_name(raw: str) -> tuple[str, str]:
    """(the parameter name sglang loads ``raw`` into, as sglang's own checkpoints spell it; how ``raw`` is spelt: as
    sglang's own checkpoints (``sglang``), speculators' ``layers.0.*`` (``speculators``), with a ``model.`` prefix
    sglang strips (``model-prefix``), or a vocabulary map (``map``)).  ``model.lm_head.weight`` keeps its name:
    sglang loads it nowhere."""
    if "d2t" in raw:
        return "d2t", "map"
    if "t2d" in raw:
        return "t2d", "map"
    m = _LAYER0.match(raw)
    if m:
        return "midlayer." + raw[m.end() :], "speculators"
    if raw.startswith("model.") and raw != PREFIXED_HEAD:
        return raw[len("model.") :], "model-prefix"
    return raw, "sglang"
