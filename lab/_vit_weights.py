"""ViT weights: find the file (argument, environment, Hugging Face cache, hub download) and build
the timm model its tensors describe.

One loader serves every ViT checkpoint: the paper's ``vit_base_patch16_224.augreg_in21k`` from the
hub, the same file copied by hand, or a small random stand-in in tests. The architecture is read
from the tensors (width from ``cls_token``, depth from the ``blocks.N`` prefixes, patch size from
``patch_embed.proj``, MLP ratio from ``fc1``); the number of heads is not visible in the shapes and
is taken from the safetensors metadata key ``num_heads`` when present, else ``width // 64`` (every
ViT of the original family uses 64-wide heads: ViT-B 768/12). timm's own
``checkpoint_filter_fn`` then adapts the tensors (position embeddings resampled to the requested
resolution), and the ImageNet-21k classifier ``head.*`` is dropped: the backbone ends at the
pre-logits [CLS] feature.

Downloads go through ``huggingface_hub`` (its endpoint ``$HF_ENDPOINT``, ``$HF_HUB_OFFLINE``, proxies
from ``$HTTPS_PROXY`` and its cache ``$HF_HOME``/``$HF_HUB_CACHE``). Before downloading, one HEAD
request with a short timeout and no retries says whether the hub answers at all, so an offline
machine fails in seconds with what to download and where to put it.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

HEAD_TIMEOUT = 5.0  # seconds for the reachability probe (one HEAD request, no retries)
_TRUE = {"1", "ON", "YES", "TRUE"}
_ids: dict[tuple, str] = {}


class HubUnreachable(RuntimeError):
    """The hub did not answer (offline, blocked, or HF_HUB_OFFLINE set)."""


def hub_cache_dir() -> str:
    """huggingface_hub's cache folder as the environment says now (read at call time)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def cached(repo: str, filenames=("model.safetensors", "pytorch_model.bin")) -> str | None:
    """A file of ``repo`` already in the Hugging Face cache, else None (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        for fname in filenames:
            hit = try_to_load_from_cache(repo, fname, cache_dir=hub_cache_dir())
            if isinstance(hit, str):
                return hit
    except Exception:  # noqa: BLE001 - an unreadable cache is the same as no cache
        pass
    return None


def probe(repo: str, filename: str = "model.safetensors", timeout: float = HEAD_TIMEOUT) -> None:
    """One HEAD request for ``repo/filename`` through huggingface_hub; raises HubUnreachable with
    the reason when the hub does not answer within ``timeout`` seconds."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    if hub_offline():
        raise HubUnreachable("HF_HUB_OFFLINE is set")
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        get_hf_file_metadata(hf_hub_url(repo, filename, endpoint=endpoint), timeout=timeout, endpoint=endpoint,
                             retry_on_errors=False)
    except Exception as exc:  # noqa: BLE001 - DNS, proxy, TLS, timeout, HTTP errors: all mean "not reachable"
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise HubUnreachable(f"{endpoint or 'https://huggingface.co'} did not answer ({reason})") from exc


def download(repo: str, filename: str = "model.safetensors") -> str:
    """huggingface_hub's own download into its cache; returns the local path."""
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo, filename, cache_dir=hub_cache_dir(), endpoint=os.environ.get("HF_ENDPOINT") or None)


def file_id(path: Path) -> str:
    """sha256 of the file (first 16 hex digits), memoised per (path, size, mtime)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _ids:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
        _ids[key] = "sha256-" + h.hexdigest()[:16]
    return _ids[key]


def read_state_dict(path: Path) -> tuple[dict, dict]:
    """(tensors, metadata) of a .safetensors or torch file (``torch.load(weights_only=True)``)."""
    import warnings

    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as fh:
                return {k: fh.get_tensor(k) for k in fh.keys()}, dict(fh.metadata() or {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sd = torch.load(path, map_location="cpu", weights_only=True)   # never unpickles code
    except Exception as exc:  # noqa: BLE001 - garbage, truncated or code-carrying files raise several types
        raise ValueError(f"{path} is not a loadable weights file ({type(exc).__name__}: safetensors, or a torch "
                         "state dict readable with weights_only=True; lab never runs pickled code)") from exc
    if isinstance(sd, dict):
        sd = sd.get("model", sd.get("state_dict", sd))
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors")
    return sd, {}


def architecture(sd: dict, meta: dict) -> dict:
    """timm VisionTransformer arguments read from a checkpoint's tensor shapes."""
    need = ("cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.mlp.fc1.weight")
    missing = [k for k in need if k not in sd]
    if missing:
        raise ValueError(f"not a timm ViT checkpoint with a class token: no {', '.join(missing)}")
    width = sd["cls_token"].shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    heads = int(meta.get("num_heads") or max(1, width // 64))
    patch = sd["patch_embed.proj.weight"].shape[-1]
    grid = round((sd["pos_embed"].shape[1] - 1) ** 0.5)
    return dict(embed_dim=width, depth=depth, num_heads=heads, patch_size=patch, img_size=grid * patch,
                mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / width, qkv_bias="blocks.0.attn.qkv.bias" in sd)


def build(path: Path, resolution: int):
    """The frozen timm ViT (no classifier) described by the checkpoint at ``path``, at ``resolution``."""
    import timm
    from timm.models.vision_transformer import checkpoint_filter_fn

    sd, meta = read_state_dict(path)
    arch = architecture(sd, meta)
    sd = {k: v for k, v in sd.items() if not k.startswith("head.")}
    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0,
                              **{**arch, "img_size": resolution})
    try:
        model.load_state_dict(checkpoint_filter_fn(sd, model), strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0][:200]
        raise ValueError(f"{path}: its tensors do not fit a timm ViT {arch} ({first})") from exc
    return model, arch
