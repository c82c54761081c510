"""``eagle3-patches doctor``: preflight checks of a target + EAGLE-3 draft + sglang launch flags.

Exit status: 0 no errors (warnings allowed), 1 errors found, 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .._shipped import doc_pointer

EPILOG = f"""\
examples:
  eagle3-patches doctor --target /models/Kimi-K2.5 --draft /models/Kimi-K2.5-eagle3
  eagle3-patches doctor --target T --draft D -- --tp 8 --speculative-algorithm EAGLE3
  eagle3-patches doctor -- python -m sglang.launch_server --model-path T \\
      --speculative-algorithm EAGLE3 --speculative-draft-model-path D --tp 8
  eagle3-patches doctor --command "eagle3-patches run -- python -m sglang.launch_server ..." --json
  eagle3-patches doctor --prefill "python -m sglang.launch_server --disaggregation-mode prefill ..." \
      --decode "python -m sglang.launch_server --disaggregation-mode decode ..."

Only config.json, the whole safetensors index and every safetensors header are read, plus
the draft's d2t/t2d (for a pair whose drafts have two paths, both drafts whole); never through a
link that leaves the checkpoint ({doc_pointer("security")}).
Every check, the symptom it prevents and an example report: {doc_pointer("doctor")}.
"""


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {v}")
    return v


def _algorithm(text: str) -> str:
    from ..checkpoint.launch_args import ALGORITHMS

    v = text.strip().upper()
    if v not in ALGORITHMS:
        raise argparse.ArgumentTypeError(f"unknown algorithm {text!r} (choose from {', '.join(ALGORITHMS)})")
    return v


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "doctor",
        help="check a target + EAGLE-3 draft + launch flags before starting a server",
        description="Preflight checks of an EAGLE-3 setup: configs, safetensors headers, d2t, aux layer ids, launch "
        "flags.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from ..checkpoint.launch_args import SPELLINGS

    p.add_argument(
        "--target",
        *SPELLINGS["model_path"],
        dest="target",
        metavar="PATH",
        help="the target checkpoint directory (default: --model-path of the launch flags)",
    )
    p.add_argument(
        "--draft",
        *SPELLINGS["draft_path"],
        dest="draft",
        metavar="PATH",
        help="the draft checkpoint directory (default: --speculative-draft-model-path)",
    )
    p.add_argument(
        "--speculative-algorithm",
        type=_algorithm,
        metavar="ALGO",
        help="EAGLE3, EAGLE, NEXTN, ... (default: the launch flags', else EAGLE3)",
    )
    p.add_argument(
        *SPELLINGS["tp"],
        dest="tp",
        type=_positive,
        metavar="N",
        help="tensor parallel size (default: the launch flags', else 1)",
    )
    p.add_argument(
        *SPELLINGS["pp"],
        dest="pp",
        type=_positive,
        metavar="N",
        help="pipeline parallel size (default: the launch flags', else 1)",
    )
    p.add_argument(
        "--sglang-version", metavar="V", help="the sglang release the server runs (default: the installed one)"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--with-patches",
        dest="with_patches",
        action="store_true",
        default=None,
        help="the server runs under `eagle3-patches run`",
    )
    g.add_argument(
        "--without-patches",
        dest="with_patches",
        action="store_false",
        help="the server runs stock sglang (the default unless the launch command is wrapped in `eagle3-patches run`)",
    )
    p.add_argument(
        "--command", metavar="STRING", help="a whole launch command line as one string (instead of the flags after --)"
    )
    p.add_argument(
        "--prefill",
        metavar="STRING",
        help="a disaggregated pair: the prefill server's whole launch command (with --decode); each side is judged, "
        "then what the two must agree on",
    )
    p.add_argument("--decode", metavar="STRING", help="a disaggregated pair: the decode server's launch command")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="hide notes (info findings)")
    p.add_argument(
        "launch",
        nargs=argparse.REMAINDER,
        metavar="-- LAUNCH",
        help="sglang launch_server flags, or a whole launch command",
    )
    p.set_defaults(func=run)
    return p


def _usage(message: str) -> int:
    print(f"eagle3-patches doctor: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    from ..checkpoint.launch_args import LaunchArgsError, parse_launch_args
    from ..checkpoint.releases import parse_version
    from ..doctor import doctor

    launch_argv = list(args.launch or [])
    if launch_argv and launch_argv[0] == "--":
        launch_argv = launch_argv[1:]
    if args.prefill is not None or args.decode is not None:
        return _run_pair(args, launch_argv)
    if launch_argv and args.command:
        return _usage("give the launch command either after -- or with --command, not both")
    launch = None
    try:
        if args.command:
            launch = parse_launch_args(args.command)
        elif launch_argv:
            launch = parse_launch_args(launch_argv)
    except LaunchArgsError as exc:
        return _usage(str(exc).removeprefix("eagle3-patches: "))
    if args.sglang_version is not None:
        try:
            parse_version(args.sglang_version)
        except ValueError as exc:
            return _usage(str(exc))
    target = args.target or (launch.model_path if launch else None)
    draft = args.draft or (launch.draft_path if launch else None)
    if target is None and draft is None:
        return _usage("nothing to check: pass --target PATH and --draft PATH, or a launch command that names them")
    report = doctor(
        args.target,
        args.draft,
        speculative_algorithm=args.speculative_algorithm,
        tp=args.tp,
        pp=args.pp,
        sglang_version=args.sglang_version,
        launch=launch,
        with_patches=args.with_patches,
    )
    if args.json:
        print(report.to_json())
    else:
        print(report.format(show_info=not args.quiet, color=sys.stdout.isatty()))
    return report.exit_code


def _run_pair(args, launch_argv: list[str]) -> int:
    from ..checkpoint.launch_args import LaunchArgsError
    from ..checkpoint.releases import parse_version
    from ..doctor import doctor_pair

    if args.prefill is None or args.decode is None:
        return _usage("a pair needs both --prefill and --decode (each a whole launch command)")
    own = {
        "--target": args.target,
        "--draft": args.draft,
        "--speculative-algorithm": args.speculative_algorithm,
        "--tp": args.tp,
        "--pp": args.pp,
        "--command": args.command,
        "-- LAUNCH": launch_argv or None,
    }
    clash = [flag for flag, v in own.items() if v is not None]
    if clash:
        return _usage(
            f"with --prefill/--decode, {', '.join(clash)} belong in each side's launch command, not beside them"
        )
    if args.sglang_version is not None:
        try:
            parse_version(args.sglang_version)
        except ValueError as exc:
            return _usage(str(exc))
    try:
        report = doctor_pair(
            args.prefill, args.decode, sglang_version=args.sglang_version, with_patches=args.with_patches
        )
    except LaunchArgsError as exc:
        return _usage(str(exc).removeprefix("eagle3-patches: "))
    if args.json:
        print(report.to_json())
    else:
        print(report.format(show_info=not args.quiet, color=sys.stdout.isatty()))
    return report.exit_code
