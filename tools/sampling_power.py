"""How strong is the lossless check of tests/e2e/test_sampling.py?  The real CPU servers with a correct verify and
with wrong ones, compared with the server without speculation by the same permutation test.

    python tools/sampling_power.py [--samples 96] [--variants correct,stock,accepts-positive,ignores-temperature]

Variants of the EAGLE3 server (the trained tiny draft on the tiny Kimi-K2.5, as in tests/e2e):

* ``correct``: the CPU profile's sampling kernels (eagle3_patches/cpu/spec_sampling.py);
* ``stock``: those kernels switched off (``EAGLE3_PATCHES_DISABLE=cpu_spec_sampling``), stock sglang on CPU: greedy
  verification of sampled requests (0.5.9 - 0.5.12, 0.5.16 on), an error on 0.5.13 - 0.5.15;
* ``accepts-positive``: a tree-sampling kernel that accepts every draft token the target gives any probability;
* ``ignores-temperature``: the verify computes the target's probabilities at temperature 1 whatever the request
  asks (the v1 worker's ``EagleVerifyInput.verify``, 0.5.9 - 0.5.12).

A wrong variant is installed in every server process by a ``sitecustomize`` of this tool's own, which the
library's bootstrap runs after itself; nothing of it is in the library.  Each server answers ``--samples`` copies of
the e2e test's prompt at its two settings; the table gives the accept length and the permutation p-value against
the server without speculation (a variant is caught where p <= 1e-3).  It takes several minutes a server on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "e2e")]

VARIANTS = {
    "correct": "",
    "stock": "",
    "accepts-positive": """
        from eagle3_patches.cpu import spec_sampling

        def kernel(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                   retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                   draft_probs, threshold_single=1.0, threshold_acc=1.0, deterministic=True):
            # every candidate with a positive probability passes: the coin compared with the largest mass there is
            spec_sampling.tree_speculative_sampling_target_only(
                predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                retrive_next_sibling, uniform_samples * 0, uniform_samples_for_final_sampling, target_probs,
                draft_probs, threshold_single, threshold_acc, deterministic)

        spec_sampling.OPS["tree_speculative_sampling_target_only"] = kernel
    """,
    "ignores-temperature": """
        import wrapt

        @wrapt.when_imported("sglang.srt.speculative.eagle_info")
        def _hook(module):
            original = module.EagleVerifyInput.verify

            def verify(self, batch, *args, **kwargs):
                info = batch.sampling_info
                asked = info.temperatures
                info.temperatures = asked * 0 + 1
                try:
                    return original(self, batch, *args, **kwargs)
                finally:
                    info.temperatures = asked

            module.EagleVerifyInput.verify = verify
    """,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--save", help="write every server's sequences to this JSON file")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")

    from e2e_servers import SAMPLED_TOKENS, SAMPLING, SAMPLING_PROMPT

    from eagle3_patches.acceptance import lossless
    from eagle3_patches.testing import tiny_models
    from eagle3_patches.testing.server import Server, mean_accept_length, speculative_flags

    work = Path(tempfile.mkdtemp(prefix="sampling-power-"))
    target = str(tiny_models.build_kimi_k25(work / "tiny-kimi-k25"))
    draft = str(tiny_models.build_trained_eagle3_draft(work))

    def answers(name: str, flags: list[str], env: dict) -> dict[str, list[dict]]:
        server = Server(
            target, [*flags, "--max-running-requests", str(args.samples)], log_path=work / f"{name}.log", env=env
        )
        try:
            server.start()
            return {
                s: server.generate_batch([SAMPLING_PROMPT] * args.samples, SAMPLED_TOKENS, p)
                for s, p in SAMPLING.items()
            }
        finally:
            server.stop()

    print(f"{args.samples} sequences a server and setting; logs in {work}", flush=True)
    plain = answers("no-speculation", [], {})
    saved = {"no-speculation": {s: [r["output_ids"] for r in plain[s]] for s in SAMPLING}}
    rows = []
    for variant in variants:
        env: dict[str, str] = {}
        if variant == "stock":
            env["EAGLE3_PATCHES_DISABLE"] = "cpu_spec_sampling"
        elif VARIANTS[variant]:
            shim = work / f"shim-{variant}"
            shim.mkdir()
            (shim / "sitecustomize.py").write_text(textwrap.dedent(VARIANTS[variant]))
            env["PYTHONPATH"] = str(shim)
        try:
            spec = answers(variant, speculative_flags(draft), env)
        except Exception as exc:  # noqa: BLE001 - a variant that fails is a row of the table
            rows.append((variant, "-", f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"))
            continue
        saved[variant] = {s: [r["output_ids"] for r in spec[s]] for s in SAMPLING}
        for setting in SAMPLING:
            result = lossless.compare(
                [r["output_ids"] for r in spec[setting]], [r["output_ids"] for r in plain[setting]], SAMPLED_TOKENS
            )
            verdict = "caught" if not result.same_distribution else "passes"
            rows.append(
                (
                    f"{variant}, {setting}",
                    f"{mean_accept_length(spec[setting]):.2f}",
                    f"p {result.p_value:.4f} {verdict}",
                )
            )
    if args.save:
        Path(args.save).write_text(json.dumps(saved))
    print("| variant, setting | accept length | against no speculation |")
    print("|---|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
