"""Views of finished AWARe results that compute nothing: they select, label and draw what the study's
tables and saved profiles hold (:mod:`lab.experiments.aware.study`). ``study``: notebook 04,
``results/aware/README.md`` and the README section; ``ablation``: ``lab aware ablate``'s sweeps (its
``run_sweep`` only hands a sweep to :mod:`lab.experiments.aware.run.ablate`); ``figures`` and ``prose``:
notebook 03. Nothing here trains or scores a model.
"""
