"""A transformers LLaVA in the AWARe harness: ``LlavaForConditionalGeneration`` and its processor,
from the hub (``llava-hf/llava-1.5-7b-hf``, the paper's model) or a local folder.

The harness was written for the offline mini-LLaVA; this module gives it what it needs from a real
LLaVA, and ``lab aware ... --model NAME`` dispatches here (:func:`lab.experiments.aware.run.context.setup`):

- the model itself: ``model.model.multi_modal_projector`` (``linear_1``/``linear_2``, which
  :func:`lab.aware.targets.is_projector` names a projector) and the language model's ``q_proj`` /
  ``k_proj`` / ``v_proj``; the CLIP vision tower is excluded from every target and stays frozen.
  It is already aligned (LLaVA-1.5's own stage 1), so no projector alignment runs.
- batches (:class:`HubEncoder`): the prompt from the processor's chat template, the image
  placeholder expanded to the processor's count of image tokens, tokenised by its tokenizer, and
  ``pixel_values`` from its image processor — the inputs ``processor(text=..., images=...)``
  returns, plus the answer tokens and the harness's left padding, ``position_ids`` and ``labels``.
  The tasks keep raw uint8 images (:func:`raw_images`) instead of the mini-LLaVA's cached tokens.
- scoring: the same KV-cached option scorer and greedy answers (:mod:`lab.experiments.aware.run.scoring`)
  continue the text with the whole LLaVA (its ``language_model`` is the decoder without its head).

Weights come through ``huggingface_hub`` (its cache, ``$HF_ENDPOINT``, ``$HF_HUB_OFFLINE``, proxies):
one HEAD request with a short timeout first, so an offline machine fails in seconds and says how to
get the weights. :func:`random_llava` builds random stand-ins (a tiny one for tests, the 7B shape
for the GPU check) with a word-level tokenizer and LLaVA-1.5's chat template.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from lab.experiments.aware.run.prompts import ChatEncoder

DEFAULT = "llava-hf/llava-1.5-7b-hf"
# LLaVA-1.5's short-answer instruction (its VQA evaluation prompts end with it)
INSTRUCTION = "Answer the question using a single word or phrase."
# llava-hf/llava-1.5-7b-hf's chat template (chat_template.json), given to the random stand-ins
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]   # no duplicate .bin weights


def dtype_of(name: str | None, device: str | None) -> torch.dtype:
    """``bf16`` / ``fp16`` / ``fp32``; None: bf16 on CUDA, float32 elsewhere."""
    if name is None:
        return torch.bfloat16 if device and torch.device(device).type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {list(_DTYPES)}")
    return _DTYPES[name]


def _how_to_get(name: str) -> str:
    from lab._vit_weights import hub_cache_dir

    return (f"Get the weights where there is internet: `hf download {name} --local-dir DIR` (huggingface_hub's CLI; "
            f"llava-1.5-7b is ~14 GB) and pass --model DIR, or fill the hub cache ({hub_cache_dir()}) the same way "
            "without --local-dir; $HF_ENDPOINT may name a reachable mirror. Offline, leave out --model: the packaged "
            "mini-LLaVA needs nothing")


def _is_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep + os.sep in name or name.count("/") > 1 or os.path.exists(name)


def _check_folder(folder: Path, shown: str) -> Path:
    cfg = folder / "config.json"
    if not folder.is_dir():
        raise ValueError(f"is a file; give a LLaVA checkpoint folder or a hub id such as {DEFAULT}")
    if not cfg.exists():
        raise ValueError(f"{shown} holds no config.json: not a transformers checkpoint folder")
    try:
        kind = json.loads(cfg.read_text()).get("model_type")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{shown}/config.json is unreadable ({exc})") from None
    if kind != "llava":
        raise ValueError(f"is a {kind!r} checkpoint; give a LLaVA (LlavaForConditionalGeneration, model_type "
                         f"'llava') such as {DEFAULT}")
    return folder


def locate(name: str, *, download: bool = True) -> Path:
    """The local folder of checkpoint ``name``: the folder itself, the hub cache's snapshot, or (with
    ``download``) a fresh snapshot. A hub that does not answer fails in seconds (one bounded HEAD
    request) with how to get the weights; ``download=False`` only checks that they can be had."""
    from lab._vit_weights import HubUnreachable, hub_cache_dir, probe

    if _is_path(name):
        folder = Path(name).expanduser()
        if not folder.exists():
            raise ValueError("no such folder")
        return _check_folder(folder, name)
    from huggingface_hub import snapshot_download

    try:   # already in the cache: no network
        folder = Path(snapshot_download(name, cache_dir=hub_cache_dir(), local_files_only=True,
                                        allow_patterns=_FILES))
        if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
            return _check_folder(folder, name)
    except Exception:  # noqa: BLE001 - not cached (or a partial cache): the hub decides
        pass
    try:
        probe(name, "config.json")
    except HubUnreachable as exc:
        raise RuntimeError(f"not a local folder, not in the hub cache, and {exc}. {_how_to_get(name)}") from None
    if not download:
        return Path(name)
    endpoint = os.environ.get("HF_ENDPOINT") or None
    folder = Path(snapshot_download(name, cache_dir=hub_cache_dir(), endpoint=endpoint, allow_patterns=_FILES))
    return _check_folder(folder, name)


def check(name: str, param: str = "--model") -> None:
    """Before any work: ``name`` is a LLaVA folder, a cached hub checkpoint, or a hub that answers
    (else one line naming ``param``)."""
    from lab import _validate

    try:
        locate(name, download=False)
    except (ValueError, RuntimeError) as exc:
        raise _validate.bad(param, name, str(exc)) from None


def skeleton(name: str):
    """The model's module tree on the meta device (no weights read): for checking ``--targets``.
    None when only the hub has the config (its check happens when the model loads)."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    folder = locate(name, download=False)
    if not (folder / "config.json").exists():
        return None
    with torch.device("meta"):
        return LlavaForConditionalGeneration(LlavaConfig.from_pretrained(folder))


