"""The whole patch set on real sglang 0.5.9: applied, idempotent, and revert restores every original."""

from __future__ import annotations

import pytest
from support.releases import expected_states, outside_states, patch_applies

from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang


def _apply_twice_and_revert():
    from support.releases import import_hooked_modules

    import eagle3_patches

    # every module a patch or an instrument hooks, imported first: a hook on a module not yet imported is pending
    modules = import_hooked_modules()

    def snapshot():
        """Every class attribute of every patched module, by identity."""
        snap = {}
        for mod in set(modules.values()):
            for cls_name, cls in vars(mod).items():
                if isinstance(cls, type) and cls.__module__ == mod.__name__:
                    for attr, value in vars(cls).items():
                        snap[(mod.__name__, cls_name, attr)] = id(value)
        return snap

    before = snapshot()
    first = {n: s.state.value for n, s in eagle3_patches.apply().items()}
    patched = snapshot()
    eagle3_patches.apply()
    again = snapshot()
    changed = sorted(
        f"{m.rsplit('.', 1)[-1]}.{c}.{a}"
        for (m, c, a) in set(before) | set(patched)
        if before.get((m, c, a)) != patched.get((m, c, a))
    )
    eagle3_patches.revert()
    after = snapshot()
    return {
        "states": first,
        "changed": changed,
        "idempotent": patched == again,
        "restored": before == after,
        "after_revert": {n: s.state.value for n, s in eagle3_patches.status().items()},
    }


@pytest.mark.runtime_only
def test_apply_twice_then_revert_restores_every_original():
    out = run_isolated(_apply_twice_and_revert)
    assert out["states"] == {**out["states"], **expected_states()}, out["states"]  # per release: docs/compat.md
    assert outside_states(out["states"]) == {}
    # each patch changed something, and only what it declares
    if patch_applies("kimi_k25_eagle3_delegation"):
        assert "kimi_k25.KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture" in out["changed"]
    assert "llama_eagle3.LlamaForCausalLMEagle3.load_weights" in out["changed"]
    # where ServerArgs resolves the flags: __post_init__, or resolve_once from sglang 0.5.23
    assert {"server_args.ServerArgs.__post_init__", "server_args.ServerArgs.resolve_once"} & set(out["changed"])
    assert out["idempotent"]
    assert out["restored"]
    assert set(out["after_revert"].values()) == {"not-selected"}
