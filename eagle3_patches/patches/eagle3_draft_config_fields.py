"""eagle3_draft_config_fields

Bug: sglang's ``LlamaForCausalLMEagle3`` reads only the draft config fields its release knows.  A draft trained
with a field that changes its math (EAGLE-3.1's ``fc_norm`` / ``norm_output``, ``norm_before_fc`` with its
``input_norm``, ``norm_before_residual``) loads on a release that never reads the field and is served without
that norm: sglang 0.5.9-0.5.11 read none of them, 0.5.12-0.5.16 not ``norm_before_fc``, and no release checked
reads ``norm_before_residual``.  The MLA draft (``Eagle3DeepseekV2ForCausalLM``, ``models/kimi_k25_eagle3.py``) reads
its own: 0.5.12, the first release with it, none of ``fc_norm`` / ``norm_output`` (it logs "skipping unexpected
weight" for ``fc_norm.<i>.weight``), 0.5.13 and later both, no release ``norm_before_fc``.

What users see: a healthy server whose accept length is well below what the draft's training promised; no error,
no warning.

What the patch changes: after ``ServerArgs`` resolved the flags (``__post_init__``; ``resolve_once`` from 0.5.23),
with ``--speculative-algorithm EAGLE3`` and a local draft directory, it reads the draft's ``config.json`` and
raises ``Eagle3ConfigError`` in the launcher, before anything loads, for each field set true that the installed
release's draft module (``llama_eagle3.py``, or ``kimi_k25_eagle3.py`` for an MLA draft) never reads, nor a patch
active in the process backports for that module (``eagle3_draft_norms`` declares its fields in
``backports_draft_fields``, for the Llama draft only): which fields a release reads is parsed from that file
(``eagle3_patches/checkpoint/draft_fields.py``), never a hand list; the message names the field, what it does,
and the first release that reads it (observed from the released wheels by ``tools/draft_fields_table.py``).  The
doctor reports the same (``draft-config-ignored``), from the installed release's source or, for another release,
from that table.  It costs one parse of one sglang source file at start.

Releases: 0.5.8 and later (each release is judged by its own source: a release that reads every field a draft
sets lets it through).

Upstream probe: none; the check is derived from the installed release's source each time.

Tests: ``tests/patches/test_eagle3_draft_config_fields.py`` (the real launcher, stock and patched, on the tiny
Kimi-K2.5 and drafts setting each field), ``tests/unit/test_draft_fields.py`` (the parser, and the table against
the installed release's source, in CI on the pinned and the newest release),
``tests/checkpoint/test_doctor_fields.py`` (the doctor); for the MLA draft ``tests/patches/test_mla_draft_norms.py``
(the real launcher and the real draft loader: on each release the EAGLE-3.1 MLA draft is served with its norms or
refused) and ``tests/checkpoint/test_doctor_mla_draft.py`` (the doctor, per release).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet

from ..checkpoint import draft_fields as F
from ..checkpoint.formats import DRAFT_CLASS_OF_MODULE, SGLANG_EAGLE3, draft_module
from ..diagnostic import ERROR, Diagnostics
from ..errors import Eagle3ConfigError
from ..registry import Patch, State
from ..sglang_version import installed_sglang_version
from . import LauncherCheck, get_registry

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

CODE = "draft-config-ignored"


def ignored_fields(
    config: dict,
    read: frozenset[str],
    *,
    version: Any,
    source: str,
    config_path: str,
    among: Iterable[str] | None = None,
    module: str = F.DRAFT_MODULE,
) -> Diagnostics:
    """One error per draft config field set true that a release reading ``read`` (in its draft module ``module``)
    never sees (only the read names ``among``, when given)."""
    out = Diagnostics()
    for field, name, value in F.ignored(config, read):
        if among is not None and name not in among:
            continue
        first = F.first_reading(name, module)
        out.add(
            ERROR,
            CODE,
            f"the draft's config sets {name} ({F.MATH_FIELDS[field]}), which sglang {version}'s "
            f"{DRAFT_CLASS_OF_MODULE[module]} never reads: the draft is served without it, unlike it was trained (a "
            "lower accept length, no error)",
            where=f"{config_path}: {name}",
            found=f"{name}: {repr(value)[:80]} (read from {source})",  # a checkpoint's value: bounded
            expected=f"a release that reads it: {first}",
            fix=(f"serve on {first}, or " if first.startswith("sglang") else "") + "use a draft trained without it",
        )
    return out


def _dotted(module: str) -> str:
    """A draft module (``srt/models/llama_eagle3.py``) as a patch's ``module`` names it."""
    return "sglang." + module.removesuffix(".py").replace("/", ".")


def backported(
    patches: Iterable[Patch], active: Callable[[Patch], bool], module: str = F.DRAFT_MODULE
) -> frozenset[str]:
    """The read names the patches of ``patches`` that are ``active`` make the draft of ``module`` read (a patch that
    backports fields declares them in ``backports_draft_fields``, for the draft class of its own module)."""
    return frozenset(n for p in patches if p.module == _dotted(module) and active(p) for n in p.backports_draft_fields)


def _active_in_process(patch: Patch) -> bool:
    """Selected in this process (landed, pending, or in sglang's source) for the installed release."""
    state = get_registry().status()[patch.name].state
    return state in (State.APPLIED, State.PENDING, State.IN_SOURCE) and patch.covers(installed_sglang_version())


