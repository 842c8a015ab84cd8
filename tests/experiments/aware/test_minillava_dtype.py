"""The mini-LLaVA in bf16: a bf16 language model beside a float32 projector (mixed) and the whole
model in bf16 both embed images and give finite logits (MiniLlava.embed cast the visual tokens to
the LM's dtype before the float32 projector, which failed)."""
import pytest
import torch

from lab.experiments.aware.tiny import tiny_minillava, tiny_tokenizer


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
