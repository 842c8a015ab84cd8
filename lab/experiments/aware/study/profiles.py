"""Saliency profiles saved and loaded with the weight-row norms: a :class:`Study` re-runs every
selection rule without the model (notebook 03, the mask widgets; docs/aware.md, "Phase 1").
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor

from lab.experiments.aware.run.profiling import label


@dataclass
class Study:
    """Saliency profiles of one model (``{label: {layer: Tensor[d_out]}}``) plus its weight-row norms,
    enough to re-run every selection rule without the model (:meth:`select`)."""

    profiles: dict[str, dict[str, Tensor]]
    norms: dict[str, Tensor]
    n_samples: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_context(cls, ctx, saliency: Mapping) -> "Study":
        from lab.aware.masking import row_norms

        first = next(iter(saliency.values()))
        modules = dict(ctx.base.named_modules())
        layers = {n: modules[n] for n in first.scores}   # the profiled layers, by exact name
        return cls({label(k): dict(s.scores) for k, s in saliency.items()}, row_norms(layers),
                   {label(k): s.n_samples for k, s in saliency.items()},
                   {label(k): s.seconds for k, s in saliency.items()})

    def save(self, folder) -> Path:
        """Write every profile as ``saliency_<label>.safetensors`` (the layout ``lab aware ablate``
        uses) and the row norms as ``row_norms.safetensors``; :meth:`load` reads them back."""
        from lab._io import save_tensors

        folder = Path(folder)
        for lab_, scores in self.profiles.items():
            names = list(scores)
            save_tensors(folder / f"saliency_{lab_.replace('-', '_')}.safetensors",
                         {f"layer/{n}": v.float().contiguous() for n, v in scores.items()},
                         {"layers": json.dumps(names), "n_samples": str(self.n_samples.get(lab_, 0)),
                          "seconds": f"{self.seconds.get(lab_, 0.0):.3f}"})
        save_tensors(folder / "row_norms.safetensors", {n: v.float().contiguous() for n, v in self.norms.items()},
                     {"layers": json.dumps(list(self.norms))})
        return folder

    @classmethod
    def load(cls, folder) -> "Study":
        """Profiles saved by :meth:`save` or by ``lab aware ablate`` / ``lab aware profile`` (a run
        folder). Without ``row_norms.safetensors`` the ``weight-norm`` rule is unavailable."""
        from lab._io import load_tensors

        folder = Path(folder)
        files = sorted(folder.glob("saliency_*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no saliency_*.safetensors in {folder}")
        profiles, n_samples, seconds = {}, {}, {}
        for f in files:
            t, meta = load_tensors(f)
            lab_ = f.stem.removeprefix("saliency_").replace("_", "-")
            names = json.loads(meta["layers"]) if "layers" in meta else [k[6:] for k in t if k.startswith("layer/")]
            profiles[lab_] = {n: t[f"layer/{n}"] for n in names}
            n_samples[lab_], seconds[lab_] = int(meta.get("n_samples", 0)), float(meta.get("seconds", 0))
        profiles = dict(sorted(profiles.items(), key=lambda kv: (not kv[0].startswith("upstream"), -n_samples[kv[0]])))
        norms = {}
        if (folder / "row_norms.safetensors").exists():
            t, meta = load_tensors(folder / "row_norms.safetensors")
            norms = {n: t[n] for n in json.loads(meta.get("layers", "[]")) or list(t)}   # the saved layer order
        if not norms:   # layer names (and sizes) still come from the profiles
            norms = {n: torch.full_like(v, float("nan")) for n, v in next(iter(profiles.values())).items()}
        return cls(profiles, norms, n_samples, seconds)

    @property
    def labels(self) -> list[str]:
        return list(self.profiles)

    def layers(self, targets: str = "qkv+projector") -> list[str]:
        """Profiled layer names belonging to a target preset (or comma-separated patterns)."""
        from lab.aware.targets import expand_targets

        pats = expand_targets(targets)
        return [n for n in self.norms if any(re.fullmatch(p, part) for p in pats for part in n.split("."))]

    def scores(self, profile: str, targets: str = "qkv+projector") -> dict[str, Tensor]:
        return {n: self.profiles[profile][n] for n in self.layers(targets)}

    def select(self, profile: str, rho: float, rule: str = "activation-global",
               targets: str = "qkv+projector", seed: int = 0) -> dict[str, Tensor]:
        """Frozen rows for one profile, rule and rho: :func:`lab.aware.masking.select` on the stored
        saliency (``weight-norm`` ranks the stored row norms exactly as the library does)."""
        from lab.aware.masking import select

        if rule == "weight-norm":
            norms = {n: self.norms[n] for n in self.layers(targets)}
            if any(torch.isnan(v).any() for v in norms.values()):
                raise ValueError("no weight-row norms stored with these profiles: 'weight-norm' needs the model "
                                 "(Study.from_context) or a row_norms.safetensors saved by Study.save")
            return select(norms, rho, "activation-global")
        return select(self.scores(profile, targets), rho, rule, seed=seed)
