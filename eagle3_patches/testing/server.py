"""Start and stop a real ``sglang.launch_server`` on CPU under ``eagle3-patches run --cpu-profile``.

Used by the e2e tests, the tiny-draft trainer and the CPU demo.  The server runs in its own
process group (``start_new_session``) so that :meth:`Server.stop` kills the launcher, the
scheduler and the detokenizer together; its output goes to a log file that :meth:`Server.log`
reads back (for failures, and for the probe / dump log lines).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from . import costs, cpu_pools
from .isolation import free_port
from .tiny_vl_models import lacks_its_processor

#: flags every CPU server needs (docs/cpu-profile.md, docs/e2e.md)
CPU_FLAGS = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--disable-cuda-graph",
    # spec v2 (the default EAGLE worker from 0.5.11) with the overlap scheduler has no CPU path before 0.5.23,
    # which turns it off on CPU itself ("Overlap schedule is not implemented for speculative decoding on CPU")
    "--disable-overlap-schedule",
    "--grammar-backend",
    "none",
    # the triton decode kernel runs under the interpreter one program per KV split: one split made a plain decode
    # step about 3x and an EAGLE3 cycle about 1.4x faster here (2 cores), with the same greedy tokens
    "--triton-attention-num-kv-splits",
    "1",
    "--skip-server-warmup",
    # the KV pool's size given, not profiled from the host's free memory (cpu_pools says why)
    "--mem-fraction-static",
    str(cpu_pools.MEM_FRACTION_STATIC),
    "--max-total-tokens",
    str(cpu_pools.SERVER_MAX_TOTAL_TOKENS),
    "--random-seed",
    "0",
    "--log-level",
    "info",
]


#: flags of a server of the tiny models on a CUDA device (``eagle3-patches selftest``'s GPU checks): sglang's own
#: defaults otherwise (CUDA graphs, its attention backend), as a user's server runs
GPU_FLAGS = [
    "--mem-fraction-static",
    "0.3",
    "--grammar-backend",
    "none",
    "--skip-server-warmup",
    "--random-seed",
    "0",
    "--log-level",
    "info",
]


def speculative_flags(
    draft: str, algorithm: str = "EAGLE3", steps: int = 3, topk: int = 1, draft_tokens: int = 4
) -> list[str]:
    return [
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(draft_tokens),
    ]


class ServerError(RuntimeError):
    pass


class Server:
    """``wrapper``: start sglang under ``eagle3-patches run --cpu-profile`` (the default; ``device="cuda"``: on the
    GPU, without the CPU profile, :data:`GPU_FLAGS` instead of :data:`CPU_FLAGS`).  ``wrapper=False``
    starts ``python -m sglang.launch_server`` itself, with only the CPU profile's bootstrap on ``PYTHONPATH``
    (``EAGLE3_PATCHES_CPU_PROFILE=1``, no ``EAGLE3_PATCHES_APPLY``): on sglang 0.5.11+ the patches then come in
    through sglang's own plugin entry point alone, as on a GPU host with the package installed.

    ``text_only`` (default: :func:`lacks_its_processor`): a multimodal target served as a language model
    (:mod:`eagle3_patches.testing.text_only_launch`); the model class and its forward are sglang's own either way."""

    def __init__(
        self,
        model: str,
        args: Sequence[str] = (),
        *,
        log_path: os.PathLike,
        env: dict | None = None,
        disable: Sequence[str] = (),
        attention_backend: str = "triton",
        python: str | None = None,
        text_only: bool | None = None,
        wrapper: bool = True,
        device: str = "cpu",
    ):
        from eagle3_patches import _bootstrap, settings

        self.model_name = Path(model).name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        python = python or sys.executable
        if text_only is None:
            text_only = lacks_its_processor(model)
        launcher = ["-m", "eagle3_patches.testing.text_only_launch" if text_only else "sglang.launch_server"]
        self.env = dict(os.environ)
        on_cpu = device == "cpu"
        if on_cpu:
            self.env.setdefault("TRITON_INTERPRET", "1")
        if wrapper:
            run = [python, "-m", "eagle3_patches", "run", *(["--cpu-profile"] if on_cpu else [])]
            for name in disable:
                run += ["--disable", name]
            run.append("--")
        else:
            run = []
            self.env = _bootstrap.child_environment(
                patches="", cpu_profile=on_cpu, disable=list(disable), base=self.env
            )
            del self.env[settings.APPLY]
        self.command = [
            *run,
            python,
            *launcher,
            "--model-path",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *(["--attention-backend", attention_backend, *CPU_FLAGS] if on_cpu else GPU_FLAGS),
            *args,
        ]
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 240.0) -> Server:
        with costs.timed("server", model=self.model_name, refused=False):
            return self._start(timeout)

    def _start(self, timeout: float) -> Server:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode} before it was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/get_model_info", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerError(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float = 240.0) -> int:
        """For a server expected to refuse to start: its exit status (killed after ``timeout``)."""
        with costs.timed("server", model=self.model_name, refused=True):
            return self._wait_exit(timeout)

    def _wait_exit(self, timeout: float) -> int:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return -9

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                # the group may outlive the leader: make sure it is gone
                os.killpg(proc.pid, signal.SIGKILL)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
            break

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def generate(
        self, input_ids: Sequence[int], max_new_tokens: int = 16, timeout: float = 300.0, temperature: float = 0.0
    ) -> dict:
        body = {
            "input_ids": list(input_ids),
            "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        req = urllib.request.Request(
            self.url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: dict,
        timeout: float = 1800.0,
        images: Sequence[Sequence[str] | None] | None = None,
    ) -> list[dict]:
        """``prompts`` in one request (sglang batches them), each with the sampling parameters ``sampling``
        (``temperature``, ``top_k``, ``top_p``, ...; a ``max_new_tokens`` there wins).  ``images``: per prompt, its
        images (data URLs; the prompt holds one media placeholder id per image) or None (text only)."""
        body: dict = {
            "input_ids": [list(p) for p in prompts],
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, **sampling},
        }
        if images is not None:
            body["image_data"] = [list(i) if i else None for i in images]
        req = urllib.request.Request(
            self.url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def metrics(self, timeout: float = 30.0) -> str:
        """sglang's ``/metrics`` page (Prometheus text; the server needs ``--enable-metrics``)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=timeout) as r:
            return r.read().decode()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def held_out_prompts(n: int, seed: int = 4321) -> list[list[int]]:
    """``n`` random prompts of 4-12 token ids of the tiny vocabulary; the draft trainer's prompts come
    from seed 1234.
    """
    import random

    from .tiny_models import VOCAB

    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(rng.randrange(4, 13))] for _ in range(n)]


def mean_accept_length(responses: Sequence[dict]) -> float:
    """Mean over requests of completion tokens / verify steps (sglang's ``meta_info`` figure)."""
    values = [r["meta_info"]["spec_accept_length"] for r in responses]
    return sum(values) / len(values)


def serve(
    model: str,
    args: Sequence[str],
    log_path: os.PathLike,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    metrics: bool = False,
    then: Sequence[tuple] = (),
    **kw,
) -> dict:
    """Start a server, send ``prompts`` one after the other, read ``/metrics`` when asked, stop it.

    Returns ``responses``, ``outputs`` (token ids), ``log``, ``metrics`` (text or None), the ``command`` and
    ``env`` it was started with and the launcher's ``pid``; raises
    :class:`ServerError` with the log's tail when the server does not start or a request fails.

    ``then``: more questions for the same server, ``(name, prompts, temperature)`` each, asked after ``prompts``
    in order, one request a prompt; or ``(name, prompts, sampling parameters)``: the prompts in one batched request;
    or ``(name, prompts, sampling parameters, images)``: the same with each prompt's images
    (:meth:`Server.generate_batch`).
    ``out[name]`` holds their ``responses``, ``outputs`` and the ``metrics`` page read after them (the server's
    counters since its start)."""
    server = Server(model, args, log_path=log_path, **kw)
    more: dict[str, dict] = {}
    try:
        server.start()
        assert server.proc is not None  # started
        pid = server.proc.pid
        responses = [server.generate(p, max_new_tokens, temperature=temperature) for p in prompts]
        page = server.metrics() if metrics else None
        for name, later_prompts, sampling, *images in then:
            if isinstance(sampling, dict):
                later = server.generate_batch(
                    later_prompts, max_new_tokens, sampling, images=images[0] if images else None
                )
            else:
                later = [server.generate(p, max_new_tokens, temperature=sampling) for p in later_prompts]
            more[name] = {
                "responses": later,
                "outputs": [r["output_ids"] for r in later],
                "metrics": server.metrics() if metrics else None,
            }
    except ServerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the log says why
        raise ServerError(f"{type(exc).__name__}: {exc}\n--- log tail ---\n{server.log_tail()}") from exc
    finally:
        server.stop()
    return {
        "responses": responses,
        "outputs": [r["output_ids"] for r in responses],
        "log": server.log(),
        "metrics": page,
        "command": server.command,
        "env": server.env,
        "pid": pid,
        **more,
    }


class DisaggregatedPair:
    """A prefill and a decode server of one model on this machine (``--disaggregation-mode prefill|decode``, sglang's
    mooncake transfer engine over TCP) behind sglang's router (``sglang_router.launch_router --pd-disaggregation``),
    each server started as :class:`Server` starts one.  Use as a context manager; :meth:`generate` asks the router.

    The router answers 503 for a moment after its ``/health`` is up (until its own health check has seen the
    prefill server): :meth:`generate` retries those for up to ``ROUTER_WARMUP_S`` seconds."""

    ROUTER_WARMUP_S = 120.0

    def __init__(
        self,
        model: str,
        prefill_args: Sequence[str],
        decode_args: Sequence[str],
        *,
        log_dir: os.PathLike,
        env: dict | None = None,
        python: str | None = None,
    ):
        log_dir = Path(log_dir)
        self.bootstrap_port = free_port()
        env = {"MOONCAKE_PROTOCOL": "tcp", **(env or {})}  # sglang 0.5.23 reads it; mooncake falls back to TCP anyway
        backend = ["--disaggregation-transfer-backend", "mooncake"]
        self.prefill = Server(
            model,
            ["--disaggregation-mode", "prefill", *backend, "--disaggregation-bootstrap-port", str(self.bootstrap_port)]
            + list(prefill_args),
            log_path=log_dir / "prefill.log",
            env=env,
            python=python,
        )
        self.decode = Server(
            model,
            ["--disaggregation-mode", "decode", *backend, *decode_args],
            log_path=log_dir / "decode.log",
            env=env,
            python=python,
        )
        self.router_log = log_dir / "router.log"
        self.router_port = free_port()
        # the router's Prometheus listener, which binds 0.0.0.0:29000 by default (sglang-router 0.3.2): a port of
        # its own on loopback, so that two pairs (a matrix's releases side by side, a developer's router beside a
        # test run) do not collide ("failed to install Prometheus metrics exporter: ... Address already in use")
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.router_port}"
        self.router_command = [
            python or sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--pd-disaggregation",
            "--prefill",
            self.prefill.url,
            str(self.bootstrap_port),
            "--decode",
            self.decode.url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.router_port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
        ]
        self.router: subprocess.Popen | None = None

    def start(self, timeout: float = 600.0) -> DisaggregatedPair:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:  # the two servers load side by side
            started = [pool.submit(s.start, timeout) for s in (self.prefill, self.decode)]
            for fut in started:
                fut.result()
        log = open(self.router_log, "wb")
        self.router = subprocess.Popen(
            self.router_command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.router.poll() is not None:
                raise ServerError(f"the router exited with {self.router.returncode}:\n{self.router_log.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise ServerError(f"the router is not up after 120 s:\n{self.router_log.read_text()}")

    def generate(self, input_ids: Sequence[int], max_new_tokens: int = 16, timeout: float = 300.0) -> dict:
        """The router's answer to a greedy request; a request the pair refuses raises ``urllib.error.HTTPError``."""
        body = {
            "input_ids": list(input_ids),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        deadline = time.monotonic() + self.ROUTER_WARMUP_S
        while True:
            req = urllib.request.Request(
                self.url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def stop(self) -> None:
        router, self.router = self.router, None
        if router is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(router.pid, signal.SIGKILL)
            router.wait(10)
        self.decode.stop()
        self.prefill.stop()

    def __enter__(self) -> DisaggregatedPair:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
