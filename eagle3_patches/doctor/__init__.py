"""The preflight doctor: every EAGLE-3 misconfiguration that can be seen before a server loads.

Reads the target's and the draft's ``config.json``, ``model.safetensors.index.json`` and
safetensors headers, and the sglang launch flags; the only tensor data it reads are the
draft's small ``d2t`` / ``t2d``.  Never imports sglang.

    from eagle3_patches.doctor import doctor
    report = doctor("/models/Kimi-K2.5", "/models/Kimi-K2.5-eagle3",
                    launch="python -m sglang.launch_server --tp 8 --speculative-algorithm EAGLE3 ...")
    print(report.format()); report.exit_code        # 0 fine, 1 errors

Each finding (a :class:`~eagle3_patches.diagnostic.Diagnostic`) has a severity, a stable ``code`` (docs/doctor.md
lists them all, with the symptom each prevents), what is wrong, where, what was found and expected, and the fix.
The doctor never raises for a bad checkpoint: unreadable files become findings.

Where things are: :mod:`.run` (the entry points and the order of the checks), :mod:`.context` (what a check reads
and writes), :mod:`.target_checks`, :mod:`.draft_checks` and :mod:`.pairing_checks` (the checks that belong to no
sglang bug; each bug's own rule is its patch module's ``preflight``), :mod:`.pair` (a disaggregated prefill/decode
pair: each side, then what the two must agree on), :mod:`.report` (the report and its forms).
"""

from __future__ import annotations

from .pair import doctor_pair
from .report import MAX_FINDINGS_PER_CODE, PairReport, Report
from .run import check_draft, doctor

__all__ = ["MAX_FINDINGS_PER_CODE", "PairReport", "Report", "check_draft", "doctor", "doctor_pair"]
