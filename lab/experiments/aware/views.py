"""Tables and plotly figures for the AWARe notebooks (03 saliency, 04 ablations).

Thin layer over :mod:`lab.aware`: nothing here trains or scores; it builds the context the
notebooks need, arranges saliency vectors / masks / result tables, and draws them.

* Context: :func:`setup` — :func:`lab.aware.ablate.setup` with two switches the notebooks need
  (``tiny=True``: the random 2-layer Llama of ``lab.aware.tiny`` for smoke runs; ``downstream=False``:
  skip the downstream tasks when only saliency is studied). :func:`profile_sets` profiles several
  calibration sets; :class:`Study` holds them with the weight-row norms so any rule can be re-run.
* Saliency (notebook 03): :func:`layer_table`, :func:`saliency_heatmaps`, :func:`concentration`,
  :func:`lorenz`, :func:`density`; masks: :func:`frozen_table`, :func:`frozen_by_layer`,
  :func:`mask_image`, :func:`overlap_table`, :func:`rank_agreement`.
* Ablations (notebook 04): in :mod:`lab.aware.ablation_views`, re-exported here (:func:`load_run`,
  :func:`summary`, :func:`rhe_bars`, :func:`tradeoff`, :func:`continual_figure`, :func:`findings`, ...).

Saliency is shown as ``s * sqrt(d_out)`` ("x uniform"): profiling normalises every sample to unit
L2 norm over a layer's ``d_out`` neurons, so a layer whose neurons were all equal would read
``1/sqrt(d_out)`` everywhere. Scaled this way, 1 means "an equal share" in every layer, whatever
its width, and layers of different widths (q: 576, k/v: 192 in SmolLM2) can share a colour scale.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from torch import Tensor

from lab.aware.targets import is_projector

MAIN_TARGETS = ("q_proj", "k_proj", "v_proj", "projector")
ALL_TARGETS = MAIN_TARGETS + ("gate_proj", "up_proj", "down_proj")
_KNOWN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_RULE_SHORT = {"activation-global": "global", "activation-balanced": "balanced"}


# --- building the context ----------------------------------------------------------------------
def setup(size, *, tiny: bool = False, downstream: bool = True, cache_dir=None, progress: bool = True,
          tasks=None):
    """An :class:`lab.aware.ablate.Context` for ``size`` (a ``Size`` or preset name).

    ``tiny=False`` is exactly :func:`lab.aware.ablate.setup` (SmolLM2 + the cached aligned projector)
    when ``downstream`` is True. ``tiny=True`` swaps in a randomly initialised 2-layer Llama with a
    word-level tokenizer over every word the tasks use (seconds; numbers are meaningless, code paths
    are the real ones) and sets torch to one thread. ``downstream=False`` leaves ``ctx.down`` empty
    (saliency only); ``tasks`` limits the downstream tasks built (default: all), see
    :func:`tasks_for`."""
    import time

    wanted_tasks = tasks
    from lab.aware import ablate, tasks
    from lab.aware.upstream import build_base

    size = ablate.SIZES[size] if isinstance(size, str) else size
    if tiny:
        # a 32-wide model gains nothing from intra-op threads, and on a busy machine they cost
        # (smoke runs measured 2-3x slower with 2 threads under load)
        torch.set_num_threads(1)
    if not tiny and downstream:
        return ablate.setup(size, progress=progress, cache_dir=cache_dir,
                            tasks_needed=None if wanted_tasks is None else tuple(wanted_tasks))
    t0 = time.perf_counter()
    kw = dict(grid=size.grid, cache_dir=cache_dir, progress=progress)
    easy = tasks.easy_vqa(n_train=size.n_align, n_test=size.n_easy_eval, **kw)
    wanted = tasks.DOWNSTREAM if wanted_tasks is None else tuple(dict.fromkeys(wanted_tasks))
    down = {t: tasks.downstream(t, n_train=size.n_train, n_test=size.n_eval, **kw)
            for t in wanted} if downstream else {}
    probe = tasks.probe()
    probe.test = probe.test.subset(range(min(size.n_probe, len(probe.test))))
    proxy = tasks.calibration("proxy", size.n_calib, **kw)
    lm = None
    if tiny:
        from lab.aware.tiny import tiny_llama, tiny_tokenizer

        sets = [easy.train, easy.test, probe.test, proxy] + [s for d in down.values() for s in (d.train, d.test)]
        tok = tiny_tokenizer(w for qa in sets for w in [*qa.questions, *qa.answers, *(o for opts in qa.options for o in opts)])
        lm = (tok, tiny_llama(len(tok)))
    base, enc, info = build_base(easy, size.align, grid=size.grid, cache_dir=cache_dir, progress=progress,
                                 language_model=lm)
    ctx = ablate.Context(base, enc, easy, probe, down, size, info={"align": info, "tiny": tiny})
    full = tasks.calibration("upstream", size.n_calib, upstream=easy)
    for n in {size.n_calib, *size.calib_sizes}:
        ctx.calib[("upstream", n)] = full.subset(range(min(n, len(full))))
    ctx.calib[("proxy", size.n_calib)] = proxy
    ctx.info["setup_s"] = time.perf_counter() - t0
    return ctx


def profile_sets(ctx, keys=None, *, targets: str = "qkv+projector+mlp", progress: bool = True) -> dict:
    """``{(kind, n): Saliency}`` for every calibration set in ``ctx.calib`` (or ``keys``), as the
    ablation runner profiles them (prompts with answers, all targets hooked at once)."""
    from lab.aware.continual import calibration_batches
    from lab.aware.saliency import profile

    # the main set (largest upstream) first: it is the reference everything else is compared with
    keys = sorted(ctx.calib, key=lambda k: (k[0] != "upstream", -k[1])) if keys is None else list(keys)
    out = {}
    for k in keys:
        batches = calibration_batches(ctx.calib[k], ctx.enc)
        out[k] = profile(ctx.base, batches, targets=targets, total=len(batches), progress=progress)
    return out


def profile_nested(ctx, sizes, kind: str = "upstream", *, targets: str = "qkv+projector+mlp",
                   progress: bool = True) -> dict:
    """``{(kind, n): Saliency}`` for the first ``n`` samples of the largest ``kind`` set, for every
    ``n`` in ``sizes``, at the cost of profiling the largest set once.

    Saliency is a mean over samples, so the profile of the first ``n`` samples is the count-weighted
    mean of the profiles of consecutive chunks. Matches :func:`profile_sets` on the nested sets that
    :func:`setup` builds (``ctx.calib[(kind, n)]`` = the first ``n`` of the largest)."""
    from lab.aware.continual import calibration_batches
    from lab.aware.saliency import Saliency, profile

    full = max((k for k in ctx.calib if k[0] == kind), key=lambda k: k[1])
    qa = ctx.calib[full]
    bounds = sorted({min(int(n), len(qa)) for n in sizes if int(n) >= 1} | {len(qa)})
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    seconds, start, out = 0.0, 0, {}
    for end in bounds:
        if end > start:
            batches = calibration_batches(qa.subset(range(start, end)), ctx.enc)
            s = profile(ctx.base, batches, targets=targets, total=len(batches), progress=progress)
            for n, v in s.scores.items():
                c = s.meta["counts"][n]
                sums[n] = sums.get(n, torch.zeros_like(v, dtype=torch.float64)) + c * v.double()
                counts[n] = counts.get(n, 0) + c
            seconds += s.seconds
            start = end
        key = full if end == len(qa) else (kind, end)     # every bound is a requested size or the whole set
        out[key] = Saliency({n: (sums[n] / max(counts[n], 1)).float() for n in sums}, end, seconds,
                            meta={"counts": dict(counts), "nested_in": label(full)})
    return dict(sorted(out.items(), key=lambda kv: -kv[0][1]))


def label(key) -> str:
    """``('upstream', 200)`` -> ``'upstream-200'``."""
    return f"{key[0]}-{key[1]}" if isinstance(key, tuple) else str(key)


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


# --- layers and saliency tables ----------------------------------------------------------------
def parse_layer(name: str) -> tuple[str, int | None]:
    """``'language_model.model.layers.12.self_attn.q_proj'`` -> ``('q_proj', 12)``; projector
    Linears -> ``('projector', None)`` (numbered by :func:`layer_table`)."""
    if is_projector(name):
        return "projector", None
    parts = name.split(".")
    target = next((p for p in reversed(parts) if p in _KNOWN), parts[-1])
    num = next((int(p) for p in parts if p.isdigit()), None)
    return target, num


def layer_table(scores: Mapping[str, Tensor]):
    """One row per layer: ``name, target, layer, d_out`` (projector Linears numbered 0, 1, ...)."""
    import pandas as pd

    rows, counters = [], {}
    for name, v in scores.items():
        target, num = parse_layer(name)
        if num is None:
            num = counters.get(target, 0)
        counters[target] = num + 1
        rows.append({"name": name, "target": target, "layer": num, "d_out": int(v.numel())})
    return pd.DataFrame(rows)


def target_summary(model, targets: str = "qkv+projector+mlp"):
    """Per target kind: how many Linear layers, their shapes, and their share of all parameters."""
    from lab.aware.targets import find_targets

    layers = find_targets(model, targets)
    total = sum(p.numel() for p in model.parameters())
    lt = layer_table({n: m.weight[:, 0] for n, m in layers.items()})
    lt["d_in"] = [layers[n].in_features for n in lt.name]
    lt["params"] = [layers[n].weight.numel() + (layers[n].bias.numel() if layers[n].bias is not None else 0)
                    for n in lt.name]
    g = lt.groupby("target", sort=False).agg(layers=("name", "size"), d_out=("d_out", "max"),
                                             d_in=("d_in", "max"), params=("params", "sum"))
    g["share_of_model_%"] = 100 * g.params / total
    return g.reset_index()


def layer_name(scores: Mapping[str, Tensor], target: str, layer: int) -> str:
    """The module name of ``target`` in ``layer`` (clamped to the last layer of that target)."""
    lt = layer_table(scores)
    lt = lt[lt.target == target]
    if lt.empty:
        raise ValueError(f"no layers of target {target!r}")
    return lt[lt.layer == min(int(layer), int(lt.layer.max()))].name.iloc[0]


def relative(v: Tensor) -> np.ndarray:
    """``s * sqrt(d_out)``: 1 = an equal share of the layer's (unit-norm) activation."""
    v = v.detach().float().cpu().numpy()
    return v * math.sqrt(v.size)


