"""Write the tiny trained EAGLE-3 draft in speculators format with the real ``speculators`` library.

    python tools/make_speculators_fixture.py [--out DIR] [--check]

Run it with a Python that has ``speculators==0.9.0`` (it needs transformers >= 5, which the pinned
sglang 0.5.9 test environment does not have).  A venv of its own works on a CPU-only machine:

    python3.11 -m venv /tmp/speculators-venv
    /tmp/speculators-venv/bin/pip install torch==2.13.0 wrapt packaging tokenizers   # the CPU build here
    /tmp/speculators-venv/bin/pip install --no-deps speculators==0.9.0
    /tmp/speculators-venv/bin/pip install "transformers>=5,<=5.19" "datasets>=4,<=5.1" loguru pydantic \
        pydantic-settings rich safetensors tqdm typer hs-connectors==0.9.0 aiohttp click httpx \
        huggingface-hub numpy openai protobuf psutil
    PYTHONPATH=. /tmp/speculators-venv/bin/python tools/make_speculators_fixture.py

(speculators 0.9.0 also lists torchvision and torchaudio; the PyPI torchvision wheels are CUDA builds
whose operators do not load with the CPU torch, and nothing this script uses imports them, so they
are left out.)

What it does, as a speculators user who trained this draft would have it written: the tensors of
``eagle3_patches/testing/data/tiny_kimi_k25_eagle3_draft.safetensors`` (the draft trained on the tiny
Kimi-K2.5 target, ``tools/train_tiny_draft.py``) are loaded into speculators' own ``Eagle3DraftModel``
built from an ``Eagle3SpeculatorConfig`` (a llama ``transformer_layer_config`` with the tiny draft's
sizes; aux ids ``[2, 3, 4]`` in speculators' meaning = the outputs of target layers 1, 2, 3, which the
draft was trained on; ``target_hidden_size`` left null, as speculators' trainer leaves it; every
norm option off), the verifier's embedding is put in ``embed_tokens`` (as speculators'
``load_verifier_weights`` does), the model is cast to bfloat16 (as speculators trains and saves) and
written with speculators' ``save_pretrained``.  ``config.json`` and ``model.safetensors`` are committed
as speculators wrote them under ``eagle3_patches/testing/data/speculators_eagle3_draft/``
(about 310 KB).  The third file it writes, ``config.py`` (a copy of speculators' own config class, named
by ``"auto_map": {"": "config.Eagle3SpeculatorConfig"}``), is left out: it is speculators' source, not
the draft, eagle3-patches never executes it, and a ``.py`` file under ``eagle3_patches/`` would be a
module of this package; the tests plant a tripwire ``config.py`` next to the fixture instead.

``--check`` writes into a temporary directory and compares with the committed files byte for byte
(``config.json`` as text, the safetensors file's tensors and metadata).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3_patches.testing import tiny_models as tm  # noqa: E402

SPECULATORS_VERSION = "0.9.0"
OUT = ROOT / "eagle3_patches" / "testing" / "data" / "speculators_eagle3_draft"
#: speculators' meaning (HF hidden_states index: the input of layer N) of the output-of-layer ids the draft was trained
#: on
AUX_IDS = [i + 1 for i in tm.DRAFT_AUX_IDS]
VERIFIER = "tiny-kimi-k25"


def write(out: Path) -> list[str]:
    import speculators
    import torch
    from safetensors.torch import load_file
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    version = getattr(speculators, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("speculators")
    if version != SPECULATORS_VERSION:
        raise SystemExit(f"this fixture is written by speculators {SPECULATORS_VERSION}; found {version}")

    trained = load_file(str(tm.TRAINED_DRAFT_TENSORS))
    spec = tm.TinyDraftSpec(draft_vocab=int(trained["lm_head.weight"].shape[0]))
    layer = LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden // spec.num_heads,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=spec.draft_vocab,
        eagle_aux_hidden_state_layer_ids=AUX_IDS,
        norm_before_residual=False,
        norm_before_fc=False,
        fc_norm=False,
        norm_output=False,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=VERIFIER, architectures=["KimiK25ForConditionalGeneration"]),
        ),
    )
    model = Eagle3DraftModel(config)
    state = {name.replace("midlayer.", "layers.0."): t for name, t in trained.items() if name not in ("d2t", "t2d")}
    state["embed_tokens.weight"] = tm.deepseek_v3_tensors(tm.TinyTargetSpec())["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) != {"d2t", "t2d", "verifier_norm.weight", "verifier_lm_head.weight"}:
        raise SystemExit(
            f"the trained tensors do not fit speculators' Eagle3DraftModel: missing {missing}, unexpected {unexpected}"
        )
    model.load_vocab_mappings(trained["t2d"], trained["d2t"])
    model.to(torch.bfloat16)
    model.save_pretrained(str(out))
    code = out / "config.py"
    if not code.is_file():
        raise SystemExit(
            f"speculators {SPECULATORS_VERSION} no longer writes config.py: update the docstring and "
            "docs/checkpoints.md"
        )
    code.unlink()
    return sorted(p.name for p in out.iterdir())


def _same(a: Path, b: Path) -> list[str]:
    from safetensors import safe_open

    diffs = []
    names_a, names_b = sorted(p.name for p in a.iterdir()), sorted(p.name for p in b.iterdir())
    if names_a != names_b:
        return [f"files {names_a} != {names_b}"]
    for name in names_a:
        if name.endswith(".safetensors"):
            import torch

            with safe_open(str(a / name), "pt") as fa, safe_open(str(b / name), "pt") as fb:
                if fa.metadata() != fb.metadata() or sorted(fa.keys()) != sorted(fb.keys()):
                    diffs.append(f"{name}: metadata or names differ")
                    continue
                diffs.extend(f"{name}: {k}" for k in fa.keys() if not torch.equal(fa.get_tensor(k), fb.get_tensor(k)))
        elif not filecmp.cmp(a / name, b / name, shallow=False):
            diffs.append(name)
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare a fresh write with the committed fixture")
    args = ap.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "fixture"
            write(fresh)
            diffs = _same(fresh, args.out)
        print("identical" if not diffs else f"differs: {diffs}")
        return 1 if diffs else 0
    if args.out.exists():
        import shutil

        shutil.rmtree(args.out)
    files = write(args.out)
    print(f"wrote {args.out}: {', '.join(files)} ({sum((args.out / f).stat().st_size for f in files)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
