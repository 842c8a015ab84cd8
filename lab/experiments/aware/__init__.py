"""The experiments around AWARe on an offline mini-LLaVA (the method itself: :mod:`lab.aware`; docs/aware.md).

* :mod:`~lab.experiments.aware.minillava`, ``prompts``, ``scoring``, ``tiny``  the model, its chat
  encoding and multiple-choice scoring, a random 2-layer stand-in for tests
* :mod:`~lab.experiments.aware.tasks`, ``upstream``  upstream / downstream / calibration data; projector alignment
* :mod:`~lab.experiments.aware.context`   what every experiment shares, read-only: ``Size``, ``Context``, ``setup``
* :mod:`~lab.experiments.aware.finetune`  the training / evaluation harness (``TrainConfig``, ``train``, ``evaluate``)
* :mod:`~lab.experiments.aware.profiling` calibration batches, several and nested profiles
* :mod:`~lab.experiments.aware.ablate`, ``tune``, ``continual``  sweeps: variants mapped by one call each
* :mod:`~lab.experiments.aware.results`, ``study``  saved runs and saliency profiles read back
* :mod:`~lab.experiments.aware.tables`, ``figures``, ``prose``  notebook 03's views; ``ablation_views`` ``lab aware ablate``'s
* :mod:`~lab.experiments.aware.checks`, ``cli``  ``--targets`` checked before work; ``lab aware ...``

The shipped study (``lab aware study``), one way from config to views:

* :mod:`~lab.experiments.aware.plan`         config (``StudyConfig``), variants, phases, every run as a keyed job
* :mod:`~lab.experiments.aware.runner`       runs: one pure function per job through :mod:`lab.executors`; scales chosen on tuning seeds
* :mod:`~lab.experiments.aware.fronts`, ``study_tables``  tables: learning-rate fronts read at matched levels, paired by seed (:mod:`lab.stats`)
* :mod:`~lab.experiments.aware.study_views`  views: notebook 04, ``results/aware/README.md``, the README section
* :mod:`~lab.experiments.aware.shipped`, ``provenance``  the one command; code hashes and machine for the manifest
"""
