"""HiCache's storage tier (L3) and the draft's KV pages, on sglang's real code on CPU: the evidence behind
``hicache_draft_kv``'s storage rule (``eagle3_patches/checkpoint/hicache_storage.py``).

:func:`round_trip` runs in a process of its own (``run_isolated``) on a release that keeps a draft pool in HiCache
(0.5.11 - 0.5.18: ``HiCacheController.set_draft_kv_pool``).  It builds the real device and host KV pools of the
Kimi-K2.5 pair (an MLA target pool, a per-head draft pool) and the real ``file`` storage backend, and drives the
real ``HiCacheController`` methods a server's backup and prefetch threads run: ``set_draft_kv_pool`` (which picks
the draft's storage path from the backend's name), ``_page_backup`` (target and draft pages to storage) and
``_page_transfer`` (a prefetch from storage into other host slots).  The controller is made without its
``__init__``, which starts CUDA streams and the transfer threads: the attributes those methods read are set as
``__init__`` and ``attach_storage_backend`` set them, with ``file`` under every backend name, so a name the release
skips for the draft shows what sglang's own choice does, not what that backend's service would.

What is compared: after the prefetch, the host slot's target page and draft page against what the backup wrote.
The draft's slot is filled beforehand with another request's values, as a reused slot is in a server.
:func:`two_ranks` does it for TP ranks 0 and 1 of one server, each backing up through the controller's own backup
thread into one directory, each rank's draft page holding its own heads.  :func:`generic_draft_path` puts the real
classes of two zero-copy backends under 0.5.11 - 0.5.12's generic draft path.  What is not shown here: the
device-host copies (CUDA kernels), the backends' services, and the accept length of a server (no CPU server serves a
prefix back from storage)."""

from __future__ import annotations

from typing import Any


def _controller(backend_name: str, directory: str, page_size: int, tp_rank: int = 0, tp_size: int = 1):
    """A ``HiCacheController`` with the real pools of an MLA target and a per-head draft and the real ``file``
    backend under ``backend_name``, as ``__init__``, ``attach_storage_backend`` and ``set_draft_kv_pool`` leave it
    for TP rank ``tp_rank`` of ``tp_size``."""
    import torch
    from sglang.srt.managers import cache_controller as cc
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    mha_host, mla_host = _host_pools()
    size = 4 * page_size
    target_dev = MLATokenToKVPool(
        size, page_size, torch.float32, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2, device="cpu",
        enable_memory_saver=False,
    )  # fmt: skip
    draft_dev = MHATokenToKVPool(
        size, page_size, torch.float32, head_num=2, head_dim=4, layer_num=1, device="cpu", enable_memory_saver=False
    )
    kw = {"host_to_device_ratio": 2.0, "host_size": 0, "page_size": page_size, "layout": "layer_first"}
    target_host = mla_host(target_dev, pin_memory=False, **kw)
    draft_host = mha_host(draft_dev, pin_memory=False, **kw)
    config = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=False, model_name="tiny",
    )  # fmt: skip

    ctrl = object.__new__(cc.HiCacheController)
    ctrl.page_size = page_size
    ctrl.mem_pool_host = target_host
    ctrl.storage_config = config
    ctrl.storage_backend = HiCacheFile(config, file_path=directory)
    ctrl.storage_backend_type = backend_name
    ctrl.enable_storage = True
    ctrl.enable_storage_metrics = False
    ctrl.storage_batch_size = 128  # attach_storage_backend's (0.5.11, 0.5.12; a module constant from 0.5.13)
    # attach_storage_backend's rule: an MLA target's KV is the same on every rank, so rank 0 alone backs it up
    ctrl.backup_skip = config.is_mla_model and config.tp_rank != 0
    ctrl.page_get_func = ctrl._generic_page_get
    ctrl.page_set_func = ctrl._generic_page_set
    ctrl.has_draft = False
    ctrl.mem_pool_device_draft = ctrl.mem_pool_host_draft = None
    ctrl.set_draft_kv_pool(draft_dev, draft_host)
    return ctrl, target_host, draft_host


