"""Target patterns checked against the offline mini-LLaVA's module names before any weight is read
(``lab aware`` validates ``--targets`` with :func:`check_targets`; docs/aware.md, "Phase 2")."""
from __future__ import annotations

import struct
from pathlib import Path

from lab.aware.targets import TARGET_PRESETS, VISION_EXCLUDE


def _gguf_int(path: str | Path, key: str) -> int:
    """An integer from a GGUF file's key-value header, read sequentially up to ``key`` (the
    tokenizer tables after it are never parsed; see the GGUF format in ggml's docs/gguf.md)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    ints = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
    with open(path, "rb") as fh:
        def read(n):
            b = fh.read(n)
            if len(b) != n:
                raise ValueError(f"{path}: truncated GGUF header")
            return b

        def skip(vtype):
            if vtype in sizes:
                fh.seek(sizes[vtype], 1)
            elif vtype == 8:
                fh.seek(struct.unpack("<Q", read(8))[0], 1)
            elif vtype == 9:
                sub, n = struct.unpack("<IQ", read(12))
                for _ in range(n):
                    skip(sub)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {vtype}")

        if read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        _version, _tensors, n_kv = struct.unpack("<IQQ", read(20))
        for _ in range(n_kv):
            name = read(struct.unpack("<Q", read(8))[0]).decode()
            vtype = struct.unpack("<I", read(4))[0]
            if name == key and vtype in ints:
                return struct.unpack(ints[vtype], read(sizes[vtype]))[0]
            skip(vtype)
    raise KeyError(f"{path}: no {key} in the GGUF header")


def mini_llava_skeleton():
    """The offline mini-LLaVA's module tree on the meta device (no weights read or allocated):
    SmolLM2's layer count from its GGUF header, tiny widths (names do not depend on them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lab.experiments.aware.run.minillava import MiniLlava, smollm2_gguf

    folder, gguf = smollm2_gguf()
    layers = _gguf_int(Path(folder) / gguf, "llama.block_count")
    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=16)
    with torch.device("meta"):
        return MiniLlava(LlamaForCausalLM(cfg), vision_dim=8)


def check_targets(targets: str, *, param: str = "--targets", exclude: str | None = VISION_EXCLUDE,
                  model: str | None = None) -> tuple[str, ...]:
    """Target patterns compiled and matched against the mini-LLaVA's Linear layers (or, with
    ``model``, a hub LLaVA's from its config: :func:`lab.experiments.aware.run.hub_llava.skeleton`)
    before any model is loaded; one line naming ``param`` on a malformed or unmatched pattern."""
    from lab import _validate
    from lab.aware.targets import expand_targets, find_targets

    patterns = expand_targets(targets)
    if not patterns:
        raise _validate.bad(param, targets, f"give a preset ({', '.join(TARGET_PRESETS)}) or comma-separated "
                                            "module-name patterns")
    _validate.regexes(param, patterns)
    what = "the mini-LLaVA"
    if model is not None:
        from lab.experiments.aware.run.hub_llava import skeleton

        what, model = model, skeleton(model)
        if model is None:       # only the hub has its config: checked when the model loads
            return patterns
    else:
        model = mini_llava_skeleton()
    try:
        find_targets(model, patterns, exclude=exclude)
    except ValueError:
        from torch import nn

        names = sorted({next(p for p in reversed(n.split(".")) if not p.isdigit())
                        for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise _validate.bad(param, targets, f"matches no Linear layer of {what} (patterns match whole name "
                                            f"components); its Linear layers are named {', '.join(names)}; presets: "
                                            f"{', '.join(TARGET_PRESETS)}") from None
    return patterns
