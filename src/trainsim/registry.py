"""One registry pattern for every plug-in family: engines, schedules, collectives, commands."""

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from trainsim.errors import TrainsimError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object. Registering a name twice or looking up an unknown name fails loudly."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(item: T) -> T:
            self.add(name, item)
            return item

        return decorator

    def add(self, name: str, item: T) -> None:
        if name in self._items:
            raise TrainsimError(f"{self.family} {name!r} is registered twice")
        self._items[name] = item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.family, name, list(self._items)) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
