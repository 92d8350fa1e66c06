"""Value parsing every config reader shares: whole numbers and counts, true/false as the tools
write it, the bf16/fp16 pair, a file another config names, an optimizer without a memory rule,
and the scenario's own field names."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from planner.core.specs import Layout, Recipe, Workload
from planner.core.textfiles import is_file
from planner.launch.importers.found import Found


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def whole(v: Any) -> int | None:
    """A count as the tools read it: an int, a float with no fraction (``4096.0``, ``1e9``) or a
    string of one (``"4096"``, YAML's ``1e9``, which PyYAML reads as a string); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            return None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def count(cfg: dict, key: str, f: Found, where: str, *, auto: bool = False) -> int | None:
    """``cfg[key]`` as a count (:func:`whole`); None when absent (or ``"auto"`` where the tool
    fills it in); a present value that is no whole number is a problem naming the key, never
    "not set"."""
    value = cfg.get(key)
    if value is None or (auto and str(value).lower() == "auto"):
        return None
    n = whole(value)
    if n is None:
        f.problems.append(f"{where}.{key}: {str(value)[:40]!r} is not a whole number")
    return n


def is_true(v: Any) -> bool:
    return v is True or str(v).lower() == "true"


def read_precision(f: Found, bf16: Any, fp16: Any, where: str, tool: str, *,
               default: str = "fp32") -> None:
    if bf16 in (True, "auto") or str(bf16).lower() == "true":
        f.set("precision", "mixed", where + ".bf16")
        f.facts["asks_bf16"] = where + ".bf16"
        if bf16 == "auto":
            f.notes.append(f"{where}.bf16: 'auto' read as BF16 mixed precision")
    elif fp16 in (True, "auto") or str(fp16).lower() == "true":
        f.set("precision", "fp16", where + ".fp16")
    elif bf16 is None and fp16 is None:
        f.default("precision", default, where + ".bf16/fp16", tool)
        if default == "mixed":
            f.facts["asks_bf16"] = where + ".bf16"
    else:
        f.set("precision", "fp32", where + ".bf16/fp16")


def config_path(name: str, base: Path, f: Found, where: str) -> Path:
    """A file another config names (``deepspeed: ds.json``): a relative path is read from the
    working directory, as the training tool (run from there) reads it; if it is only found beside
    the naming config, that one is read and the difference said."""
    path = Path(name).expanduser()
    if path.is_absolute() or is_file(path):
        return path
    beside = base / path
    if is_file(beside):
        f.warn(where, f"{name} is not in the working directory ({Path.cwd()}), where the training "
                      f"tool looks for it; read {beside} beside the config instead")
        return beside
    return path


def bad_optimizer(f: Found, where: str, name: Any, choices: str) -> None:
    """An optimizer without a memory rule: an error only if no ``--optimizer`` replaces it."""
    f.facts["optimizer_unread"] = f"{where}: {name!r} has no memory rule in planner ({choices})"
    f.warn(where, f"{name!r} has no memory rule in planner ({choices}); give --optimizer")


def comma_list(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def scenario_fields() -> set[str]:
    return set(Workload.model_fields) | set(Layout.model_fields) | set(Recipe.model_fields)
