"""AWARe on a transformers LLaVA, offline: a tiny random ``LlavaForConditionalGeneration`` (CLIP
vision 2 x 32, Llama 2 x 32) with its processor (word-level tokenizer, LLaVA-1.5's chat template,
CLIP's image processor) saved to a folder and driven through ``lab aware profile`` and
``lab aware finetune --model FOLDER --device cpu``, as a hub checkpoint would be. And the hub path
without a network: it fails in seconds and says how to get the weights."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lab import cli

ROOT = Path(__file__).resolve().parents[3]


def _words() -> list[str]:
    """Every word of the probe, the easy-VQA questions and the downstream answers (the tokenizer is word-level)."""
    import easy_vqa

    from lab.experiments.aware.run import tasks

    text = []
    for it in json.loads(tasks.PROBE_FILE.read_text())["items"]:
        text += [it["question"], it["answer"], *it["distractors"]]
    text += easy_vqa.get_train_questions()[0][:3000] + easy_vqa.get_test_questions()[0][:1000]
    text += [*easy_vqa.get_answers(), *tasks.FASHION_ANSWERS, "yes no", *[t[1].question for t in tasks.TEMPLATES.values()]]
    return sorted(set(re.findall(r"\w+|[^\w\s]", " ".join(text))))


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    from lab.experiments.aware.run.hub_llava import random_llava

    folder = tmp_path_factory.mktemp("hub") / "tiny-llava"
    model, processor = random_llava("tiny", words=_words())
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture()
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")        # a local folder needs no hub
    return tmp_path


def _targets(model) -> dict:
    from lab.aware.targets import find_targets

    return find_targets(model, "qkv+projector")


def test_batches_are_the_processors(llava_dir):
    """The encoder's prompt ids and pixel values are exactly what ``processor(text, images)`` returns;
    the answer follows the prompt; text-only samples have no pixel values."""
    from lab.experiments.aware.run.hub_llava import load

    model, enc = load(str(llava_dir), device="cpu")
    img = np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)
    e = enc.encode("What color is the shape?", "red", image=True)
    ref = enc.processor(text=enc.prompt("What color is the shape?", image=True), images=[img], return_tensors="pt")
    assert list(e.ids[: -e.n_answer]) == ref["input_ids"][0].tolist()
    assert enc.n_image == 16 == sum(i == enc.image_id for i in e.ids)           # (32 / 8)^2 patches, CLS dropped
    assert list(e.ids[-e.n_answer:]) == enc.tok("red", add_special_tokens=False)["input_ids"] + [enc.eos_id]
    assert "USER: <image>\nWhat color is the shape?" in enc.prompt("What color is the shape?", image=True)
    batch = enc.collate([e, enc.encode("Which digit is this?", image=False)], torch.from_numpy(img[None]))
    assert torch.equal(batch["pixel_values"], ref["pixel_values"])
    assert set(batch) == {"input_ids", "attention_mask", "position_ids", "pixel_values", "labels"}
    assert batch["input_ids"][0, -1] == enc.eos_id and batch["attention_mask"][1, 0] == 0      # left padding
    # targets: the language model's q/k/v and the projector's two Linears, never the CLIP tower
    names = set(_targets(model))
    assert {n for n in names if "multi_modal_projector" in n} == {"model.multi_modal_projector.linear_1",
                                                                   "model.multi_modal_projector.linear_2"}
    assert len(names) == 2 + 3 * model.config.text_config.num_hidden_layers
    assert not any("vision_tower" in n for n in names)
    # the LLaVA's own forward (image features merged at the image tokens) gives the scorer's numbers
    from lab.experiments.aware.run.scoring import option_scores

    prompt = enc.collate([enc.encode("What color is the shape?", image=True)], torch.from_numpy(img[None]))
    opts = enc.option_ids(["red", "blue"])
    got = option_scores(model, prompt, [opts])
    with torch.inference_mode():
        logp = model(**{k: prompt[k] for k in ("input_ids", "attention_mask", "pixel_values")}).logits[0, -1].log_softmax(-1)
    assert torch.allclose(got[0], logp[[o[0] for o in opts]], atol=1e-5)


def test_profile_and_finetune_through_the_cli(llava_dir, env, capsys):
    """``lab aware profile`` covers q/k/v + projector; ``lab aware finetune --method aware --save``
    trains only the non-retained rows: the retained rows (the same selection from the same
    calibration set) and everything outside the targets are bit-identical afterwards."""
    from safetensors.torch import load_file
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from lab.aware.masking import select

    sal_file = env / "sal.safetensors"
    common = ["--model", str(llava_dir), "--device", "cpu", "--size", "smoke", "--quiet"]
    assert cli.main(["aware", "profile", *common, "--n", "8", "--out", str(sal_file)]) == 0
    out = capsys.readouterr().out
    base = LlavaForConditionalGeneration.from_pretrained(llava_dir)
    layers = _targets(base)
    sal = {k[len("layer/"):]: v for k, v in load_file(sal_file).items() if k.startswith("layer/")}
    assert set(sal) == set(layers), sorted(set(sal) ^ set(layers))
    assert all(sal[n].shape == (m.out_features,) and torch.isfinite(sal[n]).all() and (sal[n] > 0).any()
               for n, m in layers.items())
    assert f"profiled {len(layers)} layers on 8 samples" in out

    saved = env / "finetuned"
    assert cli.main(["aware", "finetune", *common, "--method", "aware", "--rho", "0.3", "--steps", "3",
                     "--lr-aware", "1e-2", "--lr-projector", "1e-2", "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("aware on fashion: downstream acc") and "saved a standard checkpoint" in out
    tuned = LlavaForConditionalGeneration.from_pretrained(saved)
    AutoProcessor.from_pretrained(saved)                    # the processor travels with the checkpoint
    masks = select(sal, 0.3, "activation-global", weights=layers)
    before, after = base.state_dict(), tuned.state_dict()
    assert set(before) == set(after)
    changed_rows = 0
    for name, mask in masks.items():
        for kind in ("weight", "bias"):
            key = f"{name}.{kind}"
            if key not in before:
                continue
            assert torch.equal(before[key][mask], after[key][mask]), f"retained rows of {key} moved"
            changed_rows += int((before[key][~mask] != after[key][~mask]).any(-1 if kind == "weight" else 0).sum())
    assert changed_rows > 0, "no trainable row moved"
    frozen_total = sum(int(m.sum()) for m in masks.values())
    assert abs(frozen_total / sum(m.numel() for m in masks.values()) - 0.3) < 0.02
    outside = [k for k in before if not any(k.startswith(n + ".") for n in masks)]
    assert any("vision_tower" in k for k in outside) and any("embed_tokens" in k for k in outside)
    for k in outside:
        assert torch.equal(before[k], after[k]), f"{k} is outside the targets and changed"


def test_full_finetuning_leaves_the_vision_tower_frozen(llava_dir):
    from lab.aware.config import AwareConfig
    from lab.aware.methods import MethodSpec, prepare
    from lab.experiments.aware.run.finetune import TrainConfig
    from lab.experiments.aware.run.hub_llava import load

    model, _ = load(str(llava_dir), device="cpu")
    model, groups, info = prepare(model, MethodSpec("full", AwareConfig()), TrainConfig())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any("vision_tower" in n for n in trainable)
    assert any("multi_modal_projector" in n for n in trainable) and any("language_model" in n for n in trainable)
    assert info["trainable"] < info["total"]


def _lab(argv, env, timeout=120):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "lab.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=timeout)
    return p, time.perf_counter() - t0


@pytest.mark.parametrize("case", ["offline", "unreachable"])
def test_a_hub_id_without_network_fails_in_seconds(case, tmp_path):
    """Nothing cached, no hub: one line that names the cause and how to get the weights, exit 2,
    in seconds (one HEAD request with a 5 s timeout at most), before any data or model work."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "LAB_RUNS_DIR": str(tmp_path / "runs"),
           "LAB_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HF_HUB_CACHE", None)
    if case == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env.pop("HF_HUB_OFFLINE", None)
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"       # the discard port: nothing listens
    p, seconds = _lab(["aware", "finetune", "--model", "llava-hf/llava-1.5-7b-hf", "--size", "smoke", "--quiet"], env)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith("lab aware finetune: error: --model llava-hf/llava-1.5-7b-hf: not a local folder, "
                           "not in the hub cache"), line
    assert ("HF_HUB_OFFLINE is set" if case == "offline" else "http://127.0.0.1:9 did not answer") in line
    assert "hf download llava-hf/llava-1.5-7b-hf --local-dir DIR" in line and "--model DIR" in line
    assert seconds < 30, f"{seconds:.1f} s"      # Python start-up + imports + a 5 s probe at most
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("hf/hub/models--*/blobs/*"))   # nothing written