def _host_pools():
    """The host pool classes (MHA, MLA): ``mem_cache/memory_pool_host.py`` before 0.5.16, ``mem_cache/pool_host/``
    from it."""
    try:
        from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
    except ImportError:
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    return MHATokenToKVPoolHost, MLATokenToKVPoolHost


def _fill(pool, start: int, value: float) -> None:
    import torch

    pool.set_from_flat_data_page(start, torch.full_like(pool.get_dummy_flat_data_page(), value))


def _page(pool, start: int):
    return pool.get_data_page(start, flat=True).clone()


def _backup(ctrl, first: int, page_size: int, hashes: list[str]) -> None:
    """One page backed up to storage by the controller's own backup thread (``backup_thread_func``)."""
    import queue
    import threading

    import torch
    from sglang.srt.managers import cache_controller as cc

    ctrl.backup_queue, ctrl.ack_backup_queue = queue.Queue(), queue.Queue()
    ctrl.storage_stop_event = threading.Event()
    ctrl.backup_queue.put(
        cc.StorageOperation(torch.arange(first, first + page_size), list(range(page_size)), hash_value=hashes)
    )
    thread = threading.Thread(target=ctrl.backup_thread_func, daemon=True)
    thread.start()
    ctrl.ack_backup_queue.get(timeout=60)
    ctrl.storage_stop_event.set()
    thread.join(timeout=10)


def _prefetch(ctrl, second: int, page_size: int, hashes: list[str]) -> None:
    """The prefetch thread's transfer of those pages from storage into host slot ``second`` (``_page_transfer``)."""
    import inspect

    import torch
    from sglang.srt.managers import cache_controller as cc

    indices, tokens = torch.arange(second, second + page_size), list(range(page_size))
    if "host_indices" in inspect.signature(cc.PrefetchOperation).parameters:
        prefetch = cc.PrefetchOperation("rid", indices, tokens)
    else:  # 0.5.16 on: the host slots are given to the operation once the prefetch is admitted
        prefetch = cc.PrefetchOperation("rid", tokens)
        prefetch.host_indices = indices
    prefetch.hash_value = hashes
    ctrl._page_transfer(prefetch)


def _logs():
    """The controller's log lines from here on, and how to stop keeping them."""
    import logging

    from sglang.srt.managers import cache_controller as cc

    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    cc.logger.addHandler(handler)
    cc.logger.setLevel(logging.DEBUG)
    return logged, lambda: cc.logger.removeHandler(handler)


def round_trip(backend_name: str, directory: str, page_size: int = 4) -> dict[str, Any]:
    """One page backed up to the ``file`` backend in ``directory`` and prefetched into another host slot, with the
    controller told the backend is ``backend_name``.  ``{"target": bool, "draft": bool, "draft_path": str,
    "logged": [str]}``: whether the target's and the draft's page came back equal to what was written, which draft
    path the controller picked, and the controller's log lines (DEBUG included)."""
    import torch

    logged, stop = _logs()
    ctrl, target_host, draft_host = _controller(backend_name, directory, page_size)
    # 0.5.13 on: the path picked per backend (None: skipped); before, one generic path for every backend
    picked = getattr(ctrl, "draft_page_set_func", "generic")
    path = "none" if picked is None else getattr(picked, "__name__", str(picked))

    first, second = 0, page_size  # two host slots: the prefix's first home, and the one it comes back to
    _fill(target_host, first, 1.0)
    _fill(draft_host, first, 2.0)
    written_target, written_draft = _page(target_host, first), _page(draft_host, first)
    hashes = ["prefix-page-0"]
    _backup(ctrl, first, page_size, hashes)
    _fill(target_host, second, -1.0)
    _fill(draft_host, second, -7.0)  # another request's draft KV in the reused slot
    _prefetch(ctrl, second, page_size, hashes)
    stop()
    return {
        "target": bool(torch.equal(_page(target_host, second), written_target)),
        "draft": bool(torch.equal(_page(draft_host, second), written_draft)),
        "draft_path": path,
        "logged": logged,
    }


