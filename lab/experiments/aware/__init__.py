"""The experiments around AWARe on an offline mini-LLaVA (the method itself: :mod:`lab.aware`; docs/aware.md).

One pipeline, in three subpackages that data flows through in order:

* :mod:`~lab.experiments.aware.run`    what determines a run's numbers: the model (``minillava``, ``hub_llava``,
  ``tiny``, ``prompts``), ``context``, ``tasks``, ``upstream``, ``finetune``, ``scoring``, ``profiling``,
  the sweeps (``ablate``, ``tune``, ``continual``), ``distributed``, ``checks``
* :mod:`~lab.experiments.aware.study`  the study: config and plan -> runner -> tables, with provenance
  (``plan``, ``runner``, ``fronts``, ``tables``, ``shipped``, ``provenance``); saved runs and saliency
  profiles read back (``results``, ``profiles``, ``profile_tables``); ``tracked``
* :mod:`~lab.experiments.aware.views`  views that compute nothing: notebook 04 and the README section
  (``study``), ``lab aware ablate``'s (``ablation``), notebook 03's (``figures``, ``prose``)

:mod:`~lab.experiments.aware.cli` is ``lab aware ...``. Nothing heavy is imported here.
"""
