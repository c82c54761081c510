"""Every sglang process the tests start passes its memory check whatever else the host allocates meanwhile
(``eagle3_patches/testing/cpu_pools.py``): the real KV-cache profile of the installed sglang, run with the host's
free memory halved during the model load, as another process's allocations would halve it."""

from __future__ import annotations

import pytest

from eagle3_patches.testing import cpu_pools
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.server import CPU_FLAGS

pytestmark = pytest.mark.sglang

#: the share of the host's free memory that other processes take while the model loads
TAKEN_DURING_LOAD = 0.5


def pool_tokens_when_memory_is_taken(target: str, draft: str, mem_fraction_static: float) -> object:
    """The target runner's KV pool (tokens) when ``TAKEN_DURING_LOAD`` of the free memory goes during its model
    load; sglang's refusal as ``(type, message)``."""
    import psutil
    from sglang.srt.model_executor.model_runner import ModelRunner

    from eagle3_patches.testing import sglang_harness as h

    real, loaded = psutil.virtual_memory, []

    def virtual_memory():
        vm = real()
        return vm._replace(available=int(vm.available * (1 - TAKEN_DURING_LOAD))) if loaded else vm

    load_model = ModelRunner.load_model

    def load_model_while_others_allocate(self, *args, **kwargs):
        result = load_model(self, *args, **kwargs)
        loaded.append(True)
        return result

    psutil.virtual_memory = virtual_memory
    ModelRunner.load_model = load_model_while_others_allocate
    sa = h.eagle3_server_args(target, draft, mem_fraction_static=mem_fraction_static)
    try:
        return h.model_runner(sa).max_total_num_tokens
    except (RuntimeError, ValueError) as e:
        return type(e).__name__, str(e)


def test_the_pools_size_is_given_and_survives_others_allocating(tiny):
    tokens = run_isolated(
        pool_tokens_when_memory_is_taken,
        str(tiny["deepseek_v3"]),
        str(tiny["draft"]),
        cpu_pools.MEM_FRACTION_STATIC,
        patches="all",
    )
    assert tokens == cpu_pools.RUNNER_MAX_TOTAL_TOKENS


def test_a_small_fraction_makes_the_check_depend_on_free_memory(tiny):
    """What the fraction guards against: with 0.05 the same drop leaves the KV cache nothing, and sglang refuses."""
    refused = run_isolated(
        pool_tokens_when_memory_is_taken, str(tiny["deepseek_v3"]), str(tiny["draft"]), 0.05, patches="all"
    )
    assert isinstance(refused, tuple), refused
    assert "mem-fraction-static" in refused[1].replace("_", "-"), refused


def test_servers_give_the_pools_size_with_the_same_fraction():
    flags = dict(zip(CPU_FLAGS, CPU_FLAGS[1:]))
    assert flags["--mem-fraction-static"] == str(cpu_pools.MEM_FRACTION_STATIC)
    assert flags["--max-total-tokens"] == str(cpu_pools.SERVER_MAX_TOTAL_TOKENS)
