"""The mini-LLaVA in bf16: a bf16 language model beside a float32 projector (mixed) and the whole
model in bf16 both embed images and give finite logits (MiniLlava.embed cast the visual tokens to
the LM's dtype before the float32 projector, which failed)."""
import pytest
import torch

from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer


@pytest.mark.parametrize("whole", [False, True], ids=["bf16-LM-fp32-projector", "all-bf16"])
def test_minillava_runs_in_bf16(whole):
    m = tiny_minillava(tiny_tokenizer(["a", "b"]), 8)
    (m if whole else m.language_model).to(torch.bfloat16)
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.zeros(1, 4, dtype=torch.bool)
    mask[0, 1:3] = True
    logits = m(ids, images=torch.randn(1, 2, 8), image_mask=mask).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_float32_embedding_is_unchanged_by_the_cast():
    """In float32 the projector's dtype is the LM's: the same numbers as projecting directly."""
    m = tiny_minillava(tiny_tokenizer(["a", "b"]), 8)
    ids, img = torch.tensor([[1, 2, 3]]), torch.randn(1, 1, 8)
    mask = torch.tensor([[False, True, False]])
    emb = m.embed(ids, img, mask)
    assert torch.equal(emb[0, 1], m.mm_projector(img)[0, 0])


@pytest.mark.parametrize("method", ["full", "aware", "lora"])
def test_every_method_trains_and_scores_a_bf16_mini_llava(method):
    """`--dtype bf16` on the mini-LLaVA: the harness fine-tunes (a finite loss) and scores
    a whole-bf16 model for each kind of method (a full copy, AWARe's row-split layers, a peft adapter)."""
    from dataclasses import replace

    import numpy as np

    from lab.aware.methods import MethodSpec
    from lab.experiments.aware.run.ablate import Variant, run_variant
    from lab.experiments.aware.run.context import MAIN, SIZES, Context
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tasks import QASet, Task

    def toy(n, seed):
        g = np.random.RandomState(seed)
        opts = ("red", "blue", "green")
        return QASet("toy", ["what color is it ?"] * n, [opts[g.randint(3)] for _ in range(n)], [opts] * n,
                     np.arange(n), torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(seed)))

    tok = tiny_tokenizer(["red", "blue", "green", "what", "color", "is", "it", "?"])
    size = replace(SIZES["smoke"], n_calib=8, calib_sizes=(4,))
    ctx = Context(tiny_minillava(tok, 8).to(torch.bfloat16), ChatEncoder(tok, 4), Task("easy_vqa", toy(16, 0), toy(8, 1)),
                  None, {"fashion": Task("fashion", toy(16, 3), toy(8, 4))}, size,
                  {("upstream", 8): toy(8, 9), ("upstream", 4): toy(4, 9), ("proxy", 8): toy(8, 10)})
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.context import upstream
    from lab.experiments.aware.run.profiling import calibration_batches

    v = Variant("methods", method, MethodSpec(method, MAIN))
    sal = profile(ctx.base, calibration_batches(ctx.calib[("upstream", 8)], ctx.enc), targets=MAIN.targets,
                  progress=False) if method == "aware" else None
    row, info = run_variant(ctx, v, "fashion", 0, before=upstream(ctx.base, ctx, exact=False), saliency=sal,
                            progress=False, keep_model=True)
    assert np.isfinite(row["final_loss"]) and 0 <= row["downstream"] <= 1
    assert all(p.dtype == torch.bfloat16 for p in info["model"].parameters())
