"""A template continual-lab plugin (docs/plugins.md).

Two entries, one module each, registered with the lab's own decorators when the lab imports the
module named by the entry point (``pyproject.toml``):

* :mod:`lab_plugin_example.margin` — TOSCA router ``margin``;
* :mod:`lab_plugin_example.product` — AWARe selection rule ``activation-x-weight``.

Nothing is imported here: the lab loads each module on the first lookup of its registry.
"""
