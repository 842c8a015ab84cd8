"""A tiny registry: a decorator records a factory under a name; lookups list valid names on error.

Modelled on timm's ``register_model`` / ``create_model``: registration is cheap (it stores a
function), the heavy work happens only when ``create`` is called.

Installed packages add entries through entry points (:mod:`lab.plugins`, docs/plugins.md): the
first lookup that needs them (``names``, or ``get``, ``info``, ``check``, ``create``, ``in`` of a
name that is not a built-in) loads them, so ``import lab``, ``lab --help`` and a command that uses
only built-in entries import no plugin. A plugin can never replace a built-in entry. Each entry
remembers where it came from (:meth:`source`).
"""
from __future__ import annotations

from typing import Any, Callable

from lab import plugins


def _same_definition(a: object, b: object) -> bool:
    """The same function or class defined again (a notebook cell run twice, a module reloaded)."""
    key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
    return key(a) == key(b) and key(a)[1] not in (None, "<lambda>")


def _same_file(a: object, b: object) -> bool:
    """Two functions written in the same file (a built-in's module reloaded), judged by their code,
    not by ``__module__``/``__qualname__``, which ``functools.wraps`` copies onto a wrapper."""
    code = lambda f: getattr(getattr(f, "__code__", None), "co_filename", None)  # noqa: E731
    return code(a) == code(b)


class Registry:
    """Named entries of one kind. ``kind``: what an entry is called in messages ("unknown routing 'x';
    valid routings: ..."); ``group``: the entry-point group installed packages add entries through
    (None: no plugins); ``contract``: ``contract(name, obj, info)`` raising ValueError naming what an
    entry lacks, checked on every entry a plugin adds (:mod:`lab.plugins` keeps the checks)."""

    def __init__(self, kind: str, *, group: str | None = None,
                 contract: Callable[[str, Any, dict], None] | None = None):
        self.kind, self.group, self.contract = kind, group, contract
        self._entries: dict[str, Callable[..., Any]] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._source: dict[str, str] = {}
        self._plugins_loaded = False

    def register(self, name: str, **info: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Record ``fn`` under ``name``. Registering the same definition again (same module and
        qualified name: a notebook cell run twice) replaces it; any other second use of a name raises."""
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            if plugins.abandoned(fn):        # a plugin whose import ran past its bound, finishing late
                return fn
            if name in self._entries:
                self._refuse_clash(name, fn)
            self._entries[name] = fn
            self._info[name] = dict(info)
            self._source[name] = plugins.origin(fn)
            plugins.note(self, name)
            return fn

        return deco

    def _refuse_clash(self, name: str, fn: Callable[..., Any]) -> None:
        """A second use of ``name`` is allowed only for the same definition again, never from a plugin
        and never over a built-in from another file (a plugin cannot remove or shadow a built-in)."""
        old, src = self._entries[name], self._source.get(name)
        if plugins.loading() is not None:
            whose = "a built-in" if src == "built-in" else f"already registered by {src}"
            raise ValueError(f"{self.kind} {name!r} is {whose}; a plugin cannot replace it (choose another name)")
        if src == "built-in" and not (_same_definition(old, fn) and _same_file(old, fn)):
            raise ValueError(f"{self.kind} {name!r} is a built-in; it cannot be replaced (choose another name)")
        if not _same_definition(old, fn):
            raise ValueError(f"{self.kind} {name!r} is registered twice")

    def _builtin(self, name: object) -> bool:
        """A built-in entry: answered without loading any plugin (none can take its name)."""
        return isinstance(name, str) and self._source.get(name) == "built-in"

    def _load_plugins(self) -> None:
        if not self._plugins_loaded:
            self._plugins_loaded = True   # first: a plugin that looks names up while loading does not recurse
            plugins.load(self)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a toy entry a test added); unknown names raise as :meth:`check` does."""
        del self._entries[self.check(name)], self._info[name]
        self._source.pop(name, None)

    def get(self, name: str) -> Callable[..., Any]:
        """The registered object itself (a factory, or an entry used as it is)."""
        return self._entries[self.check(name)]

    def names(self) -> list[str]:
        self._load_plugins()
        return list(self._entries)

    def builtin_names(self) -> list[str]:
        """The lab's own entries (no plugin's, no notebook cell's), in registration order; loads no
        plugin (none can add a built-in), so a module may read them when it is imported."""
        return [n for n in self._entries if self._source.get(n) == "built-in"]

    def info(self, name: str) -> dict[str, Any]:
        return self._info[self.check(name)]

    def source(self, name: str) -> str:
        """Where ``name`` came from: ``"built-in"``, the distribution (package) of the plugin that
        added it, or the module that registered it (``"__main__"``: a notebook cell or script)."""
        return self._source.get(self.check(name), "?")

    def check(self, name: str) -> str:
        """Return ``name`` if registered, else raise a KeyError that lists the valid names."""
        if self._builtin(name):
            return name
        self._load_plugins()
        if name not in self._entries:
            valid = ", ".join(self._entries)
            raise KeyError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {valid}")
        return name

    def create(self, name: str, **kwargs: Any) -> Any:
        return self._entries[self.check(name)](**kwargs)

    def __contains__(self, name: object) -> bool:
        if self._builtin(name):
            return True
        self._load_plugins()
        return name in self._entries
