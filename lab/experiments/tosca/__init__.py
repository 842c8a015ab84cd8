"""The class-incremental harness around TOSCA (the method itself: :mod:`lab.tosca`).

* :mod:`~lab.experiments.tosca.methods`   the method registry (TOSCA and the baselines, one contract)
* :mod:`~lab.experiments.tosca.baselines` SimpleCIL, NCM, FeCAM, RanPAC, fine-tuning, joint training
* :mod:`~lab.experiments.tosca.layerwise` the layer-wise adapter baseline (APER-adapter)
* :mod:`~lab.experiments.tosca.augment`   augment mode: the backbone on augmented images every epoch
* :mod:`~lab.experiments.tosca.run`       a whole scenario -> a run directory and tidy tables
* :mod:`~lab.experiments.tosca.analysis`  sparsity / orthogonality of the learned modules, the L1 sweep
* :mod:`~lab.experiments.tosca.study`     the seeds x routers x baselines study -> results/tosca/
* :mod:`~lab.experiments.tosca.cli`       ``lab tosca``
"""
