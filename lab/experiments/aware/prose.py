"""Notebook 03's headline numbers and their Markdown findings, computed from a :class:`Study`
(the words carry only numbers computed here, never typed-in results).
"""
from __future__ import annotations

import numpy as np

from lab.experiments.aware.study import Study
from lab.experiments.aware.tables import (calibration_agreement, concentration, concentration_summary, frozen_by_target,
                                          parameter_budget)


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


def describe_study(study: dict) -> str:
    """Notebook 04's findings over a study as Markdown bullets, every sentence computed from the
    tables: whether each variant learned, whether full fine-tuning forgets (per upstream skill), the
    paired differences and the paper's findings as verdicts."""
    from lab.experiments.aware.study_views import REFERENCE, continual_verdicts, learned_sentence, verdicts

    s = study["summary"].set_index(["variant", "metric"]) if len(study["summary"]) else None
    lines = [f"- **Did each variant learn?** {learned_sentence(study)}"]

    def val(v, m, d=1):
        if s is None or (v, m) not in s.index or not np.isfinite(s.loc[(v, m), "estimate"]):
            return None
        x = s.loc[(v, m)]
        return f"{x.estimate:.{d}f} [{x.lo:.{d}f}, {x.hi:.{d}f}]"

    if val("methods/full", "R"):
        x = s.loc[("methods/full", "R")]
        word = ("forgets: its R interval lies below 100" if x.hi < 100 else
                "is not shown to forget: its R interval reaches 100, so no method can show protection here")
        lines.append(f"- **Does full fine-tuning forget?** R = {val('methods/full', 'R')} (easy-VQA "
                     f"{val('methods/full', 'R_easy_vqa')}, probe {val('methods/full', 'R_probe')}): it {word}.")
    if s is not None:
        rows = [f"{v.split('/')[1]} R {val(v, 'R')}" + (f", H {val(v, 'H')}" if val(v, 'H') else ", H not ranked")
                for v in ("methods/full", "methods/lora", "methods/dora", REFERENCE, "methods/rho=0") if val(v, "R")]
        if rows:
            lines.append("- **Methods** (95 % intervals): " + "; ".join(rows) + ".")
    if len(study.get("comparisons", ())):
        c = verdicts(study)
        for name in dict.fromkeys(c.comparison):
            lines.append(f"- **{name}:** " + "; ".join(c[c.comparison == name].verdict) + ".")
    f = study.get("findings")
    if f is not None and len(f):
        for r in f.itertuples():
            lines.append(f"- **The paper: {r.finding}** — {r.verdict} ({r.evidence}).")
    if len(study.get("continual_comparisons", ())):
        cc = continual_verdicts(study)
        lines.append("- **Continual sequence** (accuracy differences in points; the replay variant is this "
                     "project's extension, not the paper's protocol): " + "; ".join(cc.verdict) + ".")
    if not study["manifest"].get("complete", True):
        lines.append("- The study is not complete: groups and seeds still missing are not described here.")
    return "\n".join(lines)
