"""Notebook 03's headline numbers and their Markdown findings, computed from a :class:`Study`
(the words carry only numbers computed here, never typed-in results).
"""
from __future__ import annotations

import numpy as np

from lab.experiments.aware.study.profiles import Study
from lab.experiments.aware.study.profile_tables import (calibration_agreement, concentration, concentration_summary,
                                                        frozen_by_target, parameter_budget)


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
        out[f"overlap_{c}"] = float(agree.loc[c, "overlap"])
        out[f"spearman_{c}"] = float(agree.loc[c, "spearman"])
    out["chance_jaccard"] = float(agree.chance_jaccard.iloc[0])
    if ctx_model is not None:
        out["trainable_frac"] = parameter_budget(ctx_model, glob)["trainable_frac"]
    return out


def random_jaccard(rho: float) -> float:
    """The Jaccard two independent random masks that each freeze a fraction ``rho`` of the same rows
    have (in expectation, many rows): ``rho^2 / (2 rho - rho^2) = rho / (2 - rho)``; NaN at rho = 0."""
    return rho / (2 - rho) if 0 < rho <= 1 else float("nan")


# (lowest share of the way from chance to identical masks, verdict, in short, what it means); first match wins
CALIBRATION_VERDICTS = (
    (0.8, "mostly generic", "the top-ρ rows are mostly high-activation neurons in general, not carriers of "
     "upstream-specific knowledge",
     "the top-ρ rows are mostly neurons that fire strongly on *any* input — a property of the model and of "
     "activation magnitude, not of the upstream task. The saliency mostly measures how large a neuron's activation "
     "is in general, so freezing these rows protects high-activation neurons rather than specifically the carriers "
     "of what the model learned upstream"),
    (0.5, "largely generic", "most frozen rows are high-activation neurons that generic inputs select too",
     "most of the frozen rows are high-activation neurons that a generic input selects too; only a minority depends "
     "on the upstream data, so the mask stands for \"what the model knows\" only in part"),
    (0.2, "partly data-specific", "the calibration data moves a sizeable part of the mask",
     "the calibration data moves a sizeable part of the mask: the saliency carries information about the upstream "
     "data beyond activation magnitude in general"),
    (-float("inf"), "data-specific", "the mask depends on the calibration data",
     "the proxy selects barely more of the same rows than chance: the mask depends on the calibration data, as a "
     "set of task-specific knowledge carriers would"),
)


def calibration_verdict(jaccard: float, rho: float) -> tuple[str, str, str, float]:
    """``(verdict, in short, meaning, share)`` for the Jaccard of the upstream and proxy masks:
    ``share`` is how far it lies from the random-mask level :func:`random_jaccard` towards identical
    masks (0: chance, 1: identical); the verdict is the first of :data:`CALIBRATION_VERDICTS` whose
    bound it reaches."""
    c = random_jaccard(rho)
    if not (np.isfinite(jaccard) and np.isfinite(c)) or c >= 1:
        why = f"at rho = {rho:g} there is no mask to compare"
        return "not measurable", why, why, float("nan")
    share = (jaccard - c) / (1 - c)
    for bound, verdict, short, meaning in CALIBRATION_VERDICTS:
        if share >= bound:
            return verdict, short, meaning, share
    raise AssertionError("unreachable")


def calibration_reading(f: dict, study: Study) -> str:
    """Markdown: what the upstream-vs-proxy Jaccard says about "which neurons carry what the model
    knows", against the Jaccard of two random masks of the same rho, with a verdict chosen by the
    numbers (:func:`calibration_verdict`). ``f``: :func:`saliency_findings`."""
    ref, rho = f["reference"], f["rho"]
    proxy = next((k for k in study.labels if k.startswith("proxy")), None)
    if proxy is None or f"jaccard_{proxy}" not in f:
        return "No proxy calibration set was profiled here, so the calibration data cannot be compared."
    j, ov = f[f"jaccard_{proxy}"], f.get(f"overlap_{proxy}", float("nan"))
    c = random_jaccard(rho)
    verdict, _, meaning, share = calibration_verdict(j, rho)
    if not np.isfinite(share):
        return f"**Upstream vs proxy masks:** {meaning}."
    parts = [f"**Upstream vs proxy masks: {verdict}.** The proxy set ({proxy}: generic photos and questions that no "
             f"upstream task contains) and the upstream set ({ref}) freeze rows with Jaccard **{j:.2f}**. Two random "
             f"masks of the same ρ = {rho:g} would share ρ/(2−ρ) = {c:.2f} (the table's chance column); the measured "
             f"value is {j / c:.1f}x that and lies {100 * share:.1f}% of the way from chance to identical masks."]
    if np.isfinite(ov):
        parts.append(f"{100 * ov:.1f}% of the rows the upstream set freezes are frozen by the proxy too, so at most "
                     f"{100 * (1 - ov):.1f}% of them can be specific to the upstream data.")
    parts.append(f"What it means: {meaning}.")
    small = min((k for k in study.labels if k != ref and not k.startswith("proxy") and f"jaccard_{k}" in f),
                key=lambda k: study.n_samples.get(k, 0), default=None)
    if small is not None:
        js = f[f"jaccard_{small}"]
        parts.append(f"For scale: {100 * (1 - j):.1f}% of the rows either mask freezes are frozen by only one of "
                     f"them; between the masks from the first {study.n_samples[small]} and all {study.n_samples[ref]} "
                     f"upstream samples that share is {100 * (1 - js):.1f}% (Jaccard {js:.2f})"
                     + (f", so swapping the data for generic data moves the mask {(1 - j) / (1 - js):.1f}x as much as "
                        f"using {study.n_samples[small]} upstream samples instead of {study.n_samples[ref]}."
                        if 1 - js > 1e-9 else "."))
    jw = f.get("jaccard_weight-norm", float("nan"))
    if np.isfinite(jw):
        parts.append(f"The weight-norm rule, which sees no data at all, agrees {jw:.2f}: "
                     + ("the mask is not just large weights — it is what fires hard on typical inputs."
                        if jw < j else "the activation mask is no closer to the proxy mask than weight size is."))
    return " ".join(parts)


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
        verdict, short, _, share = calibration_verdict(f["jaccard_" + proxy], f["rho"])
        reading = (f" **{verdict[:1].upper() + verdict[1:]}** ({100 * share:.1f}% of the way from chance to identical "
                   f"masks): {short}." if np.isfinite(share) else "")
        lines.append(f"- **Calibration data.** Masks from {ref} and {proxy}: Jaccard {f['jaccard_' + proxy]:.2f} "
                     f"(two random masks of rho={f['rho']:g}: {random_jaccard(f['rho']):.2f}; the weight-norm rule "
                     f"{f['jaccard_weight-norm']:.2f}, a random mask {f['jaccard_random']:.2f}); rank correlation of "
                     f"the saliency {f['spearman_' + proxy]:.2f}.{reading}")
    if small != ref:
        lines.append(f"- **Calibration size.** The mask from the first {study.n_samples[small]} samples has Jaccard "
                     f"{f['jaccard_' + small]:.2f} with the {study.n_samples[ref]}-sample mask.")
    return "\n".join(lines)
