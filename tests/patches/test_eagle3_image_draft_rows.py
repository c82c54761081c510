"""eagle3_image_draft_rows: EAGLE3 with image input is refused at start where the draft's prefill reads wrong rows for
image requests; the doctor names it, and the breakable prefill graph's start-up crash (image-prefill-graph-crash)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest

from eagle3_patches.diagnostic import ERROR, WARNING
from eagle3_patches.doctor import doctor
from eagle3_patches.patches import eagle3_image_draft_rows as ir
from eagle3_patches.selftest import PASSED
from eagle3_patches.sglang_version import installed_sglang_version

CODE = "eagle3-image-draft-rows"
CRASH = "image-prefill-graph-crash"
EAGLE3 = "--speculative-algorithm EAGLE3"


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: EAGLE3 resolved as the launcher resolves it for the tiny Kimi-K2.5 with image input on
    (sglang's default), served text only, and for a text-only target; stock, then with the patch set applied."""
    return run_check("eagle3_image_draft_rows")


# ------------------------------------------------------------------------------------------- the faults, per release
#: written out from the wheels (not read from the patch: a release the patch misplaces must fail here)
FAULTS = {
    "0.5.9": 0,  # the draft embeds its own token ids
    "0.5.10": 3,
    "0.5.12": 3,
    "0.5.13": 3,
    "0.5.14": 2,  # each sequence's last row re-embedded
    "0.5.19": 2,
    "0.5.20": 1,  # the rows shifted as the ids are
    "0.5.21": 0,  # a copy of the rows for the draft
    "0.5.22": 0,
}


@pytest.mark.parametrize("version, count", FAULTS.items())
def test_the_faults_of_each_release(version, count):
    assert len(ir.faults(version)) == count
    assert ir.PATCH.covers(ir.parse_version(version)) is (count > 0)


def _layout(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    return tmp_path


LAST_ROWS = "embeds[last_indices] = (forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1)\n"
READS = "embeds = forward_batch.mm_input_embeds\n"


@pytest.mark.parametrize(
    "files, reads, fixed",
    [
        ({"models/llama_eagle3.py": "embeds = self.embed_tokens(input_ids)\n"}, False, False),  # 0.5.9
        ({"models/llama_eagle3.py": READS + "input_ids[-1]"}, True, False),  # 0.5.10 - 0.5.13
        ({"models/llama_eagle3.py": READS + LAST_ROWS, "speculative/eagle_worker_v2.py": "rotated_mm"}, True, False),
        (
            {
                "models/llama_eagle3.py": READS + LAST_ROWS,
                "speculative/eagle_worker_v2.py": "rotated_mm = torch.empty_like(mm_input_embeds)",
                "managers/mm_utils.py": "input_embeds.clone()",
            },
            True,
            True,
        ),
    ],
    ids=["own-ids", "last-row-of-the-batch", "no-copy", "all-fixed"],
)
def test_the_source_probes_read_each_layout(tmp_path, files, reads, fixed):
    srt = _layout(tmp_path, files)
    assert ir.reads_target_rows(srt) is reads
    assert ir.fixed_upstream(srt) is fixed

    class Module:
        __file__ = str(srt / "server_args.py")

    assert (ir.PATCH.upstream(Module) is not None) is fixed  # type: ignore[arg-type]


def test_the_installed_releases_source_agrees_with_the_range():
    """The installed release's own files (the pinned release in the test command; each release in the matrix)."""
    srt = Path(find_spec("sglang").origin).parent / "srt"  # type: ignore[arg-type, union-attr]
    version = installed_sglang_version()
    faulty = ir.reads_target_rows(srt) and not ir.fixed_upstream(srt)
    assert faulty is ir.PATCH.covers(version), (version, ir.reads_target_rows(srt), ir.fixed_upstream(srt))


class _Args:
    model_path = "/models/kimi-k2.5"

    def __init__(self, algorithm, multimodal):
        self.speculative_algorithm, self._multimodal = algorithm, multimodal

    def get_model_config(self):
        class Config:
            is_multimodal = self._multimodal

        return Config()


def test_the_check_refuses_only_eagle3_with_image_input_on_a_faulty_release(monkeypatch):
    monkeypatch.setattr(ir, "installed_sglang_version", lambda: ir.parse_version("0.5.19"))
    with pytest.raises(ir.Eagle3ConfigError) as info:
        ir.check_image_rows(_Args("eagle3", True))
    message = str(info.value)
    assert "sglang >= 0.5.21" in message and "EAGLE3_PATCHES_DISABLE=eagle3_image_draft_rows" in message
    assert "one position late" in message and "last sequence's last row" not in message  # 0.5.19's two faults
    for args in (_Args("EAGLE3", False), _Args("EAGLE", True), _Args("NGRAM", True), _Args(None, True)):
        ir.check_image_rows(args)  # silent
    monkeypatch.setattr(ir, "installed_sglang_version", lambda: ir.parse_version("0.5.21"))
    ir.check_image_rows(_Args("EAGLE3", True))  # silent: every fix in


# ---------------------------------------------------------------------------------------------- on sglang's own code
@pytest.mark.sglang
def test_check_on_sglangs_own_launcher(check):
    """In range (the matrix's 0.5.13 - 0.5.20): stock resolves image input with EAGLE3, patched refuses it and resolves
    text only and a text target; outside it (the pinned and the newest release) the patch set resolves all three."""
    assert check.status == PASSED, check.reason
    stock, patched = check.observations["stock"], check.observations["patched"]
    assert stock["image"] == ("ok", "EAGLE3")  # what sglang itself does: no word about the rows
    assert patched["text_only"] == patched["text_target"] == ("ok", "EAGLE3")
    if ir.PATCH.covers(installed_sglang_version()):
        assert check.bug == "present"
        kind, message = patched["image"]
        assert kind == "Eagle3ConfigError" and "sglang >= 0.5.21" in message
    else:
        assert patched["image"] == ("ok", "EAGLE3")


# -------------------------------------------------------------------------------------------------------- the doctor
@pytest.mark.parametrize("version", ["0.5.10", "0.5.13", "0.5.19", "0.5.20"])
def test_the_doctor_warns_on_stock_and_says_the_patched_launch_stops(tiny, version):
    stock = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=EAGLE3)
    assert CODE in stock.codes(WARNING), stock.format()
    assert "sglang >= 0.5.21" in stock.format()
    patched = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=EAGLE3, with_patches=True)
    assert CODE in patched.codes(ERROR), patched.format()
    assert "eagle3_image_draft_rows" in patched.format()


