"""Each patch documents itself in its module's docstring, and docs/patches.md shows exactly that.

The docstring of every patch and instrument module has the labelled paragraphs ``eagle3_patches.patch_docs``
parses (a patch without one of the required labels fails here), the files it names exist, and the committed
page holds the generated section of every registered patch and instrument, in registry order, as
``python tools/gen_docs.py`` writes it (``--check`` says when it does not).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

import eagle3_patches
from eagle3_patches import patch_docs
from eagle3_patches.patch_docs import (
    INSTRUMENT_LABELS,
    PATCH_LABELS,
    SECTIONS_BEGIN,
    SECTIONS_END,
    generated,
    parse_docstring,
    patch_doc,
    patch_section,
    to_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "patches.md"
PATCHES, INSTRUMENTS = eagle3_patches.registries()
ALL = [*PATCHES.patches(), *INSTRUMENTS.patches()]

PATCH_DOC = """made_up_fix

Bug: sglang does something wrong.

What users see: a symptom.

What the patch changes: the fix,
over two lines.

A second paragraph of the same label.

Releases: any.

Upstream probe: none.

Tests: ``tests/unit/test_made_up.py``.
"""

INSTRUMENT_DOC = """made_up_instrument

What it does: watches.

Releases: any.

Upstream probe: none.

