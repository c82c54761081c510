"""``eagle3-patches run [options] -- COMMAND ...``: start COMMAND with the patches active in every process.

The ``opentelemetry-instrument`` / ``ddtrace-run`` pattern: a bootstrap ``sitecustomize``
goes first on PYTHONPATH (chaining to any existing one) and the selection travels in
environment variables, so sglang's ``spawn``-ed scheduler and TP workers apply the same
patches as the launcher.  It does exactly what ``eagle3_patches.apply()`` does by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil

from .._bootstrap import child_environment
from ..errors import Eagle3Error
from . import UsageError

EPILOG = """\
examples:
  eagle3-patches run -- python -m sglang.launch_server --model-path /models/Kimi-K2.5 --tp 8 \\
      --speculative-algorithm EAGLE3 --speculative-draft-model-path /models/Kimi-K2.5-eagle3
  eagle3-patches run --probe=/tmp/probe -- python -m sglang.launch_server ...   # then: probe-report /tmp/probe
  eagle3-patches run --disable eagle3_fc_guard -- python -m sglang.launch_server ...

Every process the command starts (sglang's scheduler and TP workers too) applies the same patches and logs one
line saying which; `eagle3-patches status` shows what each patch does on the installed sglang.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a command (e.g. python -m sglang.launch_server ...) with the patches active",
        description="Start COMMAND with the EAGLE-3 patches active in it and in every process it starts (what "
        "eagle3_patches.apply() does by hand; on sglang 0.5.11 and later the plugin entry point does it without "
        "this wrapper).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="apply only these patches (repeatable)")
    p.add_argument("--disable", action="append", default=[], metavar="NAME", help="never apply this patch (repeatable)")
    p.add_argument("--cpu-profile", action="store_true", help="also activate the CPU profile (machines without a GPU)")
    p.add_argument(
        "--probe",
        nargs="?",
        const="1",
        default=None,
        metavar="PATH",
        help="also apply the diagnostic probe (eagle3_probe): log what flows through the EAGLE-3 path once per "
        "process and forward mode; with --probe=PATH (a directory, or a *.jsonl file) also write JSON lines there "
        "for `eagle3-patches probe-report`; put -- before the command",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=run)


def run(args) -> int:
    command = list(args.command)
    separated = bool(command) and command[0] == "--"
    if separated:
        command = command[1:]
    probe = getattr(args, "probe", None)
    if probe is not None and probe != "1" and not separated:
        # `run --probe python -m ...`: argparse gave the command's first word to --probe
        raise UsageError(
            f"--probe took {probe!r} as the directory for its files; put -- before the command "
            "(eagle3-patches run --probe[=DIR] -- COMMAND ...)"
        )
    if not command:
        raise UsageError("no command given; usage: eagle3-patches run -- python -m sglang.launch_server ...")
    import eagle3_patches

    known = set(eagle3_patches.known_names())
    for name in [*args.only, *args.disable]:
        if name not in known:
            raise UsageError(f"unknown patch {name!r}; known patches: {', '.join(sorted(known))}")
    if probe is not None and probe != "1":
        probe = os.path.abspath(probe)  # the server may change directory
    env = child_environment(
        patches=",".join(args.only) or "all", cpu_profile=args.cpu_profile, disable=args.disable, probe=probe
    )
    executable = shutil.which(command[0], path=env.get("PATH")) or command[0]
    try:
        os.execvpe(executable, command, env)
    except OSError as exc:
        raise Eagle3Error(f"eagle3-patches run: cannot start {command[0]!r}: {exc.strerror}") from None
    return 0  # pragma: no cover - execvpe does not return
