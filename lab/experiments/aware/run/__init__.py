"""What determines an AWARe run's numbers: the model (``minillava``, ``hub_llava``, ``tiny``, ``prompts``),
its data (``tasks``, ``upstream``), what every run shares (``context``), training and scoring
(``finetune``, ``scoring``), saliency batches (``profiling``), the sweeps that train variants (``ablate``,
``tune``, ``continual``), several processes (``distributed``) and ``--targets`` checked first (``checks``).
Nothing here imports the study or the views; every file enters the study's source hash.
"""
