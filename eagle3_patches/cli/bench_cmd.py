"""``eagle3-patches bench URL [--baseline URL]``: sglang's serving benchmark against a server and a baseline.

Each server is benchmarked by sglang's own ``bench_serving`` (throughput, latency percentiles, the accept length
sglang reports), single-stream and then ``--concurrency`` in flight, on the same random prompts; with
``--baseline`` (e.g. the same target without speculation) the report adds the server / baseline ratios from the
same run and whether both generated the same texts (``eagle3_patches/bench.py`` says why this is all it adds).
sglang's progress bar and summaries go to stderr; the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

EPILOG = """\
examples:
  eagle3-patches bench http://127.0.0.1:30000                      # random prompts, the server's tokenizer
  eagle3-patches bench http://127.0.0.1:30000 --random-input-len 512 --max-new-tokens 256
  eagle3-patches bench http://127.0.0.1:30000 --baseline http://127.0.0.1:30001 --json   # vs no speculation
  eagle3-patches bench http://127.0.0.1:30000 --serving-args '--dataset-name sharegpt'   # sglang's own flags

Exit status 0, or 1 when a request failed.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="sglang's serving benchmark against a server (and a baseline): accept length, output tokens/s, latency",
        description="Run sglang's own serving benchmark (sglang.bench_serving) against a running SGLang server "
        "single-stream and then --concurrency at a time; report its throughput, latency and accept length, and "
        "with --baseline the ratios against a second server measured in the same run.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--baseline", metavar="URL", help="a second server to compare with (e.g. without speculation)")
    p.add_argument(
        "--api",
        choices=["generate", "openai"],
        default="generate",
        help="sglang's native /generate (its backend `sglang`) or OpenAI /v1/completions (`sglang-oai`)",
    )
    p.add_argument("--num-prompts", type=int, default=8, help="random prompts each phase sends")
    p.add_argument("--random-input-len", type=int, default=8, help="tokens of each random prompt")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated for each prompt (EOS ignored)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight in the concurrent phase (1: skip it)")
    p.add_argument("--tokenizer", metavar="PATH", help="the tokenizer of the prompts (default: the served model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--serving-args",
        default="",
        metavar="'FLAGS'",
        help="more flags for sglang's benchmark, quoted as one argument (e.g. '--dataset-name sharegpt')",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import bench

    report = bench.run(
        [args.url] + ([args.baseline] if args.baseline else []),
        concurrency=args.concurrency,
        api=args.api,
        num_prompts=args.num_prompts,
        input_len=args.random_input_len,
        output_len=args.max_new_tokens,
        seed=args.seed,
        tokenizer=args.tokenizer,
        progress=not args.no_progress,
        extra=shlex.split(args.serving_args),
    )
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(bench.format_table(report))
    failed = any((s.get(p) or {}).get("errors") for s in report["servers"] for p in ("single", "concurrent"))
    return 1 if failed else 0
