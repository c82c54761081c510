"""How big sglang's memory pools are in every CPU process the tests, the demo and the benchmarks start.

sglang sizes its KV cache from the device's free memory, measured before and after the model load: what the load
took is what became resident, and the pool gets what is left less ``(1 - mem_fraction_static)`` of the free memory
seen before the load (0.5.9 ``ModelRunner.profile_max_num_token``; 0.5.23
``KVCacheConfigurator._profile_available_bytes``, which refuses to start when nothing is left).  On CPU the device
is the host: whatever any other process allocates during the load counts as this one's weights.  With a fraction
of 0.05 the check had 5 % of the host's free memory to spare, and a test's verdict depended on what else ran.

So the pool's size is given explicitly (``max_total_tokens``: sglang takes the smaller of it and the profiled
value) and the fraction is high enough that the profile always exceeds it: the check fails only when other
processes take 90 % of the host's free memory during one model load.  ``tests/unit/test_cpu_pools.py`` runs the
real profile of the installed sglang with the host's free memory dropping meanwhile.
"""

from __future__ import annotations

#: the fraction of the free memory seen before the model load that weights and KV cache may use
MEM_FRACTION_STATIC = 0.9
#: the KV pool of a real server (tokens)
SERVER_MAX_TOTAL_TOKENS = 4096
#: the KV pool of an in-process model runner (:mod:`.sglang_harness`; tokens)
RUNNER_MAX_TOTAL_TOKENS = 1024
