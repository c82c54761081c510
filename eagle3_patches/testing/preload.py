"""What the forkserver of :func:`~.isolation.run_isolated` imports once, so that each CPU-profile child does not.

In this order, as a spawned child would: the CPU profile (its environment, which ``torch._dynamo`` and ``triton``
read at import, and its stand-ins, which ``transformers`` looks for at import), then ``torch`` and
``transformers.modeling_utils``, which sglang imports (about 3 of the 5-6 CPU-seconds a child spends importing).
sglang itself is not imported here: a child applies its patches before sglang is imported, as ``eagle3-patches
run`` does in a serving process.
"""

from __future__ import annotations

try:
    from eagle3_patches import cpu

    cpu.activate()
    import torch  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
except Exception:  # noqa: BLE001 - a child meets the same failure, with its message, when it activates the profile
    pass