def _grid(scores: Mapping[str, Tensor], target: str, *, sort: bool, values=None) -> tuple[np.ndarray, list[int]]:
    """``[layers, max d_out]`` of one target (NaN-padded), rows in layer order."""
    lt = layer_table(scores)
    lt = lt[lt.target == target].sort_values("layer")
    if lt.empty:
        raise ValueError(f"no layers of target {target!r}; have {sorted(set(layer_table(scores).target))}")
    width = int(lt.d_out.max())
    out = np.full((len(lt), width), np.nan)
    for i, name in enumerate(lt.name):
        row = relative(scores[name]) if values is None else np.asarray(values[name], dtype=float)
        out[i, : row.size] = -np.sort(-row) if sort else row
    return out, lt.layer.tolist()


def targets_in(scores: Mapping[str, Tensor], wanted=MAIN_TARGETS) -> list[str]:
    have = set(layer_table(scores).target)
    return [t for t in wanted if t in have]


def concentration(scores: Mapping[str, Tensor], tops=(0.01, 0.1)):
    """Per layer: the share of activation energy (``s**2``, which sums to ~1 per layer) held by the
    top 1 % / 10 % of its neurons, the fraction of neurons that hold half of it, and the largest
    neuron in "x uniform" units. A uniform layer would read 1 %, 10 %, 50 % and 1."""
    import pandas as pd

    lt = layer_table(scores)
    rows = []
    for r in lt.itertuples():
        e = np.sort(scores[r.name].double().cpu().numpy() ** 2)[::-1]
        c = np.cumsum(e) / e.sum()
        row = {"target": r.target, "layer": r.layer, "d_out": r.d_out}
        for t in tops:
            row[f"top{t * 100:g}%_share"] = float(c[max(1, round(t * e.size)) - 1])
        row["half_mass_frac"] = float((np.searchsorted(c, 0.5) + 1) / e.size)
        row["max_x_uniform"] = float(relative(scores[r.name]).max())
        rows.append(row)
    return pd.DataFrame(rows)


