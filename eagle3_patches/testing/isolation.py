"""Run a function in a fresh process, as sglang's own workers run (spawned; with the CPU profile forked from a
server that has imported the profile, torch and transformers once and nothing else: :mod:`.preload`).

sglang 0.5.9 keeps process-global state (model-parallel groups, eplb metadata),
so tests build at most one target per process.  The child activates the CPU
profile and the requested eagle3-patches *before* it imports sglang, exactly as
the ``eagle3-patches run`` bootstrap does in a serving process.  Exceptions
raised in the child are re-raised in the parent with their original type.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from . import costs


def _child(fn: Callable[..., Any], args: tuple, kwargs: dict, cpu_profile: bool, patches: Any, env: dict) -> Any:
    if os.environ != env:  # a forkserver's child: the environment of the caller, as a spawned child inherits it
        os.environ.clear()
        os.environ.update(env)
        from eagle3_patches import settings

        settings.reload()  # read once in the server, by the CPU profile
    if cpu_profile:
        from eagle3_patches import cpu

        cpu.activate()
    if patches is not None:
        import eagle3_patches

        eagle3_patches.apply(None if patches == "all" else list(patches))
    from .sglang_harness import quiet

    quiet()
    return fn(*args, **kwargs)


def _context(cpu_profile: bool):
    if cpu_profile and "COVERAGE_PROCESS_CONFIG" not in os.environ:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([f"{__package__}.preload"])
        return ctx
    return multiprocessing.get_context("spawn")


def run_isolated(
    fn: Callable[..., Any],
    *args: Any,
    patches: str | Iterable[str] | None = None,
    cpu_profile: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)`` in a new process; ``patches``: None (stock), "all" or names.  With the CPU profile
    the process is forked from a server that has imported the profile, torch and transformers once (:mod:`.preload`)
    and nothing of sglang or of the patches; else, and where coverage.py measures child processes (it starts
    in a new interpreter only), it is spawned."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=_context(cpu_profile))
    try:
        fut = pool.submit(
            _child,
            fn,
            args,
            kwargs,
            cpu_profile,
            patches if patches in (None, "all") else list(patches),
            {**os.environ, **(env or {})},
        )
        with costs.timed("process", fn=getattr(fn, "__name__", str(fn)), ranks=1):
            return fut.result(timeout=timeout)
    except FutureTimeout:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        raise TimeoutError(
            f"{getattr(fn, '__name__', fn)} did not finish within {timeout}s in its isolated process"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: where :func:`free_port` looks: below the kernel's ephemeral range (32768-60999 by default), from which every
#: outgoing connection on the machine takes its source port, so that none can take the port between the check here
#: and the bind in sglang seconds later (a TP rank's gloo store got "connection reset by peer" and hung when the
#: kernel's port 0 was used with two matrix releases serving side by side); and low enough for the ports sglang
#: derives from a server's ``--port`` (0.5.11: the gRPC port is ``--port + 10000``, at most 65535)
PORT_RANGE = (20000, 32768)


def free_port() -> int:
    """A loopback port nothing listens on now, drawn at random from :data:`PORT_RANGE`."""
    import random
    import socket

    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {PORT_RANGE[0]}-{PORT_RANGE[1] - 1}")


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    patches: str | Iterable[str] | None | list = None,
    cpu_profile: bool = True,
    env: dict[str, str] | list[dict[str, str]] | None = None,
    timeout: float = 600,
    per_rank: bool = False,
) -> list[Any]:
    """``fn(rank, world_size, port, *args)`` in ``world_size`` concurrent spawned processes (one TP rank each).

    ``per_rank=True``: ``patches`` and ``env`` are lists, one entry per rank (a rank started differently
    from the others, as a node of a multi-node server can be)."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=world_size, mp_context=ctx)
    port = free_port()
    ranks = range(world_size)
    patch_list: list[Any] = list(patches or []) if per_rank else [patches] * world_size
    env_list: list[Any] = list(env or []) if per_rank else [env] * world_size
    sel = [p if p in (None, "all") else list(p) for p in patch_list]
    try:
        futures = [
            pool.submit(_child, fn, (rank, world_size, port, *args), {}, cpu_profile, sel[rank], env_list[rank] or {})
            for rank in ranks
        ]
        with costs.timed("process", fn=getattr(fn, "__name__", str(fn)), ranks=world_size):
            return [f.result(timeout=timeout) for f in futures]
    except FutureTimeout:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        raise TimeoutError(
            f"{getattr(fn, '__name__', fn)} did not finish within {timeout}s on {world_size} ranks"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
