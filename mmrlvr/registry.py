"""Name -> object registries with loud errors.

Rewards, credit schemes, advantage estimators, policy losses, KL estimators, aggregation modes and judges
are all chosen by name in configs. A registry makes an unknown name fail with the list of known ones and
makes a second registration under the same name fail instead of silently replacing the first.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from mmrlvr.errors import UserError, did_you_mean

T = TypeVar("T")


class RegistryError(UserError, KeyError):
    """Unknown or duplicate name in a registry. ``str()`` is a one-line message for users.

    A ``UserError`` (the CLI prints it in one line and exits 2, no traceback: a name in a config is user
    input) and still a ``KeyError`` for code that catches lookups that way.
    """

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A named collection of objects of one kind (e.g. ``"policy loss"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@LOSSES.register("ppo_clip")``."""

        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise RegistryError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            hint = did_you_mean(name, sorted(self._items))
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {known}{hint}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
