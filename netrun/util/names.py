"""Unique names: the one rule every writer of new blob, layer or node names follows."""
from __future__ import annotations


def unique_name(base: str, taken: set[str], sep: str = "_") -> str:
    """`base`, else `base<sep>k` for the first k ≥ 2 not in `taken`; the name is added to it."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{sep}{k}"
    taken.add(name)
    return name