@pytest.mark.parametrize(
    "version, target, launch",
    [
        ("0.5.9", "kimi_k25", EAGLE3),  # the draft embeds its own ids
        ("0.5.21", "kimi_k25", EAGLE3),  # every fix in
        ("0.5.13", "deepseek_v3", EAGLE3),  # no vision tower
        ("0.5.13", "kimi_k25", "--speculative-algorithm NGRAM"),
    ],
)
def test_the_doctor_is_silent_where_the_rows_are_right(tiny, version, target, launch):
    for with_patches in (False, True):
        r = doctor(tiny[target], tiny["draft"], sglang_version=version, launch=launch, with_patches=with_patches)
        assert CODE not in r.codes(), r.format()


def test_image_input_off_by_default_needs_the_flag(tiny, tmp_path):
    """An architecture whose images sglang leaves off unless --enable-multimodal (Llama 4's, here on the tiny text
    model with a vision tower) is judged only with the flag."""
    import json
    import shutil

    target = tmp_path / "llama4-like"
    shutil.copytree(tiny["kimi_k25"], target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["Llama4ForConditionalGeneration"]
    (target / "config.json").write_text(json.dumps(config))
    quiet = doctor(target, tiny["draft"], sglang_version="0.5.13", launch=EAGLE3)
    assert CODE not in quiet.codes(), quiet.format()
    loud = doctor(target, tiny["draft"], sglang_version="0.5.13", launch=EAGLE3 + " --enable-multimodal")
    assert CODE in loud.codes(WARNING), loud.format()


# ------------------------------------------------------------------------------------------------ the start-up crash
BREAKABLE = EAGLE3 + " --cuda-graph-backend-prefill breakable"


@pytest.mark.parametrize(
    "version, launch, crash",
    [
        ("0.5.13", BREAKABLE, False),  # the draft's prefill runs eagerly
        ("0.5.14", BREAKABLE, True),  # asked for: sglang's own multimodal rule is bypassed
        ("0.5.17", EAGLE3, False),  # Kimi-K2.5 not yet on sglang's list: the graph off for a multimodal target
        ("0.5.18", EAGLE3, True),  # on the list: on by default
        ("0.5.21", EAGLE3, True),
        ("0.5.19", EAGLE3 + " --enable-breakable-cuda-graph --disable-cuda-graph", True),  # the alias asks for it
        ("0.5.21", EAGLE3 + " --cuda-graph-backend-prefill disabled", False),
        ("0.5.21", EAGLE3 + " --disable-prefill-cuda-graph", False),
        ("0.5.21", EAGLE3 + " --disable-cuda-graph", False),
        ("0.5.21", EAGLE3 + " --enable-two-batch-overlap", False),
        ("0.5.21", EAGLE3 + " --moe-a2a-backend mooncake", False),
        ("0.5.21", EAGLE3 + " --moe-a2a-backend deepep", True),
        ("0.5.22", BREAKABLE, False),  # the draft's embeddings come from outside the graph
    ],
)
def test_the_doctor_names_the_start_up_crash_where_it_applies(tiny, version, launch, crash):
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=launch)
    assert (CRASH in r.codes(ERROR)) is crash, r.format()
    if crash:
        assert "--cuda-graph-backend-prefill disabled" in r.format() and "sglang >= 0.5.22" in r.format()


@pytest.mark.parametrize("target, draft", [("deepseek_v3", "draft"), ("kimi_k25", "mla_draft")])
def test_the_start_up_crash_needs_image_input_and_the_llama_draft(tiny, target, draft):
    r = doctor(tiny[target], tiny[draft], sglang_version="0.5.19", launch=BREAKABLE)
    assert CRASH not in r.codes(), r.format()
