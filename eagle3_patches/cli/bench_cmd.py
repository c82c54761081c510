"""``eagle3-patches bench URL [--baseline URL]``: accept length, output tokens/s and latency of a running SGLang server.

Sends the same prompts one at a time (single stream) and ``--concurrency`` at a time, through
sglang's native ``/generate`` (default: its ``meta_info`` carries the accept length) or the
OpenAI ``/v1/completions`` endpoint.  With ``--baseline`` (e.g. the same target without
speculation) the report adds server / baseline ratios from the same run.  A progress bar goes
to stderr; the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import Eagle3Error

EPILOG = """\
examples:
  eagle3-patches bench http://127.0.0.1:30000                      # random prompts, the server's vocabulary
  eagle3-patches bench http://127.0.0.1:30000 --prompts-file prompts.txt --max-new-tokens 256
  eagle3-patches bench http://127.0.0.1:30000 --baseline http://127.0.0.1:30001 --json   # vs no speculation

Exit status 0, or 1 when a request failed.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark a running SGLang server: accept length, output tokens/s, latency",
        description="Send the same prompts to a running SGLang server one at a time and then --concurrency at a "
        "time; report the accept length sglang measured, output tokens/s and latency, and with --baseline the "
        "ratios against a second server measured in the same run.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--baseline", metavar="URL", help="a second server to compare with (e.g. without speculation)")
    p.add_argument(
        "--api",
        choices=["generate", "openai"],
        default="generate",
        help="native /generate (reports accept length) or OpenAI /v1/completions",
    )
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a text prompt (repeatable)")
    p.add_argument("--prompts-file", metavar="PATH", help="one text prompt a line")
    p.add_argument(
        "--random-input-len", type=int, default=8, help="without text prompts: random token-id prompts of this length"
    )
    p.add_argument(
        "--vocab-size", type=int, default=None, help="random prompts draw ids in [4, vocab) (default: the server's)"
    )
    p.add_argument("--num-prompts", type=int, default=8, help="random prompts to send (text prompts are all sent)")
    p.add_argument("--single-requests", type=int, default=None, help="send only the first N prompts single-stream")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight in the concurrent phase (1: skip it)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _server_vocab(url: str) -> int | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/get_model_info", timeout=10) as r:
            info = json.loads(r.read())
        path = info.get("model_path")
        if path:
            from pathlib import Path

            cfg = json.loads((Path(path) / "config.json").read_text())
            return cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    except Exception:  # noqa: BLE001 - a remote server or a hub id: fall back to the flag
        return None
    return None


def run(args) -> int:
    from .. import bench

    prompts = [bench.Prompt(text=t) for t in args.prompt]
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as fh:
            prompts += [bench.Prompt(text=line.rstrip("\n")) for line in fh if line.strip()]
    if not prompts:
        bench.wait_ready(args.url, 60)
        vocab = args.vocab_size or _server_vocab(args.url)
        if not vocab:
            raise Eagle3Error(
                "eagle3-patches bench: cannot tell the server's vocabulary size; pass --vocab-size or --prompt"
            )
        prompts = bench.random_prompts(args.num_prompts, args.random_input_len, vocab, seed=args.seed)
    urls = [args.url] + ([args.baseline] if args.baseline else [])
    report = bench.run(
        urls,
        prompts,
        concurrency=args.concurrency,
        single_requests=args.single_requests,
        progress=not args.no_progress,
        api=args.api,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        timeout=args.timeout,
    )
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(bench.format_table(report))
    failed = any((s.get(p) or {}).get("errors") for s in report["servers"] for p in ("single", "concurrent"))
    return 1 if failed else 0
