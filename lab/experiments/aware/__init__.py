"""The experiments around AWARe on an offline mini-LLaVA (the method itself: :mod:`lab.aware`; docs/aware.md).

* :mod:`~lab.experiments.aware.minillava`, ``prompts``, ``scoring``, ``tiny``  the model, its chat
  encoding and multiple-choice scoring, a random 2-layer stand-in for tests
* :mod:`~lab.experiments.aware.tasks`, ``upstream``  upstream / downstream / calibration data; projector alignment
* :mod:`~lab.experiments.aware.context`   what every experiment shares, read-only: ``Size``, ``Context``, ``setup``
* :mod:`~lab.experiments.aware.finetune`  the training / evaluation harness (``TrainConfig``, ``train``, ``evaluate``)
* :mod:`~lab.experiments.aware.profiling` calibration batches, several and nested profiles
* :mod:`~lab.experiments.aware.ablate`, ``tune``, ``continual``  sweeps: variants mapped by one call each
* :mod:`~lab.experiments.aware.results`, ``study``  saved runs and saliency profiles read back
* :mod:`~lab.experiments.aware.tables`, ``figures``, ``prose``  notebook 03's views; ``ablation_views`` notebook 04's
* :mod:`~lab.experiments.aware.checks`, ``cli``  ``--targets`` checked before work; ``lab aware ...``
"""