def concentration_summary(conc, targets=ALL_TARGETS):
    """Median over layers of :func:`concentration`, one row per target."""
    cols = [c for c in conc.columns if c not in ("target", "layer", "d_out")]
    g = conc.groupby("target", sort=False)[cols].median()
    g["layers"] = conc.groupby("target", sort=False).size()
    return g.loc[[t for t in targets if t in g.index]].reset_index()


def lorenz(scores: Mapping[str, Tensor], points: int = 101):
    """Cumulative share of activation energy held by the top-x fraction of neurons (mean over the
    layers of each target): tidy ``target, neuron_frac, energy_share``."""
    import pandas as pd

    lt = layer_table(scores)
    xs = np.linspace(0, 1, points)
    rows = []
    for target, names in lt.groupby("target", sort=False).name:
        curves = []
        for n in names:
            e = np.sort(scores[n].double().cpu().numpy() ** 2)[::-1]
            c = np.concatenate([[0.0], np.cumsum(e) / e.sum()])
            curves.append(np.interp(xs, np.linspace(0, 1, c.size), c))
        rows += [{"target": target, "neuron_frac": x, "energy_share": y} for x, y in zip(xs, np.mean(curves, 0))]
    rows += [{"target": "uniform", "neuron_frac": x, "energy_share": x} for x in xs]
    return pd.DataFrame(rows)


