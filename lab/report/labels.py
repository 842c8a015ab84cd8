"""What each headline number of the report index means: a label a reader understands and its unit.

Notebooks record their numbers under short keys (``report.record(live_tosca_per_batch_last_acc=...)``);
the index card and the notebook's own table show ``label`` and ``unit`` instead, the key itself only
as a tooltip. A key that already reads as words (``"AWARe: downstream (accuracy)"``, with a space
or capital letters) is its own label. A new snake_case key needs a line here:
``tests/test_report.py`` checks every key the notebooks' ``record()`` calls name, and the smoke
renders every key a notebook records.
"""
from __future__ import annotations

import re

# units, as shown after a value: one short line (UNIT_CHARS at most; a test holds it), the whole
# explanation in UNIT_NOTES (the unit's tooltip) and in docs/glossary.md
UNIT_CHARS = 26
_WILSON_FRAC = "fraction, 95 % Wilson"
_WILSON_PCT = "%, 95 % Wilson"
_SEEDS_PCT = "%, mean [95 % t, seeds]"
_UNIT_01 = "linear CKA, 1 = unchanged"
_INVARIANCE = "1 = invariant, 0 = none"
_SEEDS_FRAC_DIFF = "fraction [95 % t, seeds]"
_WEIGHTS_NEAR_ZERO = "|w| < 1e-3, weights only"
_GATE_DEPARTURE = "0 = every gate at 0.5"
_JACCARD_EXCESS = "Jaccard [95 % t, seeds]"
_POINTS_SEEDS = "points [95 % t, seeds]"
UNIT_NOTES = {
    _WILSON_FRAC: "fraction correct, with its 95 % Wilson interval over the test images",
    _WILSON_PCT: "% correct, with its 95 % Wilson interval over the test images",
    _SEEDS_PCT: "% correct: the mean over seeds with its 95 % Student-t interval",
    _UNIT_01: "0 to 1; 1 = the same similarity structure as before",
    _INVARIANCE: "1 = the augmented twin is as close as the image itself, 0 = no closer than another image",
    _SEEDS_FRAC_DIFF: "a difference of two accuracies (fractions) computed seed by seed, then its mean with the 95 % "
                      "Student-t interval over seeds, and the verdict: higher, lower or no difference detected",
    _WEIGHTS_NEAR_ZERO: "the fraction of the entries of LuCA's four weight matrices (adapter and calibrator, down and up) "
                        "with |w| < 1e-3, mean over tasks, then the mean over seeds with its 95 % t-interval; the "
                        "adapter's biases and the LayerNorm are counted apart (they start at 0 and 1)",
    _GATE_DEPARTURE: "mean |g − 0.5| of the calibrator gates on each task's own images, mean over seeds with its 95 % "
                     "t-interval; a gate with zero weights is 0.5, where gates start and where L1 pulls them",
    _JACCARD_EXCESS: "the Jaccard index of two tasks' active gate dimensions (mean over task pairs) minus its "
                     "permutation null (random sets of the same sizes), mean over seeds with its 95 % t-interval; "
                     "below 0 = less overlap than chance",
    _POINTS_SEEDS: "a difference in accuracy points computed seed by seed, then its mean with the 95 % Student-t "
                   "interval over seeds",
}

