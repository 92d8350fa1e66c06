"""The GPU and model catalogs: load ``catalogs/*.yaml`` into specs; look names up.

Nothing is read at import time. Lookup is case-insensitive and ignores separators, so
``RTX 4090``, ``rtx-4090`` and ``rtx4090`` are one name; an unknown name gets "did you mean".
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Generic, TypeVar

import yaml

from planner.core.specs import GpuSpec, ModelSpec

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # planner/
#: Where catalogs live: next to the package in a source checkout, inside it once installed.
_CATALOG_DIRS = (_PACKAGE_DIR.parent / "catalogs", _PACKAGE_DIR / "_catalogs")


class UnknownName(LookupError):
    """A name that is in no catalog; the message carries suggestions."""


def catalog_dir() -> Path:
    for candidate in _CATALOG_DIRS:
        if (candidate / "gpus.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no catalogs found in {', '.join(map(str, _CATALOG_DIRS))}")


def normalize_name(name: str) -> str:
    """Lower-case, drop separators: ``NVIDIA RTX-4090`` -> ``nvidiartx4090``."""
    return re.sub(r"[^a-z0-9.]", "", name.strip().lower())


T = TypeVar("T", GpuSpec, ModelSpec)


class Catalog(Generic[T]):
    """Entries by id, with an index of every id and alias."""

    def __init__(self, kind: str, entries: Iterable[T]):
        self.kind = kind
        self.entries: dict[str, T] = {}
        self._index: dict[str, str] = {}
        for entry in entries:
            if entry.id in self.entries:
                raise ValueError(f"{kind} catalog: duplicate id {entry.id!r}")
            self.entries[entry.id] = entry
            names = [entry.id, *entry.aliases]
            if isinstance(entry, ModelSpec) and entry.hf_repo:
                names += [entry.hf_repo, entry.hf_repo.split("/")[-1]]
            for name in names:
                key = normalize_name(name)
                owner = self._index.setdefault(key, entry.id)
                if owner != entry.id:
                    raise ValueError(
                        f"{kind} catalog: name {name!r} belongs to both {owner!r} and {entry.id!r}"
                    )

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries.values())

    def get(self, name: str) -> T:
        key = normalize_name(name)
        if key in self._index:
            return self.entries[self._index[key]]
        raise UnknownName(f"unknown {self.kind} {name!r}{self.suggest(name)}")

    def suggest(self, name: str) -> str:
        key = normalize_name(name)
        close = difflib.get_close_matches(key, self._index, n=8, cutoff=0.6)
        ids: list[str] = []
        for match in close:
            entry_id = self._index[match]
            if entry_id not in ids:
                ids.append(entry_id)
        if not ids:
            return f" (see `planner {self.kind}s` for the list)"
        return f"; did you mean {', '.join(ids[:3])}?"


def _load_yaml(path: Path, key: str) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    return data[key]


@lru_cache(maxsize=1)
def _gpus_from_file() -> Catalog[GpuSpec]:
    rows = _load_yaml(catalog_dir() / "gpus.yaml", "gpus")
    return Catalog("gpu", (GpuSpec.model_validate(row) for row in rows))


#: GPU specs that replace the file's while :func:`gpus_overlaid` is active (e.g. imported prices).
_GPU_OVERLAY: list[Catalog[GpuSpec]] = []


def gpus() -> Catalog[GpuSpec]:
    return _GPU_OVERLAY[-1] if _GPU_OVERLAY else _gpus_from_file()


@contextmanager
def gpus_overlaid(entries: Iterable[GpuSpec]):
    """Within the block, the GPU catalog is ``entries`` (same ids, e.g. with other prices)."""
    _GPU_OVERLAY.append(Catalog("gpu", entries))
    try:
        yield
    finally:
        _GPU_OVERLAY.pop()


@lru_cache(maxsize=1)
def models() -> Catalog[ModelSpec]:
    rows = _load_yaml(catalog_dir() / "models.yaml", "models")
    return Catalog("model", (ModelSpec.model_validate(row) for row in rows))


def get_gpu(name: str) -> GpuSpec:
    return gpus().get(name)


def get_model(name: str, *, base_dir: Path | None = None) -> ModelSpec:
    """A catalog name, or a path to a Hugging Face ``config.json`` (or its folder).

    A relative path is looked up beside ``base_dir`` (the scenario file's folder) first.
    """
    cat = models()
    if normalize_name(name) in cat._index:
        return cat.get(name)
    path = Path(name).expanduser()
    candidates = [path] if path.is_absolute() or base_dir is None else [base_dir / path, path]
    for candidate in candidates:
        if candidate.is_file() or candidate.is_dir():
            from planner.catalog.hf_config import load_hf_config

            return load_hf_config(candidate)
    if name.endswith(".json"):
        from planner.catalog.hf_config import ConfigError

        raise ConfigError(f"no such file {name!r}")
    return cat.get(name)
