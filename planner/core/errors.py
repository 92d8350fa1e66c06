"""Input errors: every problem at once, one line each, naming the field."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from planner.core.specs import UNION_TAGS


class InputError(ValueError):
    """Invalid input. ``problems`` holds one ``field: message`` line per problem."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _allowed_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys a mapping at ``loc`` (inside ``model``) may hold, for "did you mean"."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        info = current.model_fields.get(str(part))
        if info is None:
            return []
        current = _model_in(info.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``X | None`` or ``Annotated[...]`` unions, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    meta = getattr(annotation, "__origin__", None)
    if meta is not None and meta is not annotation:
        return _model_in(meta)
    return None


def _dotted(loc: Iterable[Any]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts) or "(top level)"


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], prefix: str = ""
) -> list[str]:
    """pydantic errors -> ``prefix.path.to.field: message`` lines, one per problem."""
    lines: list[str] = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p in UNION_TAGS)]
        if loc and isinstance(loc[-1], str) and loc[-1].startswith("function-"):
            loc = loc[:-1]
        path = _dotted([prefix, *loc] if prefix else loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            key = str(loc[-1])
            allowed = _allowed_keys(model, loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f"; allowed: {', '.join(allowed)}" if allowed else "")
            msg = f"unknown key{hint}"
        elif kind == "missing":
            msg = "required"
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            if kind in {"literal_error", "int_parsing", "float_parsing", "bool_parsing"} or kind.startswith(
                ("greater", "less")
            ):
                msg += f" (got {err.get('input')!r})"
        line = f"{path}: {msg}"
        if line not in lines:
            lines.append(line)
    return lines
