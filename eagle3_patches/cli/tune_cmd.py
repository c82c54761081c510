"""``eagle3-patches tune``: the speculative flags that give the most output tokens/s for this draft, this workload and
this device (``eagle3_patches/tune.py`` has the model).

Exit status: 0 a recommendation, 1 what was given cannot give one (the message says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._shipped import doc_pointer
from . import UsageError

EPILOG = f"""\
examples:
  eagle3-patches tune --draft /models/draft --target /models/target --data /data/dump \\
      --calibration 1,1,2=b1.json --calibration 4,1,5=b2.json --calibration 2,4,8=b3.json \\
      --calibration 3,4,16=b4.json --batch-sizes 1,8 --plot tune.svg
  eagle3-patches tune --per-position 0.81,0.62,0.45 --calibration ... # a server's figures: topk 1 only

--calibration STEPS,TOPK,DRAFT_TOKENS=FILE: an `eagle3-patches bench URL --json` report of your server launched
with those flags (at the concurrency of each batch size you ask about); at least four settings, one with topk > 1.
Each gives the time of a decode cycle (concurrency x accept length / output tokens/s) and the cost model's four
parameters are fitted to them. --data / --draft / --target as measure-accept takes them: the draft's own top-k tree
is run on the data for every setting of the grid (steps 1-8, topk 1/2/4/8, draft tokens as each topk allows).
--per-position: a chain's per-position acceptance (measure-accept's, or the server's) instead: topk 1 only, steps up
to the figures given. Greedy verification. What it measures and its limits: {doc_pointer("tune")}.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "tune",
        help="the --speculative-* flags that give the most tokens/s, from measured acceptance and measured cost",
        description="Predict the accept length and output tokens/s of every valid setting of steps 1-8, topk "
        "1/2/4/8 and the draft tokens each topk allows, per batch size, from the draft's own tree on your data and "
        "decode cycles measured on your device; print the table, the recommended flags, and a plot.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--draft", metavar="DIR", help="the draft checkpoint (sglang's layout)")
    p.add_argument("--data", metavar="DIR", help="the target states: a dump or training data (as measure-accept)")
    p.add_argument("--target", metavar="DIR", help="the target checkpoint: its embedding (and head)")
    p.add_argument(
        "--per-position",
        metavar="P1,P2,...",
        help="instead of --draft/--data: a chain's per-position acceptance (topk 1), e.g. measure-accept's",
    )
    p.add_argument(
        "--calibration",
        action="append",
        default=[],
        metavar="S,K,N=FILE",
        help="a bench --json report of the server at --speculative-num-steps S --speculative-eagle-topk K "
        "--speculative-num-draft-tokens N (repeat: at least four settings)",
    )
    p.add_argument("--batch-sizes", metavar="B,...", help="batch sizes to tune for (default: the calibration's)")
    p.add_argument("--max-draft-tokens", type=int, default=64, metavar="N", help="the grid's largest (64)")
    p.add_argument("--max-sequences", type=int, default=1000, metavar="N", help="sequences read at most (1000)")
    p.add_argument("--spec-worker", choices=("v1", "v2"), help="as measure-accept (default: the installed one)")
    p.add_argument("--device", metavar="DEV", help="where the draft runs (default: the first GPU, else the CPU)")
    p.add_argument("--plot", metavar="FILE.svg", help="write the predicted throughput as an SVG plot")
    p.add_argument("--top", type=int, default=12, metavar="N", help="rows shown per batch size (12; --json: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None, help="always a progress bar")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="never a progress bar")
    p.set_defaults(func=run)
    return p


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{flag} {text!r}: expected whole numbers >= 1, comma-separated")
    return values


def calibration(specs: list[str]) -> list:
    from .. import tune

    cycles = []
    for spec in specs:
        flags, sep, path = spec.partition("=")
        numbers = _ints(flags, "--calibration") if sep else []
        if len(numbers) != 3 or not path:
            raise UsageError(f"--calibration {spec!r}: expected STEPS,TOPK,DRAFT_TOKENS=FILE")
        setting = tune.Setting(*numbers)
        if not tune.valid(setting):
            raise UsageError(f"--calibration {spec!r}: {setting.flags()} is not a setting sglang serves as given")
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
            server = report["servers"][0]
            phases = [server[k] for k in ("single", "concurrent") if server.get(k)]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise tune.TuneError(
                "a calibration file is not an `eagle3-patches bench --json` report",
                where=path,
                found=f"{type(exc).__name__}: {exc}"[:200],
                expected="the JSON `eagle3-patches bench URL --json` prints",
                fix="run `eagle3-patches bench URL --json > FILE` against the server launched with those flags",
            ) from None
        cycles += [tune.cycle_from_phase(setting, ph) for ph in phases]
    return cycles


def run(args) -> int:
    from .. import tune

    if args.per_position is None and (args.draft is None or args.data is None):
        raise UsageError("give --draft and --data (the draft's tree on your data) or --per-position")
    if args.per_position is not None and (args.draft or args.data):
        raise UsageError("--per-position replaces --draft / --data: give one or the other")
    if args.max_draft_tokens < 2:
        raise UsageError(f"--max-draft-tokens {args.max_draft_tokens}: expected at least 2")
    if not args.calibration:
        raise UsageError("--calibration: give the bench reports of at least four settings (see the examples)")
    cycles = calibration(args.calibration)
    model = tune.fit(cycles)
    batches = _ints(args.batch_sizes, "--batch-sizes") if args.batch_sizes else sorted({c.batch for c in cycles})
    depths: dict[int, list[float]] = {}
    if args.per_position is not None:
        try:
            figures = [float(x) for x in args.per_position.split(",")]
        except ValueError:
            raise UsageError(f"--per-position {args.per_position!r}: expected numbers, comma-separated") from None
        accept = tune.chain_from_per_position(figures)
    else:
        accept, depths = _from_data(args, tune)
    predictions = tune.predict(accept, model, batches)
    if args.plot:
        Path(args.plot).write_text(tune.svg(predictions), encoding="utf-8")
    if args.json:
        print(tune.to_json(predictions, model, depths))
    else:
        print(tune.format_report(predictions, model, depths, top=args.top))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def _from_data(args, tune) -> tuple[dict, dict]:
    from ..acceptance.measure import load_draft, pick_device, read_states
    from ..acceptance.tree import measure_grid
    from ..checkpoint.formats import read_config
    from .measure_accept_cmd import installed_worker

    pick_device(args.device)
    states = read_states(args.data, read_config(args.draft, "draft"), max_sequences=args.max_sequences)
    forward, hot, _ = load_draft(args.draft, args.target, device=args.device)
    settings = tune.grid(max_draft_tokens=args.max_draft_tokens)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    hist, _ = measure_grid(
        forward,
        hot,
        states,
        [(s.steps, s.topk, s.draft_tokens) for s in settings],
        args.spec_worker or installed_worker(),
        progress=progress,
    )
    accept = {s: tune.accept_length(hist[(s.steps, s.topk, s.draft_tokens)]) for s in settings}
    depths = {}
    for k in tune.TOPKS:  # the widest tree of each topk at the most steps: the depth figures
        widest = max((s for s in settings if s.topk == k), key=lambda s: (s.steps, s.draft_tokens))
        depths[k] = tune.per_depth(hist[(widest.steps, widest.topk, widest.draft_tokens)])
    return accept, depths