LABELS: dict[str, tuple[str, str]] = {
    # 00_quickstart
    "prototype_accuracy": ("Nearest-prototype accuracy on the frozen features (the SimpleCIL floor)", _WILSON_FRAC),
    "train_images": ("Training images", "images"),
    "extract_seconds": ("Feature extraction, train and test splits", "s"),
    "cache_hit_seconds": ("The same features again, from the cache", "s"),
    # 01_ventral_vs_prefrontal
    "best_probe_stage": ("Most linearly decodable backbone stage", "stage"),
    "best_probe_accuracy": ("Linear-probe accuracy at that stage (this run, one seed)", _WILSON_FRAC),
    "head_probe_accuracy": ("Linear-probe accuracy at the head, the decision point (this run, one seed)", _WILSON_FRAC),
    "stem_probe_accuracy": ("Linear-probe accuracy at the stem (this run, one seed)", _WILSON_FRAC),
    "photometric_invariance_head": ("Photometric invariance at the head", _INVARIANCE),
    "photometric_invariance_stem": ("Photometric invariance at the stem", _INVARIANCE),
    "ft_task_accuracy": ("New-task accuracy, full fine-tuning at this notebook's epochs (this run, one seed)",
                         _WILSON_FRAC),
    "tosca_task_accuracy": ("New-task accuracy, TOSCA at this notebook's epochs (this run, one seed)", _WILSON_FRAC),
    "ft_cka_head": ("Head features before vs after full fine-tuning (linear CKA)", _UNIT_01),
    "tosca_min_stage_cka": ("Least similar backbone stage before vs after TOSCA (linear CKA)", _UNIT_01),
    "tosca_backbone_bit_identical": ("Backbone bit-identical after TOSCA", "1 = yes, 0 = no"),
    "other_classes_accuracy_frozen": ("Other classes, prototype accuracy, frozen backbone (this run, one seed)",
                                      _WILSON_FRAC),
    "other_classes_accuracy_ft": ("Other classes, prototype accuracy, after full fine-tuning (this run, one seed)",
                                  _WILSON_FRAC),
    "imagenet_agreement_ft": ("An anecdote, 12 photos: ImageNet top-1 answers kept after full fine-tuning (this run)",
                              "fraction, 95 % Wilson"),
    "seeds_compared": ("Seeds in the shipped comparisons over seeds (notebook 01's report settings)", "seeds"),
    "seeds_probe_stage_minus_head": ("Over seeds (shipped): linear probe at this run's most decodable stage minus at "
                                     "the head, paired by seed", _SEEDS_FRAC_DIFF),
    "seeds_other_classes_ft_minus_frozen": ("Over seeds (shipped): other classes' prototype accuracy after full "
                                            "fine-tuning minus before, paired by seed", _SEEDS_FRAC_DIFF),
    "seeds_task_ft_minus_tosca": ("Over seeds (shipped): new-task accuracy, full fine-tuning (2 epochs) minus TOSCA "
                                  "(20 epochs), paired by seed", _SEEDS_FRAC_DIFF),
    # 02_tosca_sparsity_orthogonality: this notebook's own run, then the shipped study
    "live_tosca_last_acc": ("TOSCA last-stage accuracy A_B, per-sample routing (this run, one seed)", _WILSON_PCT),
    "live_tosca_oracle_last_acc": ("TOSCA A_B, oracle routing, upper bound (this run, one seed)", _WILSON_PCT),
    "live_tosca_per_batch_last_acc": ("TOSCA A_B, per-batch routing, the reference's protocol (this run, one seed)",
                                      _WILSON_PCT),
    "live_routing_accuracy_pct": ("Routing accuracy, per-sample, last stage: images sent to their own task's "
                                  "module (this run, one seed)", _WILSON_PCT),
    "live_simplecil_last_acc": ("SimpleCIL A_B (this run, one seed)", _WILSON_PCT),
    "live_finetune_last_acc": ("Sequential fine-tuning A_B, lower bound (this run, one seed)", _WILSON_PCT),
    "live_joint_last_acc": ("Joint training A_B, upper bound (this run, one seed)", _WILSON_PCT),
    "live_per_batch_shuffled_acc": ("TOSCA accuracy, per-batch routing on shuffled batches of 48 (this run, one seed)",
                                    _WILSON_PCT),
    "live_seed": ("Seed of this notebook's run", "seed"),
    "scenario": ("Scenario", "datasets B(first) Inc(k)"),
    "mech_seeds": ("Seeds in the mechanism study", "seeds"),
    "mech_weight_near_zero": ("Mechanism study, the reference's L1 and epochs: LuCA weight-matrix entries near zero "
                              "(fraction; biases and LayerNorm apart)", _WEIGHTS_NEAR_ZERO),
    "mech_gate_departure": ("Mechanism study, the reference's L1 and epochs: mean |gate − 0.5| (gates start near 0.5)",
                            _GATE_DEPARTURE),
    "mech_jaccard_minus_chance": ("Mechanism study, the reference's L1 and epochs: tasks' active gate dimensions "
                                  "shared, minus chance", _JACCARD_EXCESS),
    "shipped_seeds": ("Seeds in the shipped study's headline (TOSCA under every router, the baselines)", "seeds"),
    "shipped_tosca_per_sample_last_acc": ("Shipped study: TOSCA A_B, per-sample routing", _SEEDS_PCT),
    "shipped_tosca_per_sample_avg_inc_acc": ("Shipped study: TOSCA average incremental accuracy Ā, per-sample "
                                             "routing", _SEEDS_PCT),
    "shipped_tosca_per_batch_last_acc": ("Shipped study: TOSCA A_B, per-batch routing (the reference's protocol)",
                                         _SEEDS_PCT),
    "shipped_tosca_ridge_last_acc": ("Shipped study: TOSCA A_B, ridge routing (PRISM's global ridge, not the TOSCA "
                                     "paper's entropy routing)", _SEEDS_PCT),
    "shipped_entropy_minus_simplecil_last_acc": ("Shipped study: TOSCA A_B under per-sample entropy minus SimpleCIL's, "
                                                 "paired by seed", _POINTS_SEEDS),
    "shipped_ridge_minus_entropy_last_acc": ("Shipped study: A_B of ridge routing minus per-sample entropy, paired "
                                             "by seed", _POINTS_SEEDS),
    "shipped_ranpac_last_acc": ("Shipped study: RanPAC A_B", _SEEDS_PCT),
    # 03_aware_saliency
    "q_top1pct_energy": ("Activation energy in the top 1 % of q neurons, median layer", "% (uniform: 1 %)"),
    "q_half_mass_neurons_pct": ("q neurons that hold half the activation mass, median layer",
                                "% (uniform: 50 %)"),
    "frozen_q_pct": ("q rows AWARe freezes (global ranking)", "% of the q rows"),
    "frozen_k_pct": ("k rows AWARe freezes (global ranking)", "% of the k rows"),
    "frozen_v_pct": ("v rows AWARe freezes (global ranking)", "% of the v rows"),
    "trainable_pct": ("Parameters that stay trainable", "% of all parameters"),
    "jaccard_upstream_proxy": ("Mask agreement, upstream vs proxy calibration set", "Jaccard, 0 to 1"),
    "jaccard_chance": ("Mask agreement expected by chance", "Jaccard, 0 to 1"),
    "jaccard_smallest_set": ("Mask agreement, smallest vs largest calibration set", "Jaccard, 0 to 1"),
    "profile_ms_per_sample": ("Saliency profiling cost", "ms per calibration sample"),
    # 04_aware_ablations (its numbers are labelled in their keys; these are its context strings)
    "study": ("Shipped study (folder @ sha256 of its sources)", ""),
    "complete": ("Study complete", ""),
    "code": ("This code vs the study's sources", ""),
}

