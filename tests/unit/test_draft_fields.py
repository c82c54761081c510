"""Which draft config fields a release's LlamaForCausalLMEagle3 reads, taken from its source: the parser, and the
observed table against the installed release's own file (in CI on the pinned and the newest release)."""

from __future__ import annotations

import pytest

from eagle3_patches.checkpoint import draft_fields as F
from eagle3_patches.sglang_version import installed_sglang_version

SOURCE = """
class Draft:
    def __init__(self, config, other):
        a = config.a
        b = self.config.b
        c = getattr(config, "c", False)
        d = hasattr(config, "d")
        eagle_config = getattr(config, "eagle_config", None) or {}
        e = eagle_config.get("e", False)
        not_config = other.x, getattr(other, "y", 0), other.get("z"), config.get("w")
"""


def test_the_parser_finds_every_way_a_draft_module_reads_its_config():
    assert F.fields_read(SOURCE) == {"a", "b", "c", "d", "eagle_config", "eagle_config.e", "get"}


def test_the_table_is_what_the_installed_release_reads():
    found = F.installed_source()
    if found is None:
        pytest.skip("sglang is not installed")
    path, source = found
    version = installed_sglang_version()
    assert version is not None
    read = F.fields_read(source) & set(F.candidate_names())
    assert read == F.read_by_release(tuple(version.release)), (
        f"{path} reads {sorted(read)}; FIRST_READ says {sorted(F.read_by_release(tuple(version.release)))}: "
        "run python tools/draft_fields_table.py"
    )


def test_the_mla_table_is_what_the_installed_release_reads():
    """The MLA draft's table (kimi_k25_eagle3.py) against the installed release's file: on a release without the
    file it reads nothing; 0.5.12 nothing either, 0.5.13 and later fc_norm / use_aux_norm / norm_output."""
    version = installed_sglang_version()
    assert version is not None
    found = F.installed_source(F.MLA_DRAFT_MODULE)
    read = frozenset() if found is None else F.fields_read(found[1]) & set(F.candidate_names())
    assert read == F.read_by_release(tuple(version.release), F.MLA_DRAFT_MODULE), (
        f"{found and found[0]} reads {sorted(read)}: run python tools/draft_fields_table.py"
    )


def test_the_mla_draft_reads_the_norms_from_the_release_after_its_first():
    assert F.read_by_release((0, 5, 12), F.MLA_DRAFT_MODULE) == frozenset()
    assert F.read_by_release((0, 5, 12), F.DRAFT_MODULE) >= {"fc_norm", "norm_output"}  # the Llama draft's, not its
    assert F.read_by_release((0, 5, 13), F.MLA_DRAFT_MODULE) == {"fc_norm", "use_aux_norm", "norm_output"}
    assert F.first_reading("norm_output", F.MLA_DRAFT_MODULE) == "sglang >= 0.5.13"
    assert F.first_reading("norm_before_fc", F.MLA_DRAFT_MODULE) == "no sglang release up to 0.5.23 reads it"


@pytest.mark.parametrize(
    "config, read, ignored",
    [
        ({"norm_output": True}, set(), [("norm_output", "norm_output", True)]),
        ({"norm_output": True}, {"norm_output"}, []),
        ({"norm_output": False, "fc_norm": 0, "use_aux_norm": None}, set(), []),
        (
            {"eagle_config": {"norm_before_fc": True}},
            {"norm_before_fc"},
            [("norm_before_fc", "eagle_config.norm_before_fc", True)],
        ),
        ({"eagle_config": {"norm_before_fc": True}}, {"eagle_config.norm_before_fc"}, []),
        (
            {"fc_norm": True, "norm_before_residual": True},
            {"fc_norm"},
            [("norm_before_residual", "norm_before_residual", True)],
        ),
    ],
)
def test_a_field_set_true_where_the_release_does_not_read_it_is_ignored(config, read, ignored):
    assert F.ignored(config, read) == ignored


def test_the_first_release_reading_a_field_is_named():
    assert F.first_reading("norm_output") == "sglang >= 0.5.12"
    assert F.first_reading("eagle_config.norm_before_fc") == "sglang >= 0.5.17"
    assert F.first_reading("norm_before_residual") == "no sglang release up to 0.5.23 reads it"
    assert F.read_by_release((0, 5, 16)) == {"fc_norm", "use_aux_norm", "norm_output"}
    assert F.read_by_release((0, 5, 11, 9)) == frozenset()


@pytest.mark.parametrize("value", [None, False, 0, 0.0])
def test_a_field_set_to_a_false_value_is_not_set(value):
    assert F.set_fields({"norm_output": value, F.EAGLE_CONFIG: {"fc_norm": value}}) == []
    assert F.set_fields({"norm_output": 1, F.EAGLE_CONFIG: {"fc_norm": True}}) == [
        ("fc_norm", "eagle_config.fc_norm", True),
        ("norm_output", "norm_output", 1),
    ]


def test_the_weights_a_field_adds_are_named_per_aux_state():
    assert F.weights_of("fc_norm", 3) == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]
    assert F.weights_of("use_aux_norm", 2) == ["fc_norm.0.weight", "fc_norm.1.weight"]
    assert F.weights_of("norm_before_fc", 3) == ["input_norm.weight"]
    assert F.weights_of("norm_output", 3) == []  # a field without weights of its own


def test_a_weight_is_named_by_the_field_that_adds_it():
    assert F.field_of_weight("model.fc_norm.12.weight") == "fc_norm"  # the first of two fields adding it
    assert F.field_of_weight("input_norm.weight") == "norm_before_fc"
    assert F.field_of_weight("fc_norm.x.weight") is None and F.field_of_weight("norm.weight") is None


def test_the_installed_module_is_none_without_sglang_or_its_file(monkeypatch, tmp_path):
    import importlib.machinery
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert F.installed_source() is None
    spec = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
    spec.submodule_search_locations = []  # a package found nowhere
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert F.installed_source() is None
    spec.submodule_search_locations = [str(tmp_path)]  # an sglang without the draft module
    assert F.installed_source() is None
    (tmp_path / F.DRAFT_MODULE).parent.mkdir(parents=True)
    (tmp_path / F.DRAFT_MODULE).write_text("x = config.norm_output\n")
    assert F.installed_source() == (tmp_path / F.DRAFT_MODULE, "x = config.norm_output\n")


def test_every_other_draft_module_sorts_before_the_llama_drafts():
    """eagle3_draft_norms' preflight stands aside for every draft module but the Llama one (`!=`), and marks the
    `<` mutant of that test equivalent because the one other module sorts first: a module added after it in sort
    order makes the mark wrong, and this test says so."""
    assert all(m < F.DRAFT_MODULE for m in F.FIRST_READ_BY_MODULE if m != F.DRAFT_MODULE)
