"""Plugins: registry entries from installed packages, found through entry points (docs/plugins.md).

Every plugin kind is one registry (:class:`lab._registry.Registry`), which carries its entry-point
group (``Registry.group``) and the contract its entries are checked against (``Registry.contract``,
one of the ``check_*`` functions below):

==============  ============================  ==========================================
kind            entry-point group             registry (contract: docs/plugins.md)
==============  ============================  ==========================================
backbone        continual_lab.backbones       lab.backbones (``_REGISTRY``)
dataset         continual_lab.datasets        lab.data.datasets (``_REGISTRY``)
tosca method    continual_lab.tosca_methods   lab.experiments.tosca.methods (``METHODS``)
router          continual_lab.routers         lab.tosca.routing (``ROUTERS``)
aware rule      continual_lab.aware_rules     lab.aware.masking (``RULES``)
aware method    continual_lab.aware_methods   lab.aware.methods (``METHODS``)
==============  ============================  ==========================================

An entry point's value is a module (importing it runs its ``@register(...)`` decorators, the same
ones the built-in entries use) or a ``module:function`` taking the registry (``register(registry)``).
A registry loads its group on its first lookup of a name that is not a built-in (or its first
listing), so ``import lab``, ``lab --help`` and commands that use built-in entries only import no
plugin. A plugin's import is contained: it runs with ``sys.argv`` holding the program name only, in a
thread bounded by ``$LAB_PLUGIN_TIMEOUT`` seconds (default 10), its output kept apart. Every entry a
plugin adds is checked against its kind's contract right then; a plugin that fails to import (an
exception, ``SystemExit``, an import past the bound), breaks the contract, takes a name already in
use (a built-in's above all: it stays) or adds nothing is skipped with ONE line on stderr naming its
package and entry point (kept in :data:`skipped`), and everything else keeps working. A plugin
entry's ``available()`` that raises answers "no" with the reason.

This module imports nothing heavy (the command line's ``--help`` reads :class:`Names` from it).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, NamedTuple


class Kind(NamedTuple):
    """Where a kind's registry lives, for lookups that must not import it (torch): ``Names`` and the
    command line's list of groups. ``group`` is a static copy of the registry's own ``group``
    (tests/test_plugins.py holds the two equal)."""
    group: str                   # the entry-point group (a copy of the registry's)
    registry: str                # "module:ATTRIBUTE" of the registry
    builtins: str                # the module whose import registers the built-in entries


# --- the contracts (what the lab calls; checked without running anything) ---------------------------
def _call(obj: Any, shape: str, *args, **kwargs) -> None:
    """``obj`` is callable with these arguments (by its signature; one without a signature passes)."""
    import inspect

    if not callable(obj):
        raise ValueError(f"is {type(obj).__name__}, not a callable {shape}")
    try:
        inspect.signature(obj).bind(*args, **kwargs)
    except TypeError as exc:
        raise ValueError(f"must be callable as {shape} ({exc})") from None
    except ValueError:
        pass


def _fields(info: dict, *names: str) -> None:
    missing = [n for n in names if n not in info]
    if missing:
        raise ValueError(f"lacks registry info {', '.join(missing)}")


def _flags(info: dict, *names: str) -> None:
    _fields(info, *names)
    bad = [n for n in names if not isinstance(info[n], bool)]
    if bad:
        raise ValueError(f"registry info {', '.join(bad)} must be True or False")


def _subclass(obj: Any, module: str, shape: str) -> None:
    """``obj`` is a class derived from ``module``'s ``Method`` (the registry's own module: loaded)."""
    base = sys.modules[module].Method
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ValueError(f"must be a subclass of {module}.Method ({shape})")


def check_backbone(name: str, obj: Any, info: dict) -> None:
    _call(obj, "factory(resolution, weights) -> lab.backbones.Backbone", resolution=224, weights=None)
    _fields(info, "default_resolution", "resolution_range", "feature_dim", "pretrained", "untrained",
            "available", "arch")
    if not callable(info["available"]):
        raise ValueError("registry info 'available' must be a function () -> (bool, where)")
    rng = info["resolution_range"]
    if not (isinstance(rng, (tuple, list)) and len(rng) == 3 and all(isinstance(v, int) for v in rng)):
        raise ValueError("registry info 'resolution_range' must be (lowest, highest, multiple) in px")
    if not (isinstance(info["feature_dim"], int) and info["feature_dim"] > 0):
        raise ValueError("registry info 'feature_dim' must be a positive integer")
    arch = info["arch"]
    if not (isinstance(arch, (tuple, list)) and len(arch) == 2 and isinstance(arch[0], str)
            and isinstance(arch[1], dict)):
        raise ValueError("registry info 'arch' must be (timm model name, {keyword arguments})")
    if info.get("params") is not None and not (isinstance(info["params"], int) and info["params"] > 0):
        raise ValueError("registry info 'params' must be a positive integer")
    _flags(info, "untrained")


def check_dataset(name: str, obj: Any, info: dict) -> None:
    from pathlib import Path

    _call(obj, "factory(root) -> lab.data.ImageDataset", root=Path("."))
    _fields(info, "classes", "train", "test", "licence", "image", "available")
    if not callable(info["available"]):
        raise ValueError("registry info 'available' must be a function (root) -> (bool, where)")
    if not (isinstance(info["classes"], int) and info["classes"] >= 2):
        raise ValueError("registry info 'classes' must be an integer >= 2")


def check_tosca_method(name: str, obj: Any, info: dict) -> None:
    _subclass(obj, "lab.experiments.tosca._base", "cls(dim, cfg, *, backbone=None, mode='cached')")
    _flags(info, "routed", "needs_backbone", "trains", "luca", "cosine_head", "augments")
    _fields(info, "role", "headline")
    if info["role"] not in ("method", "baseline"):
        raise ValueError(f"registry info role {info['role']!r} must be method or baseline")
    if info["headline"] is not None and not (isinstance(info["headline"], int) and info["headline"] > 0):
        raise ValueError("registry info 'headline' must be None or a positive integer")
    missing = [m for m in ("learn_task", "logits") if not callable(getattr(obj, m, None))]
    if missing:
        raise ValueError(f"lacks the method(s) {', '.join(missing)}")


def check_router(name: str, obj: Any, info: dict) -> None:
    _call(obj, "router(logits [T, N, C], ctx) -> module index per sample [N]", None, None)
    if info.get("protocol") not in ("per-sample", "per-batch", "oracle"):
        raise ValueError("registry info 'protocol' must be per-sample, per-batch or oracle "
                         "(register with lab.tosca.routing.register)")


def check_aware_rule(name: str, obj: Any, info: dict) -> None:
    _call(obj, "rule(scores, rho, *, weights, seed) -> {layer: BoolTensor}", {}, 0.0, weights=None, seed=0)
    _flags(info, "saliency")


def check_aware_method(name: str, obj: Any, info: dict) -> None:
    _subclass(obj, "lab.aware.methods", "prepare(model, spec, cfg, saliency) -> (model, groups, info)")
    if obj.prepare is sys.modules["lab.aware.methods"].Method.prepare:
        raise ValueError("does not implement prepare(model, spec, cfg, saliency)")
    if obj.role not in ("reference", "baseline", "method", "none"):
        raise ValueError(f"role {obj.role!r} must be reference, baseline, method or none")


KINDS: dict[str, Kind] = {
    "backbone": Kind("continual_lab.backbones", "lab.backbones:_REGISTRY", "lab.backbones"),
    "dataset": Kind("continual_lab.datasets", "lab.data.datasets:_REGISTRY", "lab.data.datasets"),
    "tosca method": Kind("continual_lab.tosca_methods", "lab.experiments.tosca._base:METHODS",
                         "lab.experiments.tosca.methods"),
    "router": Kind("continual_lab.routers", "lab.tosca.routing:ROUTERS", "lab.tosca.routing"),
    "aware rule": Kind("continual_lab.aware_rules", "lab.aware.masking:RULES", "lab.aware.masking"),
    "aware method": Kind("continual_lab.aware_methods", "lab.aware.methods:METHODS", "lab.aware.methods"),
}
GROUPS = {kind: k.group for kind, k in KINDS.items()}


def registry(kind: str):
    """The registry of ``kind`` with its built-in entries (imports them: torch for most kinds)."""
    import importlib

    k = KINDS[kind]
    importlib.import_module(k.builtins)
    module, attr = k.registry.split(":")
    return getattr(importlib.import_module(module), attr)


def kind_of(reg) -> str | None:
    """The kind of ``reg``, by its entry-point group (None: a registry no plugin adds to, e.g. a test's)."""
    group = getattr(reg, "group", None)
    return next((kind for kind, k in KINDS.items() if group is not None and k.group == group), None)


def entries() -> list[tuple[str, str, str]]:
    """``(kind, name, source)`` of every entry of every kind, plugins loaded (``lab plugins``)."""
    out = []
    for kind in KINDS:
        reg = registry(kind)
        out += [(kind, name, reg.source(name)) for name in reg.names()]
    return out


# --- loading --------------------------------------------------------------------------------------------
_loading: list[tuple[str, list]] = []   # (distribution, [(registry, name) it registered]) while a plugin loads
_loaded: set[tuple[str, str, str, str]] = set()   # entry points done: (group, name, value, distribution)
_seen: list = []                        # registries that loaded their group (rescan() resets them)
skipped: list[str] = []                 # the one-line messages of the plugins skipped in this process


@functools.lru_cache(maxsize=None)
def _entry_points():
    from importlib.metadata import entry_points

    return entry_points()


def entry_points(kind: str) -> list:
    """The installed entry points of ``kind`` (metadata only: nothing is imported)."""
    return list(_entry_points().select(group=KINDS[kind].group))


def _dist(ep) -> str:
    dist = getattr(ep, "dist", None)
    return (dist.metadata["Name"] if dist is not None else None) or ep.value.split(":")[0].split(".")[0]


def _in_lab(fn: Any, mod: str) -> bool:
    """``fn`` is written in a file of this package (its code's file, not the ``__module__`` that
    ``functools.wraps`` copies onto a plugin's wrapper)."""
    import os

    code = getattr(fn, "__code__", None)
    where = code.co_filename if code is not None else getattr(sys.modules.get(mod), "__file__", None)
    here = os.path.dirname(os.path.abspath(__file__))
    return bool(where) and os.path.abspath(where).startswith(here + os.sep)


def origin(fn: Any) -> str:
    """Where an entry being registered comes from: the lab's own module, the plugin loading, or a module."""
    mod = getattr(fn, "__module__", None) or "?"
    if (mod == "lab" or mod.startswith("lab.")) and _in_lab(fn, mod):
        return "built-in"
    return _loading[-1][0] if _loading else mod


def note(reg, name: str) -> None:
    """Remember an entry a plugin registers (contract check, or removal when the plugin fails); a
    built-in module the plugin happens to import registers its own entries, never the plugin's."""
    if _loading and reg._source.get(name) != "built-in":
        _loading[-1][1].append((reg, name))


def _drop(reg, name: str) -> None:
    for d in (reg._entries, reg._info, reg._source):
        d.pop(name, None)


def load(reg) -> None:
    """Load the entry points of ``reg``'s kind not loaded yet (its first lookup of a name that is not
    a built-in calls this). The kind's built-in entries are registered first: a plugin can never
    take one of their names."""
    import importlib

    kind = kind_of(reg)
    if kind is None:
        return
    if reg not in _seen:
        _seen.append(reg)
    importlib.import_module(KINDS[kind].builtins)
    for ep in entry_points(kind):
        key = (ep.group, ep.name, ep.value, _dist(ep))
        if key not in _loaded:
            _loaded.add(key)
            _load_one(reg, kind, ep)


TIMEOUT_ENV = "LAB_PLUGIN_TIMEOUT"
TIMEOUT = 10.0              # seconds a plugin's import may take (a hung import must not hang the lab)
_abandoned: set[str] = set()   # top-level modules of plugins whose import ran past the bound


def timeout() -> float:
    """The bound on one plugin's import: ``$LAB_PLUGIN_TIMEOUT`` seconds, else :data:`TIMEOUT`."""
    import os

    try:
        value = float(os.environ.get(TIMEOUT_ENV, "") or TIMEOUT)
    except ValueError:
        return TIMEOUT
    return value if value > 0 else TIMEOUT


def loading() -> str | None:
    """The distribution of the plugin being loaded right now (None: no plugin is loading)."""
    return _loading[-1][0] if _loading else None


def abandoned(fn: Any) -> bool:
    """Whether ``fn`` comes from a plugin whose import ran past the bound (it finished late: what it
    registers then is ignored)."""
    mod = getattr(fn, "__module__", None) or ""
    return mod.split(".")[0] in _abandoned


def _contained(ep, reg):
    """``ep.load()`` (and ``register(reg)`` for a function entry point) as the lab lets a plugin run:
    in a daemon thread bounded by :func:`timeout`, with ``sys.argv`` holding the program name only
    (a plugin that parses the command line at import sees none, and cannot change the lab's) and
    its stdout/stderr kept apart. Returns ``None`` or raises what the plugin raised (SystemExit
    included), or TimeoutError."""
    import io
    import threading
    from types import ModuleType

    box: dict = {}

    def target():
        try:
            obj = ep.load()
            if not isinstance(obj, ModuleType) and not any(obj is v for v in reg._entries.values()):
                if not callable(obj):
                    raise ValueError(f"{ep.value} is neither a module nor a register(registry) function")
                obj(reg)
        except BaseException as exc:   # SystemExit, KeyboardInterrupt raised by the plugin itself
            box["exc"] = exc

    argv, saved = sys.argv, list(sys.argv)
    out, err, said = sys.stdout, sys.stderr, io.StringIO()
    sys.argv = [saved[0] if saved else "lab"]
    sys.stdout = sys.stderr = said
    bound = timeout()
    worker = threading.Thread(target=target, name=f"plugin {ep.name}", daemon=True)
    try:
        worker.start()
        worker.join(bound)
    finally:
        sys.stdout, sys.stderr = out, err
        argv[:] = saved
        sys.argv = argv
    if worker.is_alive():
        _abandoned.add(ep.value.split(":")[0].split(".")[0])
        raise TimeoutError(f"its import took more than {bound:g} s (the bound: ${TIMEOUT_ENV})")
    exc = box.get("exc")
    if isinstance(exc, SystemExit):
        last = [ln for ln in said.getvalue().splitlines() if ln.strip()][-1:]
        raise RuntimeError(f"SystemExit({exc.code!r}) at import" + (f" after printing {last[0].strip()!r}"
                                                                     if last else "")) from None
    if isinstance(exc, KeyboardInterrupt):     # raised by the plugin, not a Ctrl-C (that reaches join())
        raise RuntimeError("KeyboardInterrupt raised at import") from None
    if isinstance(exc, BaseException):
        raise exc


def _guard(dist: str, name: str, info: dict) -> None:
    """A plugin entry's ``available`` function answers (False, why) instead of raising: `lab datasets`
    and `lab backbones` list every other entry whatever a plugin's check does."""
    fn = info.get("available")
    if not callable(fn) or getattr(fn, "_lab_guarded", False):
        return

    @functools.wraps(fn)
    def available(*args, **kwargs):
        try:
            ok, where = fn(*args, **kwargs)
            return bool(ok), str(where)
        except Exception as exc:
            return False, f"plugin {dist}: available() failed: {type(exc).__name__}: {' '.join(str(exc).split())}"

    available._lab_guarded = True
    info["available"] = available


def _load_one(reg, kind: str, ep) -> None:
    dist, added = _dist(ep), []
    try:
        _loading.append((dist, added))
        try:
            _contained(ep, reg)
        finally:
            _loading.pop()
        top = ep.value.split(":")[0].split(".")[0]   # entries its module made before (imported by hand)
        for name, src in list(reg._source.items()):
            if src == top or src.startswith(top + "."):
                reg._source[name] = dist
        for r, name in added:
            k = kind_of(r)
            if k is not None and name in r._entries and r.contract is not None:
                try:
                    r.contract(name, r._entries[name], r._info[name])
                except ValueError as exc:
                    raise ValueError(f"{k} {name!r} breaks the contract: {exc}") from None
                _guard(dist, name, r._info[name])
        if not any(src == dist for src in reg._source.values()):
            raise ValueError(f"it registers no {kind} (see docs/plugins.md)")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:   # a broken plugin must not break the lab
        for r, name in added:
            _drop(r, name)
        why = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, (ValueError, TimeoutError)) and not why.startswith("SystemExit("):
            why = f"{type(exc).__name__}: {why}"
        line = f"lab: plugin skipped: package {dist}, entry point {ep.name} = {ep.value} ({ep.group}): {why}"
        skipped.append(line)
        print(line, file=sys.stderr, flush=True)