Tests: none yet.
"""


def _without(doc: str, label: str) -> str:
    """``doc`` without the paragraph that starts with ``label:`` (up to the next blank line)."""
    return re.sub(rf"\n{re.escape(label)}:.*?\n(?=\n|\Z)", "\n", doc, flags=re.DOTALL)


@pytest.mark.parametrize("patch", ALL, ids=lambda p: p.name)
def test_every_patch_and_instrument_module_documents_itself_with_the_required_labels(patch):
    name, fields = patch_doc(patch)  # raises ValueError naming what is missing or out of order
    assert name == patch.name
    required = INSTRUMENT_LABELS if patch.name in INSTRUMENTS else PATCH_LABELS
    assert set(required) <= set(fields)
    assert all(text.strip() for text in fields.values())


@pytest.mark.parametrize("label", PATCH_LABELS)
def test_a_patch_docstring_without_a_required_label_is_refused_naming_it(label):
    name, fields = parse_docstring(PATCH_DOC)
    assert name == "made_up_fix" and list(fields) == list(PATCH_LABELS)
    assert fields["What the patch changes"] == "the fix,\nover two lines.\n\nA second paragraph of the same label."
    doc = _without(PATCH_DOC, label)
    assert f"\n{label}:" not in doc
    with pytest.raises(ValueError, match=rf"made_up_fix: the docstring lacks the label\(s\) '{label}:'"):
        parse_docstring(doc)


@pytest.mark.parametrize("label", INSTRUMENT_LABELS)
def test_an_instrument_docstring_without_a_required_label_is_refused_naming_it(label):
    assert list(parse_docstring(INSTRUMENT_DOC, instrument=True)[1]) == list(INSTRUMENT_LABELS)
    with pytest.raises(ValueError, match=rf"lacks the label\(s\) '{label}:'"):
        parse_docstring(_without(INSTRUMENT_DOC, label), instrument=True)


@pytest.mark.parametrize(
    "doc, instrument, error",
    [
        ("", False, "the docstring is empty"),
        ("made_up_fix\n\nThe bug is that ...\n\n" + PATCH_DOC.split("\n", 2)[2], False, "text before the first label"),
        (PATCH_DOC.replace("Releases: any.", "Releases: any.\n\nBug: again."), False, "the label 'Bug' appears twice"),
        (
            PATCH_DOC.replace("Releases: any.\n\nUpstream probe: none.", "Upstream probe: none.\n\nReleases: any."),
            False,
            "the labels must come in this order",
        ),
        (PATCH_DOC, True, "an instrument's docstring has no 'Bug:', 'What users see:', 'What the patch changes:'"),
        (INSTRUMENT_DOC, False, "a patch's docstring has no 'What it does:'"),
        (
            INSTRUMENT_DOC.replace(
                "What it does: watches.",
                "Bug: none.\n\nWhat users see: x.\n\nWhat the patch changes: y.\n\nWhat it does: watches.",
            ),
            False,
            "a patch's docstring has no 'What it does:'",
        ),
        (PATCH_DOC.replace("Releases: any.", "Releases:"), False, "the label(s) 'Releases:' have no text"),
    ],
)
def test_a_malformed_docstring_is_refused_saying_why(doc, instrument, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_docstring(doc, instrument=instrument)


def test_the_docstring_text_becomes_markdown():
    assert to_markdown("``a`` and :func:`eagle3_patches.probe_report.analyse`, :meth:`~x.Patch.enabled_by`") == (
        "`a` and `eagle3_patches.probe_report.analyse`, `enabled_by`"
    )  # ~: the last name, as Sphinx shows it
    assert to_markdown("see docs/targets.md (and ``docs/e2e.md``)") == (
        "see [targets.md](targets.md) (and `docs/e2e.md`)"
    )


def test_the_committed_page_is_what_the_registries_and_the_docstrings_say():
    page = PAGE.read_text(encoding="utf-8")
    assert generated(page) == page, "docs/patches.md is stale: run python tools/gen_docs.py"


def test_the_page_holds_the_generated_section_of_every_patch_and_instrument_in_registry_order():
    page = PAGE.read_text(encoding="utf-8")
    block = page.split(SECTIONS_BEGIN, 1)[1].split(SECTIONS_END, 1)[0]
    for p in ALL:
        section = patch_section(p)
        assert section.startswith(f"## `{p.name}`") and section in block, f"docs/patches.md lacks {p.name}'s section"
    assert re.findall(r"^## `(\w+)`", block, flags=re.MULTILINE) == [p.name for p in ALL]
    # the hand-written rest of the page has no section of its own for a patch
    rest = page.replace(block, "")
    assert not [p.name for p in ALL if f"## `{p.name}`" in rest]


@pytest.mark.parametrize("patch", ALL, ids=lambda p: p.name)
def test_the_files_a_docstring_names_exist(patch):
    doc = sys.modules[type(patch).__module__].__doc__
    named = set(re.findall(r"\b((?:tests|tools|benchmarks|eagle3_patches|docs)/[\w/.-]*\w\.(?:py|md|json))\b", doc))
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"{patch.name}'s docstring names files that do not exist: {missing}"


def _gen_docs(monkeypatch, page: Path):
    spec = importlib.util.spec_from_file_location("gen_docs_under_test", ROOT / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "PAGE", page)
    return module


def test_gen_docs_check_fails_on_a_hand_edited_section_and_the_tool_restores_it(tmp_path, monkeypatch, capsys):
    page = tmp_path / "patches.md"
    committed = PAGE.read_text(encoding="utf-8")
    page.write_text(committed.replace("**Bug:**", "**The bug.**", 1), encoding="utf-8")
    tool = _gen_docs(monkeypatch, page)
    assert tool.main(["--check"]) == 1
    assert "is stale" in capsys.readouterr().err
    assert tool.main([]) == 0
    assert page.read_text(encoding="utf-8") == committed
    assert tool.main(["--check"]) == 0


def test_gen_docs_names_a_patch_that_does_not_document_itself(tmp_path, monkeypatch, capsys):
    page = tmp_path / "patches.md"
    page.write_text(PAGE.read_text(encoding="utf-8"), encoding="utf-8")
    tool = _gen_docs(monkeypatch, page)
    module = sys.modules[type(PATCHES["eagle3_fc_guard"]).__module__]
    monkeypatch.setattr(module, "__doc__", _without(module.__doc__, "What users see"))
    assert tool.main(["--check"]) == 1
    assert "eagle3_fc_guard: the docstring lacks the label(s) 'What users see:'" in capsys.readouterr().err
    assert patch_docs.SECTIONS_BEGIN in page.read_text(encoding="utf-8")
