"""A tiny registry: a decorator records a factory under a name; lookups list valid names on error.

Modelled on timm's ``register_model`` / ``create_model``: registration is cheap (it stores a
function), the heavy work happens only when ``create`` is called.
"""
from __future__ import annotations

from typing import Any, Callable


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}
        self._info: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **info: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = fn
            self._info[name] = dict(info)
            return fn

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a toy entry a test added); unknown names raise as :meth:`check` does."""
        del self._entries[self.check(name)], self._info[name]

    def get(self, name: str) -> Callable[..., Any]:
        """The registered object itself (a factory, or an entry used as it is)."""
        return self._entries[self.check(name)]

    def names(self) -> list[str]:
        return list(self._entries)

    def info(self, name: str) -> dict[str, Any]:
        return self._info[self.check(name)]

    def check(self, name: str) -> str:
        """Return ``name`` if registered, else raise a KeyError that lists the valid names."""
        if name not in self._entries:
            valid = ", ".join(self._entries)
            raise KeyError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {valid}")
        return name

    def create(self, name: str, **kwargs: Any) -> Any:
        return self._entries[self.check(name)](**kwargs)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
