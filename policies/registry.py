"""One name -> factory registry per policy family; the name is the string used in scenario YAML."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from servesim.hardware.errors import SpecError

T = TypeVar("T")


class Registry(Generic[T]):
    """Policies register next to their implementation; `pkg.module:attr` reaches out-of-tree ones."""

    def __init__(self, family: str):
        self.family = family
        self._items: dict[str, T] = {}
        self._internal: set[str] = set()

    def register(self, name: str, internal: bool = False) -> Callable[[T], T]:
        """`internal`: the simulator picks it itself (e.g. a P/D pool's scheduler); not offered to users."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._items[name] = obj
            if internal:
                self._internal.add(name)
            return obj

        return add

    def names(self) -> list[str]:
        """The names users choose from."""
        return sorted(set(self._items) - self._internal)

    def get(self, name: str) -> T:
        if ":" in name:
            module, attr = name.split(":", 1)
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as err:
                raise SpecError(f"cannot load {self.family} {name!r}: {err}") from None
        try:
            return self._items[name]
        except KeyError:
            raise SpecError(
                f"unknown {self.family} {name!r}; choose from {', '.join(self.names())}"
            ) from None


#: The policy families. Implementations register themselves in their modules; `policies.catalog` imports them all.
schedulers: Registry[type] = Registry("scheduler")
routers: Registry[type] = Registry("router")
kv_managers: Registry[type] = Registry("prefix caching")
