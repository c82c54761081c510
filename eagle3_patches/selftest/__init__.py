"""``eagle3-patches selftest``: the upgrade regression check, run on the user's own install and device.

After an upgrade of sglang (or torch, flashinfer, ...) it answers, before production restarts: does
EAGLE-3 still get ``[tokens, 3 x hidden]`` into the draft's ``fc`` with this sglang, and which of this
library's patches are still needed.  For each patch it observes the bug on stock sglang (a process where
no patch is applied) and the behaviour with the patch set on, on tiny Kimi-K2.5 / DeepSeek-V3 targets and
EAGLE-3 drafts built locally; on a CUDA device also what only a GPU shows (CUDA graphs, the user's
attention backend and dtype, real quantization kernels, TP 2 over NCCL).

* :mod:`.checks` - the checks (what each proves; the tests call the same functions);
* :mod:`.scenarios`, :mod:`.device_scenarios` - what they make sglang do, inside isolated processes;
* :mod:`.base` - findings, verdicts, the per-check context; :mod:`.runner` and :mod:`.report` - the command.

Procedure and output: docs/upgrading.md (``eagle3-patches docs upgrading``).
"""

from .base import (
    FAILED,
    PASSED,
    SKIPPED,
    Check,
    Context,
    Device,
    Finding,
    Result,
    Skip,
    execute,
)
from .checks import BY_NAME, CHECKS
from .runner import run_selftest

__all__ = [
    "CHECKS",
    "BY_NAME",
    "Check",
    "Context",
    "Device",
    "Finding",
    "Result",
    "Skip",
    "execute",
    "run_selftest",
    "PASSED",
    "FAILED",
    "SKIPPED",
]