def test_a_cached_hub_checkpoint_loads_offline(llava_dir, tmp_path, monkeypatch):
    """A checkpoint already in the hub cache loads with HF_HUB_OFFLINE=1 and no network."""
    from lab.experiments.aware.run import hub_llava

    repo = "stand-in/tiny-llava"
    snap = tmp_path / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for f in llava_dir.iterdir():
        (snap / f.name).symlink_to(f)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_llava.locate(repo) == snap
    model, enc = hub_llava.load(repo, device="cpu", dtype="bf16")
    assert next(model.parameters()).dtype == torch.bfloat16 and enc.pixels(torch.zeros(1, 8, 8, 3, dtype=torch.uint8)).dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="cannot load 'stand-in/other': not a local folder, not in the hub cache"):
        hub_llava.load("stand-in/other", device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_and_finetune_on_cuda_in_bf16(llava_dir, env, capsys):
    """The same CLI path on the GPU in bf16: saliency finite, the saved checkpoint in bf16."""
    from safetensors.torch import load_file
    from transformers import LlavaForConditionalGeneration

    common = ["--model", str(llava_dir), "--device", "cuda", "--dtype", "bf16", "--size", "smoke", "--quiet"]
    assert cli.main(["aware", "profile", *common, "--n", "8", "--out", str(env / "sal.safetensors")]) == 0
    sal = load_file(env / "sal.safetensors")
    assert all(torch.isfinite(v).all() for k, v in sal.items() if k.startswith("layer/"))
    assert cli.main(["aware", "finetune", *common, "--method", "aware", "--save", str(env / "ft")]) == 0
    assert "aware on fashion: downstream acc" in capsys.readouterr().out
    assert LlavaForConditionalGeneration.from_pretrained(env / "ft").dtype == torch.bfloat16
