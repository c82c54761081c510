"""``eagle3-patches convert SRC DST``: a speculators-format (or original EAGLE repository) EAGLE-3 draft to SGLang
format.

Exit status: 0 converted, 1 refused or failed (DST untouched), 2 usage error (also: the EAGLE repository's draft
without the target's layer count), 128 + N when
interrupted by signal N (SIGINT, SIGTERM, SIGHUP: the temporary directory is removed first).
"""

from __future__ import annotations

import argparse
import json
import sys

from .._shipped import doc_pointer

EPILOG = f"""\
examples:
  eagle3-patches convert /models/draft-speculators /models/draft-sglang
  eagle3-patches convert SRC DST --target /models/Kimi-K2.5 --max-shard-size 2GB --force
  eagle3-patches convert /models/ea3-draft DST --num-target-layers 32   # an EAGLE repository draft

Streams tensor by tensor (never loads pickles, never writes SRC), writes DST atomically,
re-reads its headers and runs the doctor's draft checks on it. Layer ids are translated
from speculators' meaning (input of layer N) to eagle3-patches' (output of layer N-1); the
original EAGLE repository's draft names none: its ids are computed from the target's layer
count (--target or --num-target-layers), as the repository feeds its draft.
See {doc_pointer("checkpoints")}.
"""


def _ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("empty id list")
    return ids


def _layers(text: str) -> int:
    from ..checkpoint.layer_ids import MAX_LAYERS

    if not text.isdigit() or not 1 <= int(text) <= MAX_LAYERS:
        raise argparse.ArgumentTypeError(f"not a layer count in 1..{MAX_LAYERS}: {text!r}")
    return int(text)


def _size(text: str) -> int:
    from ..convert import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert",
        help="convert a speculators-format or original EAGLE repository EAGLE-3 draft to SGLang format",
        description="Convert a speculators EAGLE-3 draft (Eagle3DraftModel / Eagle3Speculator) or the original EAGLE "
        "repository's EAGLE-3 draft (a LlamaForCausalLM config, safetensors weights) to SGLang's "
        "LlamaForCausalLMEagle3 format.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="the draft directory (read only)")
    p.add_argument("dst", metavar="DST", help="the new SGLang-format draft directory (must not exist unless --force)")
    p.add_argument(
        "--force", action="store_true", help="replace an existing DST (atomically, after the new one is complete)"
    )
    p.add_argument(
        "--max-shard-size",
        type=_size,
        default="5GB",
        metavar="SIZE",
        help="largest output shard, e.g. 5GB (default), 500MB",
    )
    p.add_argument(
        "--aux-layer-ids",
        type=_ids,
        metavar="N,N,N",
        help="override the source's aux layer ids (speculators' meaning: HF hidden_states index)",
    )
    p.add_argument(
        "--drop-embed-tokens",
        action="store_true",
        help="leave out embed_tokens.weight (sglang uses the target's embedding)",
    )
    p.add_argument(
        "--target", metavar="PATH", help="the target checkpoint: also check layer range, hidden and vocab against it"
    )
    p.add_argument(
        "--num-target-layers",
        type=_layers,
        metavar="N",
        help="the target's layer count, where --target is not given (the EAGLE repository's draft needs one of them)",
    )
    p.add_argument(
        "--sglang-version",
        metavar="V",
        help="the sglang release to check the result against (default: the installed one)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..checkpoint.eagle_repo import ConvertUsageError
    from ..checkpoint.releases import parse_version
    from ..convert import convert
    from ..errors import Eagle3Error
    from ..terminal import error_text
    from ..terminal import escape_terminal as esc

    if args.sglang_version is not None:
        try:
            parse_version(args.sglang_version)
        except ValueError as exc:
            print(f"eagle3-patches convert: {exc}", file=sys.stderr)
            return 2
    try:
        res = convert(
            args.src,
            args.dst,
            force=args.force,
            max_shard_size=args.max_shard_size,
            aux_layer_ids=args.aux_layer_ids,
            drop_embed_tokens=args.drop_embed_tokens,
            target=args.target,
            sglang_version=args.sglang_version,
            progress=args.progress,
            num_target_layers=args.num_target_layers,
        )
    except ConvertUsageError as exc:
        print(error_text(exc), file=sys.stderr)
        return 2
    except Eagle3Error as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "src": str(res.src),
                    "dst": str(res.dst),
                    "files": [str(f) for f in res.files],
                    "tensors": res.tensors,
                    "bytes": res.bytes_copied,
                    "seconds": round(res.seconds, 3),
                    "renamed": res.renamed,
                    "dropped": res.dropped,
                    "cleaned": res.cleaned,
                    "serving": res.serving,
                    "config": res.config,
                    "doctor": res.report.to_dict() if res.report is not None else None,
                },
                indent=2,
            )
        )
        return 0
    ec = res.config["eagle_config"]
    src_from = res.config.get("eagle3_patches_converted_from", {})
    print(esc(f"converted {res.src} -> {res.dst}"))
    print(f"  {res.tensors} tensors, {res.bytes_copied / 1e6:.1f} MB in {len(res.files)} file(s), {res.seconds:.2f} s")
    print(
        f"  {len(res.renamed)} renamed (layers.0.* -> midlayer.*)"
        + esc(f", dropped {', '.join(res.dropped)}" if res.dropped else "")
    )
    print(
        f"  aux layer ids {src_from.get('eagle_aux_hidden_state_layer_ids')} ({src_from.get('format')}: input of layer "
        f"N) -> {ec['eagle_aux_hidden_state_layer_ids']} (output of layer N-1)"
    )
    if res.serving:
        print(f"  {res.serving}")
    for note in res.cleaned:
        print(f"  note: {esc(note)}")
    if res.report is not None:
        for f in res.report.warnings:
            print(f"  warning [{f.code}] {esc(f.what)}")
        print(f"  doctor: {len(res.report.errors)} error(s), {len(res.report.warnings)} warning(s)")
    return 0