def two_ranks(directory: str, page_size: int = 4) -> dict[str, Any]:
    """TP 2 beside the MLA target: ranks 0 and 1 each back up the same prefix, their per-head draft pages holding
    their own heads (2.0 and 3.0), through the real backup thread into one ``file`` directory; then rank 1 prefetches
    it.  ``{"rank1_draft": float | None, "rank1_own": bool}``: the value rank 1's draft slot holds after the
    prefetch (one value when the page is uniform), and whether that is rank 1's own page."""
    import torch

    hashes = ["prefix-page-0"]
    pages = {}
    for rank, value in ((0, 2.0), (1, 3.0)):
        ctrl, target_host, draft_host = _controller("file", directory, page_size, tp_rank=rank, tp_size=2)
        _fill(target_host, 0, 1.0)
        _fill(draft_host, 0, value)
        pages[rank] = (ctrl, draft_host, _page(draft_host, 0))
        _backup(ctrl, 0, page_size, hashes)
    ctrl, draft_host, own = pages[1]
    _fill(draft_host, page_size, -7.0)
    _prefetch(ctrl, page_size, page_size, hashes)
    back = _page(draft_host, page_size)
    values = torch.unique(back)
    return {
        "rank1_draft": float(values[0]) if values.numel() == 1 else None,
        "rank1_own": bool(torch.equal(back, own)),
    }


#: the real backend classes whose generic ``batch_set`` / ``batch_get`` the draft's path calls on 0.5.11 - 0.5.12
GENERIC_ERA_STORES = {
    "mooncake": ("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store", "MooncakeStore"),
    "hf3fs": ("sglang.srt.mem_cache.storage.hf3fs.storage_hf3fs", "HiCacheHF3FS"),
}


def generic_draft_path(backend_name: str, page_size: int = 4) -> dict[str, Any]:
    """0.5.11 - 0.5.12: the controller's draft write and read (``_draft_page_set`` / ``_draft_page_get``, what
    ``_page_backup`` and ``_page_transfer`` call beside the target's pages) against the real class of backend
    ``backend_name`` (:data:`GENERIC_ERA_STORES`), made without its ``__init__`` (its service is not here): the
    methods the draft's path calls fail or do nothing before they would reach the service.  ``{"draft": bool,
    "logged": [(level, str)]}``: whether the draft's page came back, and the controller's log lines."""
    import importlib
    import logging

    import torch
    from sglang.srt.managers import cache_controller as cc
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    mha_host, _ = _host_pools()
    module, name = GENERIC_ERA_STORES[backend_name]
    store_cls = getattr(importlib.import_module(module), name)
    logged: list[tuple[str, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append((record.levelname, record.getMessage()))

    handler = Keep(level=logging.DEBUG)
    cc.logger.addHandler(handler)
    cc.logger.setLevel(logging.DEBUG)
    draft_dev = MHATokenToKVPool(
        4 * page_size, page_size, torch.float32, head_num=2, head_dim=4, layer_num=1, device="cpu",
        enable_memory_saver=False,
    )  # fmt: skip
    draft_host = mha_host(
        draft_dev, host_to_device_ratio=2.0, host_size=0, page_size=page_size, layout="layer_first", pin_memory=False
    )
    ctrl = object.__new__(cc.HiCacheController)
    ctrl.page_size = page_size
    ctrl.storage_backend = object.__new__(store_cls)
    ctrl.storage_backend_type = backend_name
    ctrl.enable_storage = True
    ctrl.has_draft = False
    ctrl.set_draft_kv_pool(draft_dev, draft_host)
    draft_host.set_from_flat_data_page(0, torch.full_like(draft_host.get_dummy_flat_data_page(), 2.0))
    written = draft_host.get_data_page(0, flat=True).clone()
    draft_host.set_from_flat_data_page(page_size, torch.full_like(written, -7.0))
    # an exception escaping here would fail the isolated process, and the test, by itself
    ctrl._draft_page_set(["prefix-page-0"], torch.arange(0, page_size))
    ctrl._draft_page_get(["prefix-page-0"], torch.arange(page_size, 2 * page_size))
    cc.logger.removeHandler(handler)
    back = draft_host.get_data_page(page_size, flat=True)
    return {"draft": bool(torch.equal(back, written)), "logged": logged}
