"""The command line's conventions, for every subcommand: a version, help with a description and examples, usage
errors exit 2, and the doctor's options in every spelling sglang's own parser accepts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle3_patches.checkpoint.launch_args import SPELLINGS, parse_launch_args
from eagle3_patches.cli import build_parser, main
from eagle3_patches.version import __version__


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    return action.choices


def test_version_is_the_packages():
    out = subprocess.run([sys.executable, "-m", "eagle3_patches", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == f"eagle3-patches {__version__}\n"


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_subcommand_has_a_description_and_examples(name):
    sub = _subparsers()[name]
    assert sub.description and len(sub.description) > 40, name
    epilog = sub.epilog or ""
    assert "examples:\n  eagle3-patches " in epilog and f"eagle3-patches {name} " in epilog, name
    assert "examples:" in sub.format_help()


@pytest.mark.parametrize(
    "argv",
    [
        ["nosuch"],
        ["run"],
        ["run", "--probe", "echo", "hi"],
        ["selftest", "--only", "nosuch"],
        ["doctor"],
        ["docs", "nosuch"],
        ["doctor", "--tp-size", "0", "--target", "T"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2, (argv, capsys.readouterr())


@pytest.mark.parametrize("dest", sorted(SPELLINGS))
def test_the_doctor_takes_every_sglang_spelling_of_its_options(dest):
    """``doctor --tp-size 8`` as well as ``doctor -- --tp-size 8``: the same spellings in both places."""
    parser = _subparsers()["doctor"]
    value = "8" if dest in ("tp", "pp") else "/models/x"
    option = {"model_path": "target", "draft_path": "draft"}.get(dest, dest)
    for spelling in SPELLINGS[dest]:
        args = parser.parse_args([spelling, value])
        assert str(getattr(args, option)) == value, spelling
        assert str(getattr(parse_launch_args([spelling, value]), dest)) == value, spelling