def setup_module(setup: PatchSetup) -> str:
    """The draft module (:mod:`~eagle3_patches.checkpoint.draft_fields`) whose class serves the setup's draft."""
    return draft_module(setup.draft.config) if setup.draft is not None else F.DRAFT_MODULE


def release_reads(setup: PatchSetup) -> tuple[frozenset[str], str]:
    """The fields the setup's release reads itself (in the module of the draft's class), and from where that was
    read: the installed release's source, or for another release the table observed from the released wheels."""
    module = setup_module(setup)
    found = F.installed_source(module) if setup.facts.get("sglang_version_source") == "installed" else None
    if found is not None:
        return F.fields_read(found[1]), str(found[0])
    return F.read_by_release(setup.rf.release, module), "the table observed from the released wheels"


def served_fields(setup: PatchSetup) -> frozenset[str]:
    """The fields the served draft reads: the release's own, and those a backporting patch adds where the launch
    runs under it (on stock, the backporting patch reports its fields itself)."""

    def active(p: Patch) -> bool:
        return p.covers(setup.version) and setup.patched(p.name)

    return release_reads(setup)[0] | backported(setup.patches.values(), active, setup_module(setup))


def readers(names: Iterable[str]) -> str:
    """Which releases read all the draft config fields ``names`` (read names): natively from the first release that
    reads them all (:data:`~eagle3_patches.checkpoint.draft_fields.FIRST_READ`), and under eagle3-patches where a
    patch backports them (its ``backports_draft_fields``); "" for none."""
    names = list(names)
    if not names:
        return ""
    firsts = [F.FIRST_READ.get(n) for n in names]
    native = (
        f"sglang >= {'.'.join(map(str, max(f for f in firsts if f is not None)))}"
        if all(firsts)
        else "no sglang release up to " + ".".join(map(str, F.OBSERVED_UP_TO))
    )
    backports = [
        f", and by sglang {p.applies_to} under eagle3-patches ({p.name})"
        for p in get_registry().patches()
        if set(names) <= set(p.backports_draft_fields)
    ]
    return (
        f"carries the draft norms {', '.join(names)}: read by {native}{''.join(backports)}; an older release would "
        "serve the draft without them (refused at start under eagle3-patches)"
    )


def installed_reads(module: str = F.DRAFT_MODULE) -> frozenset[str] | None:
    """The fields a draft reads in this process: the installed release's draft module ``module``
    (``llama_eagle3.py`` by default) and the active patches that backport fields for it; None without an installed
    sglang (or without that module)."""
    found = F.installed_source(module)
    if found is None:
        return None
    return F.fields_read(found[1]) | backported(get_registry().patches(), _active_in_process, module)


def reads_under_patches(setup: PatchSetup) -> frozenset[str]:
    """The fields the setup's release reads, and those a backporting patch adds on it unless the launch runs under
    eagle3-patches with that patch switched off (a speculators draft is served only under eagle3-patches, where the
    backporting patches are on by default)."""

    def reports_its_own(p: Patch) -> bool:
        return p.covers(setup.version) and (not setup.with_patches or setup.patched(p.name))

    return release_reads(setup)[0] | backported(setup.patches.values(), reports_its_own, setup_module(setup))


def check_draft_config_fields(server_args) -> None:
    """Refuse, in the launcher, a draft whose config sets a field the installed release never reads."""
    if (server_args.speculative_algorithm or "").upper() != "EAGLE3":
        return
    path = Path(str(server_args.speculative_draft_model_path or "")) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a hub id or an unreadable config: sglang reports those itself
    if not isinstance(config, dict):
        return
    module = draft_module(config)
    found = F.installed_source(module)
    read = installed_reads(module)
    if found is None or read is None:
        return  # no sglang, or a release without the draft's class: sglang refuses the architecture itself
    problems = ignored_fields(
        config, read, version=installed_sglang_version(), source=str(found[0]), config_path=str(path), module=module
    )
    if problems:
        raise Eagle3ConfigError(diagnostic=problems[0])


class Eagle3DraftConfigFields(LauncherCheck):
    name = "eagle3_draft_config_fields"
    order = 85
    in_fork_series = False  # the check reads sglang's own source at start: nothing to change in that source
    summary = "a draft config field that changes the math and that this release never reads is refused at start"
    applies_to = SpecifierSet(">=0.5.8")

    launcher_check = staticmethod(check_draft_config_fields)

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        dv = setup.draft
        if setup.checkpoint_only or dv is None or dv.format != SGLANG_EAGLE3:
            return Diagnostics()  # a speculators draft's options: the converter's refusals (draft-speculators-format)
        module = setup_module(setup)
        if module == F.MLA_DRAFT_MODULE and not setup.rf.has_mla_draft:
            return Diagnostics()  # a release without the MLA draft's class: draft-kind-not-served says so
        source = release_reads(setup)[1]
        setup.facts["draft_fields_read_from"] = source
        # a backporting patch on its releases reports its own fields, unless switched off at launch
        read = reads_under_patches(setup)
        return ignored_fields(
            dv.config, read, version=setup.version, source=source, config_path=setup.dcfg(), module=module
        )


PATCH = Eagle3DraftConfigFields()