def load(name: str = DEFAULT, *, device: str | None = None, dtype: str | torch.dtype | None = None,
         gradient_checkpointing: bool = True, progress: bool = True):
    """``(model, encoder)`` for a hub id or a local folder, on ``device`` in ``dtype`` (default bf16
    on CUDA, float32 on the CPU), gradient checkpointing on (active while training only).
    ``progress=False``: no download or loading bars."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    from transformers.utils import logging as hf_logging

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dt = dtype if isinstance(dtype, torch.dtype) else dtype_of(dtype, device)
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        try:
            folder = locate(name)
        except (ValueError, RuntimeError) as exc:
            raise type(exc)(f"cannot load {name!r}: {exc}") from None
        try:
            processor = AutoProcessor.from_pretrained(folder)
            model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=dt)
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"cannot load {name!r} from {folder} ({str(exc).splitlines()[0][:200]}). "
                               f"{_how_to_get(name)}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return wrap(model, processor, device=device, dtype=dt, gradient_checkpointing=gradient_checkpointing)


def wrap(model, processor, *, device: str = "cpu", dtype: torch.dtype | None = None,
         gradient_checkpointing: bool = True):
    """``(model, encoder)`` from a LLaVA and its processor already in memory (:func:`load`'s last
    step; the GPU check passes a random model here)."""
    if getattr(model.config, "model_type", None) != "llava":
        raise ValueError(f"expected a LlavaForConditionalGeneration, got {type(model).__name__}")
    dtype = dtype or next(model.parameters()).dtype
    model = model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if gradient_checkpointing:
        on = getattr(model, "activation_checkpointing_enable", None)   # transformers 5.x; 4.x: gradient_...
        if on is not None:
            on(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, HubEncoder(processor, dtype=dtype)


def is_hub_llava(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == "llava"


def raw_images(images, *, return_key: bool = False, **_ignored):
    """The tasks' images as they are (uint8 ``[N, H, W, 3]``; grey images get three channels): the
    processor resizes them per batch. Same call as :func:`~lab.experiments.aware.run.minillava.visual_tokens`
    (``grid``, ``cache_dir``, ``progress`` mean nothing here); the key names the image bytes."""
    arr = np.ascontiguousarray(images)
    if len(arr) == 0:
        raise ValueError("no images given")
    if arr.ndim == 3:
        arr = np.repeat(arr[..., None], 3, -1)
    arr = np.ascontiguousarray(arr[..., :3].astype(np.uint8))
    h = hashlib.sha256(arr.tobytes())
    h.update(str(arr.shape).encode())
    tensor = torch.from_numpy(arr)
    return (tensor, f"raw-{h.hexdigest()[:24]}") if return_key else tensor


class HubEncoder(ChatEncoder):
    """:class:`~lab.experiments.aware.run.prompts.ChatEncoder` for a LLaVA's processor: the same
    ``encode`` / ``collate`` / ``option_ids`` contract, batches as the processor builds them.

    A prompt is the processor's chat template over one user turn (``[image,] question\\n`` +
    :data:`INSTRUCTION`) with the generation prompt; its image placeholder is expanded to the
    processor's number of image tokens and the text tokenised as the processor does (special tokens
    included), the answer follows (its tokens + end of sequence). ``collate`` left-pads (no shared
    prefix) and runs the image processor: ``input_ids``, ``attention_mask``, ``position_ids``,
    ``pixel_values`` (in ``dtype``) and ``labels``.
    """

    def __init__(self, processor, *, dtype: torch.dtype = torch.float32, instruction: str = INSTRUCTION):
        super().__init__(processor.tokenizer, self._count_image_tokens(processor), system="")
        self.processor = processor
        self.image_token = processor.image_token
        self.image_id = processor.image_token_id
        self.dtype = dtype
        self.instruction = instruction

    @staticmethod
    def _count_image_tokens(processor) -> int:
        """How many times the processor repeats its image token for one image (576 for LLaVA-1.5)."""
        side = _crop_side(processor.image_processor)
        ids = processor(text=processor.image_token, images=[np.zeros((side, side, 3), np.uint8)],
                        return_tensors="pt")["input_ids"][0]
        return int((ids == processor.image_token_id).sum())

    def prompt(self, question: str, *, image: bool) -> str:
        text = f"{question}\n{self.instruction}" if self.instruction else question
        content = ([{"type": "image"}] if image else []) + [{"type": "text", "text": text}]
        return self.processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)

    def encode(self, question: str, answer: str | None = None, *, image: bool = False):
        from lab.experiments.aware.run.prompts import Encoded

        key = (question, answer, image)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        text = self.prompt(question, image=image)
        if image:
            text = text.replace(self.image_token, self.image_token * self.n_image, 1)
        ids = list(self.tok(text)["input_ids"])
        start = ids.index(self.image_id) if image else -1
        n_answer = 0
        if answer is not None:
            ans = self._ids(answer) + [self.eos_id]
            ids, n_answer = ids + ans, len(ans)
        enc = Encoded(tuple(ids), start, n_answer)
        if len(self._cache) < 100_000:
            self._cache[key] = enc
        return enc

    def pixels(self, images) -> Tensor:
        """``pixel_values`` of uint8 images ``[N, H, W, 3]`` from the processor's image processor."""
        arr = images.numpy() if isinstance(images, Tensor) else np.asarray(images)
        out = self.processor.image_processor(images=list(arr), return_tensors="pt")["pixel_values"]
        return out.to(self.dtype)

    def collate(self, encoded: Sequence, images: Tensor | None = None, *, share_prefix: bool = False) -> dict:
        batch = super().collate(encoded, None if images is None else self.pixels(images), share_prefix=False)
        if "images" in batch:
            batch["pixel_values"] = batch.pop("images")
            batch.pop("image_mask")
        return batch


