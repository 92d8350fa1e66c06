"""The training stacks a plan can name (``catalogs/stacks.yaml``): what each runs, with sources."""

from __future__ import annotations

from functools import lru_cache

import yaml

from planner.catalog.store import CATALOG_LOADER, UnknownName, catalog_dir, normalize_name
from planner.core.specs import StackSpec


@lru_cache(maxsize=1)
def stacks() -> tuple[StackSpec, ...]:
    """Every stack, in the file's order (the default preference when several run a plan)."""
    with (catalog_dir() / "stacks.yaml").open(encoding="utf-8") as f:
        entries = yaml.load(f, Loader=CATALOG_LOADER)["stacks"]  # noqa: S506 - safe
    return tuple(StackSpec.model_validate(e) for e in entries)


def get_stack(name: str) -> StackSpec:
    key = normalize_name(name)
    for st in stacks():
        if normalize_name(st.id) == key:
            return st
    raise UnknownName(f"unknown stack {name!r}; known: {', '.join(s.id for s in stacks())}")
