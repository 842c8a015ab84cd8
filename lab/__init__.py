"""continual-lab: a notebook-driven workbench for continual learning on frozen pretrained models.

Two methods live here, each in its own package:

* :mod:`lab.tosca` — TOSCA (Yildirim et al., TMLR 2026): one sparse LuCA module per task on the
  decision-point feature of a frozen backbone, entropy routing at test time.
* :mod:`lab.aware` — AWARe (Liao et al., EMNLP 2026): activation-saliency profiling, freeze the
  top-rho output neurons of q/k/v and the projector, fine-tune the rest.

They stand on a small foundation: :mod:`lab.backbones` (frozen timm feature extractors),
:mod:`lab.data` (datasets and class-incremental scenarios) and :mod:`lab.features` (the on-disk
feature cache). Importing ``lab`` is cheap: nothing heavy is loaded until you ask for it.
"""

__version__ = "0.1.0"