def density(scores: Mapping[str, Tensor], bins: int = 60):
    """Histogram (density over log10 of "x uniform" saliency) per target: tidy ``target, log10_x, density``."""
    import pandas as pd

    lt = layer_table(scores)
    vals = {t: np.log10(np.clip(np.concatenate([relative(scores[n]) for n in names]), 1e-6, None))
            for t, names in lt.groupby("target", sort=False).name}
    lo, hi = min(v.min() for v in vals.values()), max(v.max() for v in vals.values())
    edges = np.linspace(lo, hi, bins + 1)
    rows = []
    for t, v in vals.items():
        h, _ = np.histogram(v, edges, density=True)
        rows += [{"target": t, "log10_x_uniform": (a + b) / 2, "density": d} for a, b, d in zip(edges[:-1], edges[1:], h)]
    return pd.DataFrame(rows)


# --- masks ---------------------------------------------------------------------------------------
def frozen_table(masks: Mapping[str, Tensor]):
    """One row per layer: ``target, layer, frozen, rows, fraction``."""
    lt = layer_table(masks)
    lt["frozen"] = [int(masks[n].sum()) for n in lt.name]
    lt["rows"] = lt.d_out
    lt["fraction"] = lt.frozen / lt.rows
    return lt.drop(columns="d_out")


def frozen_by_target(selections: Mapping[str, Mapping[str, Tensor]]):
    """Fraction of rows frozen per target, one column per selection: how a rule spreads rho."""
    import pandas as pd

    cols = {}
    for lab_, masks in selections.items():
        ft = frozen_table(masks)
        g = ft.groupby("target", sort=False)[["frozen", "rows"]].sum()
        cols[lab_] = pd.concat([g.frozen / g.rows, pd.Series({"all targets": g.frozen.sum() / g.rows.sum()})])
    return pd.DataFrame(cols)