_RAW = re.compile(r"[a-z][a-z0-9_]*")   # a key written for code, not for a reader


def is_raw(key: str) -> bool:
    """``key`` is an identifier-like key (needs a label), not words."""
    return bool(_RAW.fullmatch(key))


def label(key: str) -> tuple[str, str]:
    """``(label, unit)`` of a recorded key; a key that reads as words is its own label (no unit)."""
    if key in LABELS:
        return LABELS[key]
    if not is_raw(key):
        return key, ""
    return key.replace("_", " "), ""    # not in the table: at least no underscores (tests keep notebooks off it)


def unit_note(unit: str) -> str:
    """The whole explanation of a short unit (its tooltip), or the unit itself."""
    return UNIT_NOTES.get(unit, unit)


def unlabelled(keys) -> list[str]:
    """The identifier-like keys the table has no line for."""
    return [k for k in keys if is_raw(k) and k not in LABELS]


# Table headers: a column named for code (snake_case) and the header a reader sees instead
# (lab.report.readable.human; a name not listed here becomes its words, "share_of_model_%" ->
# "share of model (%)"). Tests check that no rendered report table shows a snake_case header.
COLUMNS: dict[str, str] = {
    # 00
    "feature_dim": "feature dimensions",
    # 02 and the TOSCA harness
    "avg_inc_acc": "Ā (%)", "last_acc": "A_B (%)", "routing_accuracy_last": "routing accuracy, last stage",
    "n_classes": "classes seen", "head_scale": "head scale σ", "frac_below": "fraction |w| < 1e-3",
    "mean_departure": "mean |gate − 0.5|", "frac_closed": "fraction of gates closed",
    "weight_frac_below": "LuCA weights |w| < 1e-3 (fraction)", "gate_mean_departure": "mean |gate − 0.5|",
    "overlap_cosine_mean": "overlap, cosine (mean)", "overlap_jaccard_mean": "overlap, Jaccard (mean)",
    "accuracy_per_sample": "accuracy, per-sample routing (%)", "routing_accuracy": "routing accuracy",
    "batch_size": "test batch size", "task_i": "task i", "task_j": "task j",
    # 03 and the AWARe tables
    "d_out": "output neurons", "share_of_model_%": "share of the model (%)",
    "equal_share_s": "equal share 1/√d", "median_s": "median s", "top_s": "largest s",
    "global_threshold_s": "global threshold (smallest frozen s)", "top1_share": "top 1 % share",
    "top10_share": "top 10 % share", "half_mass_frac": "neurons for half the mass",
    "max_over_equal": "largest / equal share", "max_x_uniform": "largest / equal share",
    "top1%_share": "top 1 % share", "top10%_share": "top 10 % share", "d_in": "input width",
    "chance_jaccard": "Jaccard by chance", "chance_overlap": "overlap by chance", "neuron_frac": "fraction of neurons",
    "energy_share": "share of the energy", "calib_n": "calibration samples",
    "R_easy_vqa": "R easy-VQA (%)", "R_probe": "R probe (%)", "up_easy_vqa": "easy-VQA accuracy",
    "up_probe": "probe accuracy", "trainable_frac": "trainable fraction", "val_downstream": "validation downstream",
    "val_R": "validation R", "val_E": "validation E", "val_H": "validation H",
    # 05
    "ci95": "95 % half-width",
}