def rescan() -> None:
    """Look for entry points again (a plugin installed into a running session): the next lookup of
    every registry loads the new ones."""
    import importlib

    _entry_points.cache_clear()
    importlib.invalidate_caches()
    for reg in _seen:
        reg._plugins_loaded = False


def forget(dist: str) -> None:
    """Remove every entry the distribution ``dist`` added, so that a rescan loads it afresh (tests;
    drop its modules from ``sys.modules`` too, or importing them again registers nothing)."""
    for reg in _seen:
        for name in [n for n, src in reg._source.items() if src == dist]:
            _drop(reg, name)
    _loaded.difference_update({key for key in _loaded if key[3] == dist})


# --- the command line -----------------------------------------------------------------------------------
class Names(tuple):
    """Built-in names for argparse ``choices=``, copied statically so that ``--help`` imports nothing,
    that also accept the names plugins add: a name outside the table is looked up in the kind's
    registry, which is imported for it only when it is loaded already or a plugin of the kind is
    installed (a typo costs no torch import). ``info``: the built-ins' registry info, if copied too."""

    def __new__(cls, kind: str, names, info: dict | None = None):
        self = super().__new__(cls, names)
        self.kind, self._static_info = kind, dict(info or {})
        return self

    def _registry(self, *, import_it: bool = True):
        k = KINDS[self.kind]
        if k.registry.split(":")[0] in sys.modules or (import_it and entry_points(self.kind)):
            return registry(self.kind)
        return None

    def __iter__(self):
        """The built-in names, then the registry's others where it is imported already (a process that
        registered its own entries lists them in ``--help`` and usage errors; nothing is imported)."""
        yield from tuple.__iter__(self)
        reg = self._registry(import_it=False)
        if reg is not None:
            yield from (n for n in reg.names() if not tuple.__contains__(self, n))

    def __contains__(self, name: object) -> bool:
        if tuple.__contains__(self, name):
            return True
        reg = self._registry() if isinstance(name, str) else None
        return reg is not None and name in reg

    def names(self) -> list[str]:
        reg = self._registry()
        return list(tuple.__iter__(self)) + ([n for n in reg.names() if not tuple.__contains__(self, n)]
                                             if reg is not None else [])

    def builtin(self, **flags) -> tuple[str, ...]:
        """The built-in names whose copied info has every value of ``flags`` (nothing is imported),
        e.g. ``TOSCA_METHODS.builtin(role="baseline", trains=False)``."""
        return tuple(n for n in tuple.__iter__(self)
                     if all(self._static_info.get(n, {}).get(k) == v for k, v in flags.items()))

    def info(self, name: str) -> dict:
        if name in self._static_info:
            return self._static_info[name]
        reg = self._registry()
        if reg is None:
            raise KeyError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self)}")
        return reg.info(name)
