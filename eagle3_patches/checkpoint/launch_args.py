"""Parse the sglang ``launch_server`` flags the doctor cares about, without importing sglang.

Accepts bare flags (``--tp 8 --speculative-algorithm EAGLE3 ...``) or a whole command
line, as a list or a string: ``python -m sglang.launch_server ...``, ``sglang serve ...``,
and the same wrapped in ``eagle3-patches run -- ...`` / ``python -m eagle3_patches run -- ...``
(which means the patch set is active).  Flags the doctor does not know are kept in
:attr:`LaunchArgs.unknown`; they never cause an error.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import Eagle3ConfigError

#: sglang's ``--speculative-algorithm`` values the doctor judges (``DFLASH``: 0.5.11+, ``speculative/spec_info.py``)
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH")
#: every spelling sglang's ``launch_server`` accepts for the flags the doctor also takes as its own options
#: (``eagle3-patches doctor --tp-size 8`` as well as ``-- --tp-size 8``)
SPELLINGS = {
    "model_path": ("--model-path", "--model"),
    "draft_path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "tp": ("--tensor-parallel-size", "--tp-size", "--tp"),
    "pp": ("--pipeline-parallel-size", "--pp-size", "--pp"),
}


def attention_tp_size(tp: int, dp: int, dp_attention: bool) -> int:
    """The ranks one attention replica spans: ``tp / dp`` under DP attention, else ``tp`` (sglang's
    ``compute_dp_attention_world_info``)."""
    return max(1, tp // max(1, dp)) if dp_attention else tp


class LaunchArgsError(Eagle3ConfigError):
    """The launch command line cannot be understood (a usage error)."""


@dataclass
class LaunchArgs:
    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    tp: int = 1
    pp: int = 1
    dp: int = 1  # --dp-size: with --enable-dp-attention, attention runs on tp / dp ranks per replica
    nnodes: int = 1
    dtype: str = "auto"
    enable_two_batch_overlap: bool = False
    enable_multi_layer_eagle: bool = False  # --enable-multi-layer-eagle (sglang may also turn it on for a model)
    enable_pdmux: bool = False  # --enable-pdmux: prefill / decode multiplexing
    disable_cuda_graph: bool = False
    enable_flashinfer_allreduce_fusion: bool = False
    enable_dp_attention: bool = False
    enable_hierarchical_cache: bool = False  # HiCache: the host tier of the KV cache
    enable_multimodal: bool = False  # --enable-multimodal (sglang's command line only turns it on)
    # the breakable prefill CUDA graph (docs/doctor.md, "image-prefill-graph-crash"): the backend asked for
    # (--cuda-graph-backend-prefill, 0.5.14+), the older switch (--enable-breakable-cuda-graph, 0.5.11+; an alias of
    # the backend from 0.5.19) and the switch that turns the prefill graph off (--disable-prefill-cuda-graph)
    cuda_graph_backend_prefill: str | None = None
    enable_breakable_cuda_graph: bool = False
    disable_prefill_cuda_graph: bool = False
    hicache_storage_backend: str | None = None  # --hicache-storage-backend: HiCache's storage tier (L3)
    hicache_storage_backend_extra_config: str | None = None  # its JSON (or @file) options
    hicache_mem_layout: str | None = None  # --hicache-mem-layout (None: sglang's default)
    moe_a2a_backend: str = "none"
    json_model_override_args: str | None = None
    # what the draft inherits from the target unless told otherwise (docs/doctor.md, "What the draft runs with")
    context_length: int | None = None
    quantization: str | None = None
    draft_quantization: str | None = None  # --speculative-draft-model-quantization ("unquant": none)
    attention_backend: str | None = None
    draft_attention_backend: str | None = None  # --speculative-draft-attention-backend
    # the draft's shape of speculation (None: not given; sglang then chooses all three itself)
    num_steps: int | None = None  # --speculative-num-steps
    eagle_topk: int | None = None  # --speculative-eagle-topk
    num_draft_tokens: int | None = None  # --speculative-num-draft-tokens
    speculative_adaptive: bool = False  # --speculative-adaptive: sglang changes the steps at run time (0.5.11+)
    disable_overlap_schedule: bool = False
    # prefill/decode disaggregation (docs/disaggregation.md)
    disaggregation_mode: str = "null"  # --disaggregation-mode: "prefill", "decode" or "null" (colocated)
    transfer_backend: str = "mooncake"  # --disaggregation-transfer-backend
    page_size: int | None = None  # --page-size (None: sglang chooses it from the attention backend)
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype
    #: the environment assignments in front of the command (``SGLANG_ENABLE_SPEC_V2=1 python -m ...``)
    env: dict[str, str] = field(default_factory=dict)
    with_patches: bool = False  # wrapped in `eagle3-patches run`
    #: what `eagle3-patches run --only NAME` / `--disable NAME` (cli/run_cmd.py) name: run sets the launched
    #: process's ``EAGLE3_PATCHES_APPLY`` / ``_DISABLE`` from them
    run_only: list[str] = field(default_factory=list)
    run_disable: list[str] = field(default_factory=list)
    program: str = ""  # what was recognised: "flags", "python -m sglang.launch_server", ...
    given: set[str] = field(default_factory=set)  # dests set explicitly on the command line
    unknown: list[str] = field(default_factory=list)

    @property
    def attention_tp(self) -> int:
        """The ranks one attention replica spans: ``tp / dp`` under ``--enable-dp-attention``, else ``tp`` (sglang's
        ``compute_dp_attention_world_info``)."""
        return attention_tp_size(self.tp, self.dp, self.enable_dp_attention)

    def as_dict(self) -> dict:
        return dict(
            vars(self),
            given=sorted(self.given),
            unknown=list(self.unknown),
            env=dict(self.env),
            run_only=list(self.run_only),
            run_disable=list(self.run_disable),
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # never exit: a usage error the caller reports
        raise LaunchArgsError(
            "cannot parse the sglang launch flags",
            found=message,
            fix="pass the flags exactly as for `python -m sglang.launch_server`",
        )


def _algorithm(v: str) -> str:
    u = v.strip().upper()
    if u not in ALGORITHMS:
        raise argparse.ArgumentTypeError(f"unknown speculative algorithm {v!r} (sglang knows {', '.join(ALGORITHMS)})")
    return u


def _parser() -> _Parser:
    p = _Parser(prog="sglang.launch_server", add_help=False, allow_abbrev=False)
    a = p.add_argument
    a(*SPELLINGS["model_path"], dest="model_path")
    a(*SPELLINGS["draft_path"], dest="draft_path")
    a("--speculative-algorithm", dest="algorithm", type=_algorithm)
    a(*SPELLINGS["tp"], dest="tp", type=int)
    a(*SPELLINGS["pp"], dest="pp", type=int)
    a("--data-parallel-size", "--dp-size", "--dp", dest="dp", type=int)  # --dp: argparse's abbreviation
    a("--nnodes", dest="nnodes", type=int)
    a("--dtype", dest="dtype")
    a("--enable-two-batch-overlap", dest="enable_two_batch_overlap", action="store_true", default=None)
    a("--enable-multi-layer-eagle", dest="enable_multi_layer_eagle", action="store_true", default=None)
    a("--enable-pdmux", dest="enable_pdmux", action="store_true", default=None)
    a("--disable-cuda-graph", dest="disable_cuda_graph", action="store_true", default=None)
    a(
        "--enable-flashinfer-allreduce-fusion",
        dest="enable_flashinfer_allreduce_fusion",
        action="store_true",
        default=None,
    )
    a("--enable-dp-attention", dest="enable_dp_attention", action="store_true", default=None)
    a("--enable-hierarchical-cache", dest="enable_hierarchical_cache", action="store_true", default=None)
    a("--enable-multimodal", dest="enable_multimodal", action="store_true", default=None)
    a("--cuda-graph-backend-prefill", dest="cuda_graph_backend_prefill")
    a("--enable-breakable-cuda-graph", dest="enable_breakable_cuda_graph", action="store_true", default=None)
    a("--disable-prefill-cuda-graph", dest="disable_prefill_cuda_graph", action="store_true", default=None)
    a("--hicache-storage-backend", dest="hicache_storage_backend")
    a("--hicache-storage-backend-extra-config", dest="hicache_storage_backend_extra_config")
    a("--hicache-mem-layout", dest="hicache_mem_layout")
    a("--moe-a2a-backend", dest="moe_a2a_backend")
    a("--json-model-override-args", dest="json_model_override_args")
    a("--context-length", dest="context_length", type=int)
    a("--quantization", dest="quantization")
    a("--speculative-draft-model-quantization", dest="draft_quantization")
    a("--attention-backend", dest="attention_backend")
    a("--speculative-draft-attention-backend", dest="draft_attention_backend")
    a("--speculative-num-steps", dest="num_steps", type=int)
    a("--speculative-eagle-topk", dest="eagle_topk", type=int)
    a("--speculative-num-draft-tokens", dest="num_draft_tokens", type=int)
    a("--speculative-adaptive", dest="speculative_adaptive", action="store_true", default=None)
    a("--disable-overlap-schedule", dest="disable_overlap_schedule", action="store_true", default=None)
    a("--disaggregation-mode", dest="disaggregation_mode")
    a("--disaggregation-transfer-backend", dest="transfer_backend")
    a("--page-size", dest="page_size", type=int)
    a("--kv-cache-dtype", dest="kv_cache_dtype")
    return p


_PY = re.compile(r"^python(\d+(\.\d+)?)?$")
_PY_OPTS_WITH_ARG = {"-X", "-W", "-Q"}


def _shown(argv: list[str]) -> str:
    """The command line as a finding shows it: its first 200 characters."""
    return " ".join(argv)[:200]


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


def _strip_program(argv: list[str], env: dict[str, str], run: dict[str, list[str]]) -> tuple[list[str], str, bool]:
    """Return (flags, program description, with_patches); the environment assignments in front of the
    program go into ``env``, the patch names `eagle3-patches run --only` / `--disable` give into ``run``."""
    with_patches = False
    i = 0
    while True:
        # environment assignments and `env`
        while i < len(argv) and ((m := _ASSIGNMENT.match(argv[i])) or argv[i] == "env"):
            if m:
                env[m.group(1)] = m.group(2)
            i += 1
        if i >= len(argv):
            return [], "flags", with_patches
        tok = argv[i]
        if tok.startswith("-"):
            return argv[i:], "flags", with_patches
        base = os.path.basename(tok)
        module = None
        if _PY.match(base):
            i += 1
            while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
                i += 2 if argv[i] in _PY_OPTS_WITH_ARG else 1
            if i < len(argv) and argv[i] == "-m":
                if i + 1 >= len(argv):
                    raise LaunchArgsError("`python -m` without a module name", found=_shown(argv))
                module = argv[i + 1]
                i += 2
            elif i < len(argv):
                module = argv[i]  # a script path
                i += 1
            else:
                raise LaunchArgsError("a bare `python` is not a launch command", found=_shown(argv))
        else:
            module = base
            i += 1
        if module in ("eagle3-patches", "eagle3_patches"):
            if i >= len(argv) or argv[i] != "run":
                raise LaunchArgsError(
                    "only `eagle3-patches run -- <command>` can wrap a launch command",
                    found=_shown(argv),
                    fix="pass the sglang command, or `eagle3-patches run -- python -m sglang.launch_server ...`",
                )
            i += 1
            # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: the loop skips the options of `eagle3-patches
            # run`: `-x` or `--name`, whose second character sorts after `-`; an argument that starts with `-` and sorts
            # before `--` is `-` itself or `-` and a punctuation mark, which no option is
            while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
                # run's own options: --only NAME and --disable NAME (or --only=NAME) choose the patch set, the
                # others (--cpu-profile, --probe[=PATH]) take no separate value
                option, eq, value = argv[i].partition("=")
                if option in run:
                    if not eq:
                        i += 1
                        if i >= len(argv):
                            raise LaunchArgsError(
                                f"`eagle3-patches run {option}` without a patch name",
                                found=_shown(argv),
                                fix=f"eagle3-patches run {option} NAME -- <command>",
                            )
                        value = argv[i]
                    run[option].append(value)
                i += 1
            if i < len(argv) and argv[i] == "--":
                i += 1
            with_patches = True
            continue
        if module in ("sglang.launch_server", "launch_server.py") or module.endswith("/launch_server.py"):
            return argv[i:], "python -m sglang.launch_server", with_patches
        if module == "sglang" and i < len(argv) and argv[i] == "serve":
            return argv[i + 1 :], "sglang serve", with_patches
        raise LaunchArgsError(
            "unrecognised launch command",
            found=_shown(argv),
            expected="sglang flags, `python -m sglang.launch_server ...`, `sglang serve ...` or `eagle3-patches run "
            "-- ...`",
            fix="pass the sglang command line (or only its flags) after `--`",
        )


def parse_launch_args(argv: Sequence[str] | str) -> LaunchArgs:
    """Parse sglang launch flags or a whole launch command line."""
    if isinstance(argv, str):
        try:
            argv = shlex.split(argv)
        except ValueError as exc:
            raise LaunchArgsError("cannot split the launch command line", found=str(exc)) from None
    argv = [str(a) for a in argv]
    if argv and argv[0] == "--":
        argv = argv[1:]
    env: dict[str, str] = {}
    run: dict[str, list[str]] = {"--only": [], "--disable": []}
    flags, program, with_patches = _strip_program(argv, env, run)
    ns, unknown = _parser().parse_known_args(flags)
    out = LaunchArgs(
        program=program,
        with_patches=with_patches,
        unknown=unknown,
        env=env,
        run_only=run["--only"],
        run_disable=run["--disable"],
    )
    for k, v in vars(ns).items():
        if v is not None:
            setattr(out, k, v)
            out.given.add(k)
    for k in ("tp", "pp", "dp", "nnodes"):
        if getattr(out, k) < 1:
            raise LaunchArgsError(f"--{k} must be >= 1", found=str(getattr(out, k)))
    return out
