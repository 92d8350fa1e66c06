"""The training stacks a plan can name (``catalogs/stacks.yaml``): what each runs, with sources."""

from __future__ import annotations

from functools import lru_cache

from planner.catalog.store import UnknownName, catalog_dir, load_catalog_file, normalize_name
from planner.core.entries import StackSpec


@lru_cache(maxsize=1)
def stacks() -> tuple[StackSpec, ...]:
    """Every stack, in the file's order (the default preference when several run a plan)."""
    entries = load_catalog_file(catalog_dir() / "stacks.yaml", "stacks")
    return tuple(StackSpec.model_validate(e) for e in entries)


def get_stack(name: str) -> StackSpec:
    key = normalize_name(name)
    for st in stacks():
        if normalize_name(st.id) == key:
            return st
    raise UnknownName(f"unknown stack {name!r}; known: {', '.join(s.id for s in stacks())}")
