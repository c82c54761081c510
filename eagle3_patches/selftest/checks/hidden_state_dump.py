"""hidden_state_dump (an instrument): the opt-in dump under CUDA-graph capture records served rows only."""

from __future__ import annotations

from ...testing.tiny_models import DRAFT_AUX_IDS
from .. import device_scenarios as ds
from ..base import Check, Context, Finding, describe_error


def dump_graph_capture(ctx: Context) -> Finding:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="eagle3-selftest-dump-") as out_dir:
        env = {"EAGLE3_PATCHES_DUMP_DIR": out_dir, "EAGLE3_PATCHES_DUMP_LAYER_IDS": ",".join(map(str, DRAFT_AUX_IDS))}
        seen = ctx.observe(
            ds.dump_under_graph_capture, ctx.path("deepseek_v3"), ctx.overrides(), patches="all", env=env
        )
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    out = seen[1]
    if out["error"]:
        return Finding(
            False,
            f"the target did not start with the dump on: {describe_error((out['error'], out['message']))}",
            None,
            observations=out,
        )
    prompts = 4 + 3
    warned = any("--disable-cuda-graph" in w for w in out["warnings"])
    fixed = (
        out["graphs"]
        and out["rows_after_capture"] == 0
        and out["rows_after_prefill"] == prompts
        and out["rows_after_decode"] == prompts
        and warned
    )
    text = (
        f"DECODE graphs captured with the dump on; rows after capture {out['rows_after_capture']}, after a served "
        f"prefill {out['rows_after_prefill']} (want {prompts}), after a graph-replayed decode step "
        f"{out['rows_after_decode']}; {'warned' if warned else 'did NOT warn'} that graph replays are not recorded"
    )
    return Finding(
        fixed,
        text,
        None,
        "an opt-in instrument of this library: nothing to observe on stock sglang",
        *seen.patch("hidden_state_dump"),
        observations=out,
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "hidden_state_dump_graph_capture",
        "the opt-in hidden-state dump under CUDA-graph capture: capture works, served rows only",
        dump_graph_capture,
        patch="hidden_state_dump",
        needs=("cuda",),
        runs_on="<0.5.13",
        outside="the dump is written for sglang 0.5.8-0.5.12's capture path (its own releases)",
    ),
)
