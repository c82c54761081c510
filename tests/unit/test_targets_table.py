"""tools/targets_table.py reads a release's own model sources: checked on the installed sglang (0.5.9 here)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def release(tmp_path_factory, tool):
    """The installed sglang's models/*.py, packed as the wheel the tool reads (no download)."""
    import importlib.util

    from eagle3_patches.sglang_version import installed_sglang_version

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    models = Path(spec.origin).parent / "srt" / "models"
    wheel = tmp_path_factory.mktemp("wheel") / "sglang-local.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for f in models.glob("*.py"):
            zf.write(f, f"sglang/srt/models/{f.name}")
    targets_table = tool("targets_table")
    import eagle3_patches

    by_name, registered = targets_table.read_release(wheel)
    version = str(installed_sglang_version())
    rows = {
        c.name: targets_table.classify(c, by_name, version, eagle3_patches.get_registry().patches())
        for c in registered
        if c.name.endswith(targets_table.GENERATIVE)
    }
    return version, rows


def test_the_classes_sglang_registers_are_all_there(release):
    _, rows = release
    assert {"DeepseekV3ForCausalLM", "LlamaForCausalLM", "Qwen3VLForConditionalGeneration"} <= set(rows)
    assert len(rows) > 50


def test_native_patched_and_refused_follow_the_code_and_the_registry(release):
    from support.releases import patch_applies

    _, rows = release
    assert rows["DeepseekV3ForCausalLM"][0] == "native"
    assert rows["LlamaForCausalLM"][0] == "native"
    for name, patch in (
        ("KimiK25ForConditionalGeneration", "kimi_k25_eagle3_delegation"),
        ("KimiVLForConditionalGeneration", "kimi_vl_eagle3_delegation"),
        ("Qwen3VLForConditionalGeneration", "qwen3_vl_eagle3_capture"),
        ("Qwen3VLMoeForConditionalGeneration", "qwen3_vl_eagle3_capture"),
    ):
        if patch_applies(patch):
            assert rows[name] == ("patched", f"eagle3-patches' `{patch}`"), name
        else:
            assert rows[name][0] == "native", name
    # wrappers that only lack the hooks, whose language model has them: named as delegation candidates
    candidates = {n: why for n, (status, why) in rows.items() if status == "refused" and "would suffice" in why}
    assert candidates and all("ForConditionalGeneration" in n or "ForCausalLM" in n for n in candidates)
    assert rows["Glm4vForConditionalGeneration"][0] == "refused"