def why_global(scores: Mapping[str, Tensor], masks: Mapping[str, Tensor]):
    """Why a global ranking freezes some targets more than others. Per target: its width, the
    level every neuron would have if all were equal (``1/sqrt(d_out)``, the per-sample norm is 1),
    the median and the top neuron of its layers (raw saliency ``s``, which is what the global rule
    compares), the global threshold (the smallest frozen ``s``) and the fraction frozen. A target
    whose *median* neuron sits above the threshold is mostly frozen: narrow, flat layers win."""
    import pandas as pd

    lt = layer_table(scores)
    frozen = torch.cat([scores[n][masks[n].bool()] for n in masks if masks[n].any()])
    thr = float(frozen.min()) if frozen.numel() else float("nan")
    rows = []
    for target, names in lt.groupby("target", sort=False).name:
        v = torch.cat([scores[n].float() for n in names])
        m = torch.cat([masks[n].bool() for n in names if n in masks]) if all(n in masks for n in names) else None
        rows.append({"target": target, "d_out": int(lt[lt.target == target].d_out.max()),
                     "equal_share_s": 1 / math.sqrt(int(lt[lt.target == target].d_out.max())),
                     "median_s": float(v.median()), "top_s": float(v.max()), "global_threshold_s": thr,
                     "frozen": float(m.float().mean()) if m is not None else float("nan")})
    return pd.DataFrame(rows)


def parameter_budget(model, masks: Mapping[str, Tensor]) -> dict:
    """What freezing ``masks`` leaves trainable, counted from the layer shapes (nothing is modified):
    every other parameter of ``model`` is frozen, as :func:`lab.aware.freeze.apply` does."""
    mods = dict(model.named_modules())
    trainable = sum(int((~m.bool()).sum()) * (mods[n].in_features + (mods[n].bias is not None))
                    for n, m in masks.items())
    target_params = sum(mods[n].weight.numel() + (mods[n].bias.numel() if mods[n].bias is not None else 0)
                        for n in masks)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "target_params": target_params, "total": total,
            "trainable_frac": trainable / total, "target_frac": target_params / total}


def overlap_table(selections: Mapping[str, Mapping[str, Tensor]], reference: str):
    """Agreement of every selection with ``reference``: Jaccard, overlap coefficient, and what two
    independent random selections of the same sizes would give (the chance level)."""
    import pandas as pd

    from lab.aware.masking import frozen_fraction
    from lab.aware.metrics import mask_overlap

    ref = selections[reference]
    rows = []
    for name, masks in selections.items():
        if name == reference:
            continue
        p, q = frozen_fraction(ref), frozen_fraction(masks)
        chance_j = p * q / (p + q - p * q) if p + q > 0 else 1.0
        rows.append({"reference": reference, "compared": name, **mask_overlap(ref, masks),
                     "chance_jaccard": chance_j, "chance_overlap": max(p, q) if min(p, q) > 0 else 1.0})
    return pd.DataFrame(rows)


def jaccard_matrix(selections: Mapping[str, Mapping[str, Tensor]]):
    import pandas as pd

    from lab.aware.metrics import mask_overlap

    names = list(selections)
    return pd.DataFrame([[mask_overlap(selections[a], selections[b])["jaccard"] for b in names] for a in names],
                        index=names, columns=names)


def _ranks(x: Tensor) -> Tensor:
    r = torch.empty_like(x)
    r[torch.argsort(x)] = torch.arange(x.numel(), dtype=x.dtype)
    return r


def rank_agreement(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """Spearman correlation of two saliency profiles over all common neurons (global ranking)."""
    common = [k for k in a if k in b]
    x = torch.cat([a[k].double().flatten() for k in common])
    y = torch.cat([b[k].double().flatten() for k in common])
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()).clamp_min(1e-12))


