"""``eagle3-patches measure-accept --draft D --data DIR``: the accept length a draft should reach, measured offline.

Exit status: 0 measured, 1 the draft or the data cannot be measured (the message says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .._shipped import doc_pointer
from . import UsageError

EPILOG = f"""\
examples:
  eagle3-patches measure-accept --draft /models/draft --target /models/target --data /data/dump
  eagle3-patches measure-accept --draft /models/draft --target /models/target --data /data/hidden_states --json
  eagle3-patches measure-accept --draft /models/draft --target /models/target --data /data/dump --device cuda:1
  eagle3-patches measure-accept --draft /models/draft --target /models/target --data /data/specforge --temperature 0.6

--data is a hidden_state_dump of a known-good server serving greedily (EAGLE3_PATCHES_DUMP_DIR, with
--disable-radix-cache), or the offline hidden states the draft was trained on (SpecForge's or
speculators' files). --target gives the embedding (and the head, where the draft has none), as sglang
shares them. It prints the expected accept length and per position k how often draft token k would be
accepted, topk 1, greedy (temperature 0) unless --temperature, and the draft config field that states
the figure; the watchdog compares a running server with it. At --temperature T it gives sglang's default
verify (the draft's argmax x accepted with the target's probability q(x) at T, after --top-k / --top-p)
and, beside it, --speculative-use-rejection-sampling's (sum of min(p, q) per position); it needs the
target's distribution: --target's lm_head and data with the target's final states (a dump written with
EAGLE3_PATCHES_DUMP_FINAL_STATES=1, or SpecForge's files). The draft runs on the first GPU (else the CPU:
a Kimi-K2.5-sized draft does a few tokens a second there, days for 1M tokens). Symptoms and what to do:
{doc_pointer("troubleshooting")}.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "measure-accept",
        help="measure a draft's expected accept length offline, on target hidden states you trust",
        description="Run the draft teacher-forced on target hidden states (a hidden_state_dump of a known-good "
        "server, or the offline training data of SpecForge or speculators) and replay sglang's verification (topk "
        "1), greedy or at --temperature: the expected accept length and per-position acceptance at "
        "--speculative-num-steps.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--draft", required=True, metavar="DIR", help="the draft checkpoint (sglang's layout)")
    p.add_argument("--data", required=True, metavar="DIR", help="the target states: a dump or training data")
    p.add_argument(
        "--target",
        metavar="DIR",
        help="the target checkpoint: its embedding (and head, where the draft has none), as sglang shares them",
    )
    p.add_argument(
        "--speculative-num-steps", dest="steps", type=int, default=3, metavar="N", help="draft steps (default 3)"
    )
    p.add_argument("--speculative-eagle-topk", dest="topk", type=int, default=1, metavar="K", help="only 1 is replayed")
    p.add_argument(
        "--speculative-num-draft-tokens",
        dest="draft_tokens",
        type=int,
        metavar="N",
        help="draft tokens per verify step (topk 1: steps + 1, the default)",
    )
    p.add_argument(
        "--spec-worker",
        choices=("v1", "v2"),
        help="the sglang draft worker to replay (they run draft steps after the first one position apart): v1 "
        "(EAGLEWorker) or v2 (EAGLEWorkerV2, SGLANG_ENABLE_SPEC_V2); default: the one the installed sglang runs "
        "with this environment",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="the requests' temperature the figure holds at (default 0: greedy); above 0 it needs --target and data "
        "with the target's final states",
    )
    p.add_argument("--top-k", type=int, metavar="K", help="the requests' top-k, at --temperature > 0 (default: none)")
    p.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="the requests' top-p, at --temperature > 0 (default 1)"
    )
    p.add_argument("--max-sequences", type=int, default=1000, metavar="N", help="sequences read at most (1000)")
    p.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="stop reading after the sequence at which N tokens were read (default: no bound but --max-sequences)",
    )
    p.add_argument(
        "--device",
        metavar="DEV",
        help="where the draft runs: cpu, cuda or cuda:N (default: the first visible GPU, else the CPU)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="the draft's weights and activations: auto (default) is float32 on the CPU and on a GPU the dtype the "
        "draft's config states, as sglang serves it",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def installed_worker(environ=None) -> str:
    """The draft worker the installed sglang runs with ``environ``: v2 where it is the only one (from 0.5.13, and
    without an installed sglang), else ``SGLANG_ENABLE_SPEC_V2`` as sglang parses it, else the release's default
    (v2 from 0.5.11)."""
    import os

    from ..checkpoint.releases import ONE_WORKER_FROM, SPEC_V2, spec_v2_on
    from ..sglang_version import base_release, installed_sglang_version

    installed = installed_sglang_version()
    if installed is None or base_release(installed) >= ONE_WORKER_FROM:
        return "v2"
    return "v2" if spec_v2_on((os.environ if environ is None else environ).get(SPEC_V2), installed) else "v1"


def run(args) -> int:
    if args.topk != 1:
        raise UsageError("--speculative-eagle-topk: only topk 1 is replayed (tree drafts are not); measure at 1")
    if not 1 <= args.steps <= 16:
        raise UsageError(f"--speculative-num-steps {args.steps}: expected 1..16")
    draft_tokens = args.steps + 1 if args.draft_tokens is None else args.draft_tokens
    if draft_tokens != args.steps + 1:
        raise UsageError(
            f"--speculative-num-draft-tokens {draft_tokens}: with topk 1 sglang uses steps + 1 = {args.steps + 1}"
        )
    for flag, value in (("--max-sequences", args.max_sequences), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: expected at least 1")
    from ..acceptance.sampling import MAX_TEMPERATURE, Sampling

    if not 0.0 <= args.temperature <= MAX_TEMPERATURE:  # NaN fails both
        raise UsageError(f"--temperature {args.temperature}: expected 0 (greedy) .. {MAX_TEMPERATURE:g}")
    if args.temperature == 0.0 and (args.top_k is not None or args.top_p != 1.0):
        raise UsageError("--top-k and --top-p apply at --temperature above 0 (temperature 0 is greedy)")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k {args.top_k}: expected at least 1")
    if not 0.0 < args.top_p <= 1.0:
        raise UsageError(f"--top-p {args.top_p}: expected 0 < P <= 1")
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    from ..acceptance.measure import load_draft, load_target_head, pick_device, read_states, replay
    from ..checkpoint.formats import read_config

    pick_device(args.device)  # a device this machine lacks is refused before anything is read
    if not sampling.greedy and args.target is None:
        load_target_head(None, None)  # the refusal: --temperature needs --target's lm_head
    # the data first: data that cannot give what was asked for is refused before the draft is loaded
    states = read_states(
        args.data,
        read_config(args.draft, "draft"),
        max_sequences=args.max_sequences,
        max_tokens=args.max_tokens,
        final=not sampling.greedy,
    )
    forward, hot, config = load_draft(args.draft, args.target, device=args.device, dtype=args.dtype)
    head = None if sampling.greedy else load_target_head(args.target, forward.params["fc.weight"])
    progress = sys.stderr.isatty() if args.progress is None else args.progress  # by default on a terminal
    worker = args.spec_worker or installed_worker()
    result = replay(forward, hot, states, args.steps, worker, progress=progress, sampling=sampling, head=head)
    print(result.to_json(draft_tokens) if args.json else result.format(draft_tokens))
    return 0
