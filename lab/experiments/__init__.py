"""Experiments built around the method cores: the harnesses, sweeps, tasks and views that the
notebooks and the ``lab`` command line use.

``lab.tosca`` and ``lab.aware`` hold each method alone (what a reader needs to apply it to any
model); ``lab.experiments.tosca`` and ``lab.experiments.aware`` hold the scenario harnesses, the
miniature models and tasks, the sweeps and the tables and figures built on their results.
"""