# --- figures: saliency -----------------------------------------------------------------------------
def saliency_heatmaps(scores: Mapping[str, Tensor], targets=MAIN_TARGETS, *, sort: bool = False,
                      masks: Mapping[str, Tensor] | None = None, title: str = "", height: int | None = None):
    """Layer x neuron heatmaps, one panel per target, colour = log10 of "x uniform" saliency
    (``masks`` given: 1 where a row is frozen instead). ``sort``: neurons ordered by saliency
    within each layer (rank on x), which makes the heavy tail visible at a glance."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    wanted, targets = targets, targets_in(scores, targets)
    if not targets:
        raise ValueError(f"no layers of target {list(wanted)}; have {sorted(set(layer_table(scores).target))}")
    grids = {}
    for t in targets:
        if masks is None:
            g, layers = _grid(scores, t, sort=sort)
            g = np.round(np.log10(np.clip(g, 1e-3, None)), 3)
        else:
            g, layers = _grid(scores, t, sort=False, values={n: masks[n].float().numpy() for n in masks})
        grids[t] = (g, layers)
    heights = [max(len(l), 3) for _, l in grids.values()]
    fig = make_subplots(rows=len(targets), cols=1, row_heights=heights, vertical_spacing=0.1 if len(targets) > 1 else 0.05,
                        subplot_titles=[f"{t} ({grids[t][0].shape[0]} layers x {grids[t][0].shape[1]} neurons)"
                                        for t in targets])
    for i, t in enumerate(targets, 1):
        g, layers = grids[t]
        fig.add_trace(go.Heatmap(z=g.astype(np.float32), y=[str(x) for x in layers], coloraxis="coloraxis",
                                 hovertemplate="layer %{y}<br>neuron %{x}<br>%{z}<extra>" + t + "</extra>"), i, 1)
        fig.update_yaxes(title_text="layer", type="category", row=i, col=1)
        if i == len(targets):
            fig.update_xaxes(title_text="neuron, most salient first" if sort else "neuron", row=i, col=1)
    if masks is None:
        # symmetric around 0 (= an equal share) and wide enough for the 99.9th percentile
        vals = np.concatenate([g[np.isfinite(g)] for g, _ in grids.values()])
        lim = float(max(np.quantile(np.abs(vals), 0.999), 0.1)) if vals.size else 1.0
        color = dict(colorscale="RdBu_r", cmid=0, cmin=-lim, cmax=lim,
                     colorbar=dict(title="log10<br>x equal<br>share"))
    else:
        color = dict(colorscale=[[0, "#f0f0f0"], [1, "#c0392b"]], cmin=0, cmax=1,
                     colorbar=dict(title="frozen", tickvals=[0, 1], ticktext=["trained", "frozen"]))
    fig.update_layout(coloraxis=color, title=title, height=height or 160 + 14 * sum(heights) + 60 * len(targets),
                      margin=dict(t=80))
    return fig


def lorenz_figure(scores: Mapping[str, Tensor], title: str = ""):
    from lab import plots

    fig = plots.lines(lorenz(scores), x="neuron_frac", y="energy_share", color="target", range_y=(0, 1.01),
                      x_title="fraction of a layer's neurons (most salient first)",
                      y_title="share of activation energy", title=title or "How few neurons carry the activation mass")
    fig.update_traces(marker=dict(size=2))
    fig.for_each_trace(lambda tr: tr.update(line=dict(dash="dot", color="grey")) if tr.name == "uniform" else None)
    return fig


def density_figure(scores: Mapping[str, Tensor], title: str = ""):
    from lab import plots

    fig = plots.lines(density(scores), x="log10_x_uniform", y="density", color="target",
                      x_title="log10 saliency (x uniform share; 0 = an equal share)", y_title="density",
                      title=title or "Distribution of neuron saliency per target (all layers pooled)")
    fig.update_traces(marker=dict(size=3))
    fig.add_vline(x=0, line_dash="dot", line_color="grey")
    return fig


def frozen_by_layer(selections: Mapping[str, Mapping[str, Tensor]], targets=MAIN_TARGETS, title: str = ""):
    """Fraction of each layer's rows frozen, one line per target, one panel per selection."""
    import pandas as pd
    import plotly.express as px

    df = pd.concat([frozen_table(m).assign(selection=k) for k, m in selections.items()])
    df = df[df.target.isin(targets)]
    fig = px.line(df, x="layer", y="fraction", color="target", facet_col="selection", markers=True,
                  range_y=(-0.02, 1.02), title=title or "Which layers the selection freezes",
                  hover_data=["frozen", "rows"])
    fig.update_layout(height=380, yaxis_title="frozen fraction of the layer's rows")
    fig.for_each_annotation(lambda a: a.update(text=a.text.partition("=")[2]))
    return fig


