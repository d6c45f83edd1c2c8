"""Named object factories: a config names a scheduler, optimizer or batch source by string; a registry maps the
name to the factory. Stdlib only.

An unknown name is a `ConfigError` that lists the registered names, so a typo in a config reads like any other
config error."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from align.exceptions import ConfigError

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """`@REG.register("name")` on a factory; `REG.get("name")` returns it."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(factory: F) -> F:
            if name in self._items and self._items[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            self._items[name] = factory
            return factory

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self._items)) or 'none'}")\
                from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
