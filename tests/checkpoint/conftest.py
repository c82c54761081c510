"""Builders of faulty checkpoints for the doctor and converter tests.

Everything is derived from the tiny checkpoints of ``eagle3_patches.testing.tiny_models``:
a draft is rebuilt from its spec with config / tensor edits (no tokenizer: the doctor
never reads one), a target variant is the tiny target's config.json edited, next to a
hard link to (or copy of) its unchanged weights: a symlink out of the checkpoint directory
is refused by the doctor (docs/security.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from eagle3_patches.testing import tiny_models as tm


def _merge(cfg: dict, edit) -> dict:
    if edit is None:
        return cfg
    if callable(edit):
        out = edit(cfg)
        return cfg if out is None else out
    for key, value in edit.items():
        if value is _DELETE:
            cfg.pop(key, None)
        elif isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = _merge(cfg[key], value)
        else:
            cfg[key] = value
    return cfg


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


_DELETE = _Delete()


@pytest.fixture(scope="session")
def DELETE():
    """Marker for ``config`` edits: remove this key."""
    return _DELETE


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (a copy across filesystems): a file inside dst's checkpoint."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


@pytest.fixture(scope="session")
def link_file():
    """:func:`link_or_copy` for tests (conftest modules are not importable by name)."""
    return link_or_copy


def write_checkpoint(path: Path, config: dict | str, tensors: dict, *, shards: int = 1) -> Path:
    """config.json (a dict, or raw text) + safetensors (``shards`` > 1: sharded with an index)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config, indent=2))
    names = sorted(tensors)
    if shards == 1:
        save_file(
            {k: tensors[k].contiguous() for k in names}, str(path / "model.safetensors"), metadata={"format": "pt"}
        )
        return path
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k].contiguous() for k in part}, str(path / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.fixture
def make_draft(tmp_path) -> Callable[..., Path]:
    """``make_draft(name, spec=..., config=edit, tensors=edit, speculators=False, shards=1)`` -> path."""

    def make(
        name: str = "draft",
        spec: tm.TinyDraftSpec = tm.TinyDraftSpec(),
        config=None,
        tensors: Callable[[dict], dict | None] | None = None,
        speculators: bool = False,
        shards: int = 1,
    ) -> Path:
        cfg = tm.speculators_config(spec) if speculators else tm.eagle3_draft_config(spec)
        cfg = _merge(copy.deepcopy(cfg), config)
        t = tm.eagle3_draft_tensors(spec, midlayer_prefix="layers.0." if speculators else "midlayer.")
        if tensors is not None:
            out = tensors(t)  # edits in place, or returns a new dict
            t = out if isinstance(out, dict) else t
        return write_checkpoint(tmp_path / name, cfg, t, shards=shards)

    return make


@pytest.fixture
def make_mla_draft(tmp_path) -> Callable[..., Path]:
    """``make_mla_draft(name, config=edit, tensors=edit)`` -> an MLA EAGLE-3 draft (``Eagle3DeepseekV2ForCausalLM``)."""

    def make(name: str = "mla-draft", config=None, tensors: Callable[[dict], dict | None] | None = None) -> Path:
        cfg = _merge(copy.deepcopy(tm.mla_draft_config()), config)
        t = tm.mla_draft_tensors()
        if tensors is not None:
            out = tensors(t)
            t = out if isinstance(out, dict) else t
        return write_checkpoint(tmp_path / name, cfg, t)

    return make


@pytest.fixture
def make_target(tmp_path, tiny) -> Callable[..., Path]:
    """``make_target(kind="deepseek_v3"|"kimi_k25", config=edit)``: edited config.json + hard-linked weights."""

    def make(kind: str = "deepseek_v3", config=None, name: str | None = None) -> Path:
        src = tiny[kind]
        dst = tmp_path / (name or f"target-{kind}")
        dst.mkdir()
        cfg = _merge(json.loads((src / "config.json").read_text()), config)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
        link_or_copy(src / "model.safetensors", dst / "model.safetensors")
        return dst

    return make


@pytest.fixture
def cli(capsys):
    """Run a doctor/convert subcommand through a local argparse (as the real CLI wires it)."""
    from eagle3_patches.cli import convert_cmd, doctor_cmd
    from eagle3_patches.errors import Eagle3Error

    def run(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser(prog="eagle3-patches")
        sub = parser.add_subparsers(dest="command")
        sub.required = True
        doctor_cmd.add_parser(sub)
        convert_cmd.add_parser(sub)
        try:
            args = parser.parse_args([str(a) for a in argv])
            rc = args.func(args)
        except SystemExit as exc:  # argparse usage errors
            rc = exc.code
        except Eagle3Error as exc:
            print(str(exc))
            rc = 1
        out, err = capsys.readouterr()
        return rc, out, err

    return run