def mask_image(masks: Mapping[str, Tensor], targets=MAIN_TARGETS, title: str = ""):
    """Frozen rows as layer x neuron maps (red = frozen), one panel per target."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    n = int(frozen_table(masks).target.isin(targets).sum())
    return saliency_heatmaps(masks, targets, masks=masks, title=title or f"frozen rows of {', '.join(targets)}",
                             height=200 + 12 * n + 60 * len(targets))


def calibration_agreement(study: Study, rho: float = 0.3, reference: str | None = None, *, seed: int = 0):
    """How much the rho-masks from every calibration profile (and from the weight-norm and random
    rules) agree with the reference profile's: Jaccard, overlap, chance levels, and the Spearman
    correlation of the saliency itself over all neurons (``nan`` for the non-activation rules)."""
    reference = reference or study.labels[0]
    sel = {lab_: study.select(lab_, rho) for lab_ in study.labels}
    sel["weight-norm"] = study.select(reference, rho, "weight-norm")
    sel["random"] = study.select(reference, rho, "random", seed=seed)
    ot = overlap_table(sel, reference)
    ref_scores = study.scores(reference)
    ot["spearman"] = [rank_agreement(ref_scores, study.scores(c)) if c in study.profiles else float("nan")
                      for c in ot.compared]
    ot["samples"] = [study.n_samples.get(c, np.nan) for c in ot.compared]
    return ot, sel


def calibration_size_figure(agreement, title: str = ""):
    """Jaccard with the reference mask against calibration-set size (nested upstream sets), with the
    proxy set and the chance level as reference lines."""
    import plotly.graph_objects as go

    ref = agreement.reference.iloc[0]
    kind = ref.split("-")[0]
    nested = agreement[agreement.compared.str.startswith(kind + "-")].sort_values("samples")
    fig = go.Figure(go.Scatter(x=nested.samples, y=nested.jaccard, mode="lines+markers", name=f"first n {kind} samples"))
    for r in agreement[~agreement.compared.str.startswith(kind + "-")].itertuples():
        fig.add_hline(y=r.jaccard, line_dash="dash", annotation_text=r.compared, annotation_position="top left",
                      line_color="#e67e22" if r.compared.startswith("proxy") else "#7f8c8d")
    fig.add_hline(y=float(agreement.chance_jaccard.iloc[0]), line_dash="dot", line_color="black",
                  annotation_text="chance", annotation_position="bottom left")
    fig.update_layout(title=title or f"How many calibration samples does the mask need? (Jaccard with {ref})",
                      xaxis_title="calibration samples", yaxis_title="Jaccard with the reference mask",
                      xaxis_type="log", yaxis_range=(0, 1.02), height=400)
    fig.update_xaxes(tickvals=list(nested.samples), ticktext=[str(int(n)) for n in nested.samples])
    return fig


def describe_saliency(f: dict, study: Study) -> str:
    """Notebook 03's findings as Markdown bullets, from :func:`saliency_findings` (computed numbers only)."""
    ref = f["reference"]
    proxy = next((k for k in study.labels if k.startswith("proxy")), None)
    small = min(study.n_samples, key=study.n_samples.get) if study.n_samples else ref
    pct = lambda k: f"{100 * f[k]:.1f}%"  # noqa: E731
    lines = [f"- **Heavy tail.** In the median q layer the top 1% of neurons hold {pct('q_proj_top1_share')} of the "
             f"activation energy (uniform: 1%); half of it sits in {pct('q_proj_half_mass_frac')} of the neurons "
             f"(k {pct('k_proj_half_mass_frac')}, v {pct('v_proj_half_mass_frac')}, projector "
             f"{pct('projector_half_mass_frac')}; uniform: 50%)."]
    if "q_proj_frozen" in f:
        lines.append(f"- **What rho={f['rho']:g} freezes (global rule).** q {pct('q_proj_frozen')}, k {pct('k_proj_frozen')}, "
                     f"v {pct('v_proj_frozen')}, projector {pct('projector_frozen')} of their rows"
                     + (f"; {pct('trainable_frac')} of all parameters stay trainable." if "trainable_frac" in f else "."))
    if proxy:
        lines.append(f"- **Calibration data.** Masks from {ref} and {proxy}: Jaccard {f['jaccard_' + proxy]:.2f} "
                     f"(chance {f['chance_jaccard']:.2f}; the weight-norm rule {f['jaccard_weight-norm']:.2f}, a random "
                     f"mask {f['jaccard_random']:.2f}); rank correlation of the saliency {f['spearman_' + proxy]:.2f}.")
    if small != ref:
        lines.append(f"- **Calibration size.** The mask from the first {study.n_samples[small]} samples has Jaccard "
                     f"{f['jaccard_' + small]:.2f} with the {study.n_samples[ref]}-sample mask.")
    return "\n".join(lines)