def _crop_side(image_processor) -> int:
    crop = getattr(image_processor, "crop_size", None) or getattr(image_processor, "size", None) or {}
    if isinstance(crop, dict):
        return int(crop.get("height") or crop.get("shortest_edge") or 336)
    return int(getattr(crop, "height", None) or getattr(crop, "shortest_edge", None) or 336)


# --- random stand-ins ---------------------------------------------------------------------------
SHAPES = {
    # CLIP ViT-L/14-336 + Vicuna-7B (Llama-2-7B): llava-hf/llava-1.5-7b-hf's config
    "llava-1.5-7b": dict(vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                     num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768),
                         text=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
                         vocab=32064),
    "tiny": dict(vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             image_size=32, patch_size=8, projection_dim=32),
                 text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=512),
                 vocab=None),
}


def random_llava(shape: str = "tiny", *, words: Iterable[str] = (), seed: int = 0, dtype=torch.float32,
                 device: str = "cpu"):
    """``(LlavaForConditionalGeneration, LlavaProcessor)`` with random weights (seed ``seed``):
    ``tiny`` (CLIP 2 x 32 wide at 32 px, 16 image tokens; Llama 2 x 32) or ``llava-1.5-7b`` (the
    real shapes, 576 image tokens). The tokenizer is word-level over ``words`` (plus the template's
    own), with ``<image>`` as a special token and LLaVA-1.5's chat template; the image
    processor is CLIP's at the tower's resolution. ``save_pretrained`` both to get a local folder
    that :func:`load` reads like a hub checkpoint."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    from lab.experiments.aware.run.tiny import tiny_tokenizer

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {list(SHAPES)}")
    spec = SHAPES[shape]
    tok = tiny_tokenizer([*words, "USER", "ASSISTANT", ":", INSTRUCTION])
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.chat_template = CHAT_TEMPLATE
    vocab = spec["vocab"] or len(tok)
    if vocab < len(tok):
        raise ValueError(f"{len(tok)} words do not fit the {shape} vocabulary of {vocab}")
    side = spec["vision"]["image_size"]
    image_processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=spec["vision"]["patch_size"],
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=CHAT_TEMPLATE)
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(**spec["vision"]),
                      text_config=LlamaConfig(vocab_size=vocab, pad_token_id=tok.pad_token_id,
                                              eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                              **spec["text"]),
                      image_token_id=processor.image_token_id, pad_token_id=tok.pad_token_id,
                      image_seq_length=(side // spec["vision"]["patch_size"]) ** 2)
    torch.manual_seed(seed)
    with torch.device(device):
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = LlavaForConditionalGeneration(cfg)
        finally:
            torch.set_default_dtype(default)
    return model.eval(), processor
