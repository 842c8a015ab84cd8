"""The AWARe study, one way: config and plan (``plan``) -> runs (``runner``, each a fresh model from
:mod:`lab.experiments.aware.run`, stored as it finishes) -> tables (``fronts``, ``tables``) -> the
manifest with provenance (``shipped``, ``provenance``). ``plan`` and ``runner`` decide what runs and
enter the source hash; the rest only reads finished runs: ``results``, ``profiles`` and
``profile_tables`` read saved runs and saliency profiles back, ``tracked`` hands results to tracking.
"""