def saliency_findings(study: Study, ctx_model=None, rho: float = 0.3, *, seed: int = 0) -> dict:
    """Headline numbers of notebook 03, computed from a :class:`Study` (and the model, for the
    trainable fraction of all parameters)."""
    ref = study.labels[0]
    conc = concentration_summary(concentration(study.scores(ref))).set_index("target")
    glob = study.select(ref, rho)
    by = frozen_by_target({"g": glob})["g"]
    agree, _ = calibration_agreement(study, rho, ref, seed=seed)
    agree = agree.set_index("compared")
    out = {"reference": ref, "rho": rho}
    for t in conc.index:
        out[f"{t}_top1_share"] = float(conc.loc[t, "top1%_share"])
        out[f"{t}_half_mass_frac"] = float(conc.loc[t, "half_mass_frac"])
        out[f"{t}_frozen"] = float(by.get(t, np.nan))
    for c in agree.index:
        out[f"jaccard_{c}"] = float(agree.loc[c, "jaccard"])
        out[f"spearman_{c}"] = float(agree.loc[c, "spearman"])
    out["chance_jaccard"] = float(agree.chance_jaccard.iloc[0])
    if ctx_model is not None:
        out["trainable_frac"] = parameter_budget(ctx_model, glob)["trainable_frac"]
    return out


def layer_profile(scores: Mapping[str, Tensor], name: str, frozen: Tensor | None = None, title: str = ""):
    """One layer's neurons sorted by saliency ("x uniform", log y), frozen ones in red."""
    import plotly.graph_objects as go

    v = relative(scores[name])
    order = np.argsort(-v)
    colors = None if frozen is None else np.where(frozen.bool().numpy()[order], "#c0392b", "#7f8c8d")
    fig = go.Figure(go.Bar(x=np.arange(v.size), y=v[order], marker_color=colors,
                           customdata=order, hovertemplate="rank %{x}<br>neuron %{customdata}<br>%{y:.2f}x<extra></extra>"))
    fig.add_hline(y=1, line_dash="dot", line_color="grey")
    fig.update_layout(title=title or name, height=320, bargap=0, xaxis_title="neurons, most salient first",
                      yaxis_title="saliency (x uniform)", yaxis_type="log")
    return fig


# notebook 04's tables and figures live in their own file; one ``views`` namespace for the notebooks
from lab.aware.ablation_views import (  # noqa: E402,F401
    chance_options, chance_rate, continual_bars, continual_figure, describe_ablation, findings, load_run,
    majority_rate, noise_table, rho_curves, rhe_bars, run_info, run_sweep, summary, sweep_size, tasks_for,
    tradeoff)
