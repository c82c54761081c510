"""How strong is the lossless check of tests/e2e/test_sampling.py?  The real CPU servers with a correct verify and
with wrong ones, compared with the server without speculation by the same permutation test.

    python tools/sampling_power.py [--samples N] [--variants correct,stock,accepts-positive,ignores-temperature]

Variants of the EAGLE3 server (the trained tiny draft on the tiny Kimi-K2.5, as in tests/e2e):

* ``correct``: the CPU profile's sampling kernels (eagle3_patches/cpu/spec_sampling.py);
* ``stock``: those kernels switched off (``EAGLE3_PATCHES_DISABLE=cpu_spec_sampling``), stock sglang on CPU: greedy
  verification of sampled requests (0.5.9 - 0.5.12, 0.5.16 on), an error on 0.5.13 - 0.5.15;
* ``accepts-positive``: a tree-sampling kernel that accepts every draft token the target gives any probability;
* ``ignores-temperature``: the verify computes the target's probabilities at temperature 1 whatever the request
  asks (the v1 worker's ``EagleVerifyInput.verify``, 0.5.9 - 0.5.12).

A wrong variant is installed in every server process by a ``sitecustomize`` of this tool's own, which the
library's bootstrap runs after itself; nothing of it is in the library.  Each server answers ``--samples`` copies of
the e2e test's prompt at each of its settings; the table gives the accept length and the permutation p-value against
the server without speculation, as the e2e test computes it (a variant is caught where p <= 1e-3).  It takes several
minutes a server on 2 cores; ``--save`` keeps the responses and ``--load`` prints the table from them again.
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


def serve_variants(variants: list[str], samples: int) -> dict[str, dict[str, list[dict]]]:
    """``{server: {setting: responses}}``: the server without speculation, then each variant (a variant whose server
    fails gets ``{"failed": message}``)."""
    from e2e_servers import SAMPLED_TOKENS, SAMPLING, SAMPLING_PROMPT

    from eagle3_patches.testing import tiny_models
    from eagle3_patches.testing.server import Server, speculative_flags

    work = Path(tempfile.mkdtemp(prefix="sampling-power-"))
    target = str(tiny_models.build_kimi_k25(work / "tiny-kimi-k25"))
    draft = str(tiny_models.build_trained_eagle3_draft(work))
    print(f"{samples} sequences a server and setting; logs in {work}", flush=True)

    def answers(name: str, flags: list[str], env: dict) -> dict:
        server = Server(
            target, [*flags, "--max-running-requests", str(samples)], log_path=work / f"{name}.log", env=env
        )
        try:
            server.start()
            return {
                s: server.generate_batch([SAMPLING_PROMPT] * samples, SAMPLED_TOKENS, p) for s, p in SAMPLING.items()
            }
        except Exception as exc:  # noqa: BLE001 - a variant that fails is a row of the table
            return {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
        finally:
            server.stop()

    out = {"no-speculation": answers("no-speculation", [], {})}
    for variant in variants:
        env: dict[str, str] = {}
        if variant == "stock":
            env["EAGLE3_PATCHES_DISABLE"] = "cpu_spec_sampling"
        elif VARIANTS[variant]:
            shim = work / f"shim-{variant}"
            shim.mkdir()
            (shim / "sitecustomize.py").write_text(textwrap.dedent(VARIANTS[variant]))
            env["PYTHONPATH"] = str(shim)
        out[variant] = answers(variant, speculative_flags(draft), env)
    return out


def table(served: dict[str, dict]) -> list[str]:
    """The markdown table: each variant and setting, its accept length and the permutation test's verdict."""
    from e2e_servers import SAMPLED_TOKENS

    from eagle3_patches.acceptance import lossless
    from eagle3_patches.selftest.checks import sampling_lossless
    from eagle3_patches.testing.server import mean_accept_length

    plain = served["no-speculation"]
    lines = ["| variant, setting | accept length | against no speculation |", "|---|---:|---|"]
    for variant, spec in served.items():
        if variant == "no-speculation":
            continue
        if "failed" in spec:
            lines.append(f"| {variant} | - | failed: {spec['failed']} |")
            continue
        for setting, responses in spec.items():
            result = lossless.compare(
                [r["output_ids"] for r in responses],
                [r["output_ids"] for r in plain[setting]],
                SAMPLED_TOKENS,
                from_length=sampling_lossless.FROM_LENGTH,
            )
            verdict = "caught" if not result.same_distribution else "passes"
            lines.append(
                f"| {variant}, {setting} | {mean_accept_length(responses):.2f} | p {result.p_value:.4f} {verdict} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, help="sequences a server and setting (default: the e2e test's SAMPLES)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--save", help="write every server's responses to this JSON file")
    ap.add_argument("--load", help="the table from responses an earlier run saved (no server starts)")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.load:
        served = json.loads(Path(args.load).read_text())
    else:
        from e2e_servers import SAMPLES

        served = serve_variants(variants, args.samples or SAMPLES)
        if args.save:
            Path(args.save).write_text(json.dumps(served))
    print("\n".join(table(served)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
