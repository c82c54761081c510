"""What a patch's preflight rule sees: one server setup, read from files and flags only.

The doctor (``eagle3-patches doctor``) builds a :class:`Setup` from the target's and the draft's
``config.json``, their safetensors headers, the sglang launch flags and the sglang release, then runs
every patch's :meth:`~eagle3_patches.registry.Patch.preflight` rule on it next to its own checks of
the checkpoints (the checks that belong to no sglang bug).  Nothing here imports sglang or torch.

:func:`run_rules` applies the one policy for a problem a patch covers
(:meth:`~eagle3_patches.registry.Patch.when_patched`): where the server runs under eagle3-patches and the patch
applies to the release, a problem the patch *fixes* becomes a note, and one it *refuses* stays an error that says
the launch will stop at start with this library's message.  The patch set is the setup's (:attr:`Setup.patches`,
handed in by the doctor), so this layer never reaches up for the registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from packaging.version import Version

from . import settings
from .checkpoint import layer_ids as L
from .checkpoint.draft_kind import evidence
from .checkpoint.formats import SGLANG_EAGLE3, DraftView, TargetView
from .checkpoint.launch_args import LaunchArgs
from .checkpoint.releases import ReleaseFacts
from .checkpoint.safetensors_header import TensorInfo
from .diagnostic import Diagnostic
from .registry import Patch

_T = TypeVar("_T")


class PatchSetup(Protocol):
    """What a patch's preflight rule (and its ``when_patched``) may read of a :class:`Setup`: every patch annotates
    its ``setup`` parameter with this, so mypy refuses a rule that reads anything else, and the doctor may change the
    rest of :class:`Setup` without reading every patch.  Read-only, but for :attr:`facts`, where a rule may add what
    the report shows."""

    @property
    def version(self) -> Version: ...  # the sglang release
    @property
    def rf(self) -> ReleaseFacts: ...
    @property
    def algorithm(self) -> str | None: ...
    @property
    def launch(self) -> LaunchArgs: ...
    @property
    def with_patches(self) -> bool: ...  # the server runs under eagle3-patches
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def checkpoint_only(self) -> bool: ...  # only the checkpoints are judged (the converter's check of its output)
    @property
    def target(self) -> TargetView | None: ...
    @property
    def draft(self) -> DraftView | None: ...
    @property
    def draft_dir(self) -> Path | None: ...
    @property
    def draft_tensors(self) -> Mapping[str, TensorInfo]: ...  # canonical name -> info
    @property
    def draft_raw_names(self) -> Mapping[str, str]: ...  # canonical -> raw name
    @property
    def draft_weights_read(self) -> bool: ...
    @property
    def draft_naming(self) -> Mapping[str, list[str]]: ...  # naming kind -> raw names
    @property
    def facts(self) -> dict[str, Any]: ...  # what the report shows besides findings
    @property
    def patches(self) -> Mapping[str, Patch]: ...  # the patch set whose rules run, by name
    @property
    def settings(self) -> settings.Settings: ...  # the eagle3-patches settings of the launch's environment
    @property
    def eagle3(self) -> bool: ...
    @property
    def once_eagle3(self) -> str: ...
    @property
    def draft_view(self) -> DraftView: ...  # the draft's config, for a rule that runs only once it is loaded
    @property
    def target_view(self) -> TargetView: ...
    def patched(self, name: str) -> bool: ...
    def draft_is_eagle3(self) -> tuple[bool, str]: ...
    def fc_input(self) -> tuple[int | None, int]: ...
    def capture(self) -> L.Capture | None: ...
    def dcfg(self, key: str = "") -> str: ...
    def tcfg(self, key: str = "", *, top: bool = False) -> str: ...
    def draft_tensor_where(self, name: str) -> str: ...


@dataclass
class Setup:
    version: Any  # the sglang release (packaging Version)
    rf: ReleaseFacts
    algorithm: str | None
    launch: LaunchArgs
    with_patches: bool  # the server runs under eagle3-patches
    tp: int
    pp: int
    checkpoint_only: bool = False  # only the checkpoints are judged (the converter's check of its output)
    target_dir: Path | None = None
    target: TargetView | None = None
    target_tensors: dict[str, TensorInfo] = field(default_factory=dict)  # embed_tokens / lm_head only
    draft_dir: Path | None = None
    draft: DraftView | None = None
    draft_tensors: dict[str, TensorInfo] = field(default_factory=dict)  # canonical name -> info
    draft_raw_names: dict[str, str] = field(default_factory=dict)  # canonical -> raw name
    draft_weights_read: bool = False
    draft_naming: dict[str, list[str]] = field(default_factory=dict)  # naming kind -> raw names
    facts: dict[str, Any] = field(default_factory=dict)  # what the report shows besides findings
    #: the patch set whose preflight rules run on this setup, by name (the doctor hands in the registry's)
    patches: dict[str, Patch] = field(default_factory=dict)
    #: the eagle3-patches settings the server runs with, read from the launch's environment (the doctor hands in
    #: those of ``doctor.context.launch_environ``): every verdict that depends on a setting reads them here
    settings: settings.Settings = field(default_factory=settings.Settings)
    _capture: Any = field(default=None, repr=False)

    def patched(self, name: str) -> bool:
        """The server runs under eagle3-patches, patch ``name`` applies to this release and the launch's settings
        select it (:attr:`settings`: ``EAGLE3_PATCHES_APPLY`` / ``_ENABLE`` / ``_DISABLE``)."""
        patch = self.patches[name]
        return self.with_patches and patch.covers(self.version) and self.settings.selects(name, patch.default_enabled)

    # -- the loaded parts: a check that reads one runs only once it is loaded (the doctor's order), so a None here
    # is a bug in that order, reported by the doctor's guard as an internal error, never a user's mistake
    @property
    def draft_view(self) -> DraftView:
        return _loaded(self.draft, "the draft's config")

    @property
    def target_view(self) -> TargetView:
        return _loaded(self.target, "the target's config")

    @property
    def draft_path(self) -> Path:
        return _loaded(self.draft_dir, "the draft's directory")

    @property
    def target_path(self) -> Path:
        return _loaded(self.target_dir, "the target's directory")

    @property
    def eagle3(self) -> bool:
        """Capture will run: EAGLE3, or EAGLE/NEXTN with an EAGLE-3 draft (judged as after the fix to EAGLE3)."""
        if self.algorithm == "EAGLE3":
            return True
        return self.algorithm in ("EAGLE", "NEXTN") and self.draft_is_eagle3()[0]

    @property
    def once_eagle3(self) -> str:
        return "" if self.algorithm == "EAGLE3" else " (once --speculative-algorithm is EAGLE3)"

    def draft_is_eagle3(self) -> tuple[bool, str]:
        """(the draft is an EAGLE-3 draft, the evidence)."""
        dv = self.draft
        if dv is None:
            return False, ""
        why = evidence(dv.config, self.draft_shapes())
        return (True, why) if why else (False, f"{dv.format} ({', '.join(dv.architectures) or '?'})")

    def draft_shapes(self) -> dict[str, tuple[int, ...]]:
        """The draft's tensors as stored: raw name -> shape (what :mod:`.checkpoint.draft_layouts` reads)."""
        return {self.draft_raw_names[c]: t.shape for c, t in self.draft_tensors.items() if c in self.draft_raw_names}

    def fc_input(self) -> tuple[int | None, int]:
        """(the target hidden size the draft's fc is fed, the number of aux states k): fc takes k x that."""
        dv = self.draft_view
        hidden = self.target.hidden if self.target and self.target.hidden else dv.effective_target_hidden
        return hidden, len(dv.aux_ids) if dv.aux_ids else 3

    def capture(self) -> L.Capture | None:
        """What this release captures for the draft's configured ids
        (:class:`~eagle3_patches.checkpoint.layer_ids.Capture`), or None when the draft states no ids in sglang's
        format."""
        dv = self.draft
        if dv is None or not dv.is_eagle3 or dv.format != SGLANG_EAGLE3 or not dv.aux_ids:
            return None
        key = (tuple(dv.aux_ids), self.target.num_layers if self.target else None, str(self.version))
        if self._capture is None or self._capture[0] != key:
            self._capture = (key, L.what_captures(dv.aux_ids, key[1], self.version))
        return self._capture[1]

    def dcfg(self, key: str = "") -> str:
        """``where`` for a draft config field."""
        base = str(self.draft_dir / "config.json") if self.draft_dir else "draft config.json"
        return f"{base}: {key}" if key else base

    def tcfg(self, key: str = "", *, top: bool = False) -> str:
        base = str(self.target_dir / "config.json") if self.target_dir else "target config.json"
        prefix = self.target.text_prefix if self.target and not top else ""
        return f"{base}: {prefix}{key}" if key else base

    def draft_tensor_where(self, name: str) -> str:
        t = self.draft_tensors[name]
        return f"{self.draft_path / t.file}: {self.draft_raw_names[name]}"


def _loaded(value: _T | None, what: str) -> _T:
    if value is None:
        raise RuntimeError(f"{what} was read by a check that runs before it is loaded")
    return value


def run_rules(setup: Setup, add: Callable[[Diagnostic], Any], guard: Callable[[str, Callable[[], None]], None]) -> None:
    """The preflight rule of every patch of ``setup.patches`` on ``setup``; ``add`` records a diagnostic,
    ``guard(label, fn)`` runs ``fn`` turning an unexpected exception into a finding (a rule never breaks the doctor)."""
    view: PatchSetup = setup  # mypy holds Setup to the interface the patches are typed against
    for patch in setup.patches.values():

        def one(patch: Patch = patch) -> None:
            for d in patch.preflight(view):
                add(patch.when_patched(d, view) if setup.patched(patch.name) else d)

        guard(patch.name, one)
