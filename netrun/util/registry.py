"""The decorator every name-keyed registry is filled with (registration next to the thing)."""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def registrar(table: dict[str, T], what: str) -> Callable[..., Callable[[T], T]]:
    """`register = registrar(TABLE, "preparer")`, then `@register("A", "B")` puts the decorated
    object into TABLE under each name; a name registered twice is a ValueError (a bug)."""

    def register(*names: str) -> Callable[[T], T]:
        def wrap(obj: T) -> T:
            for name in names:
                if name in table:
                    raise ValueError(f"{what} for {name} registered twice")
                table[name] = obj
            return obj

        return wrap

    return register
