"""Input errors: every problem at once, one line each, naming the field."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from planner.core.specs import MOVED_KEYS, UNION_TAGS

#: The most characters of the user's input an error message quotes (then "…").
EXCERPT_CHARS = 80
#: The most characters of one problem line: a long path or name never floods the terminal.
MAX_LINE_CHARS = 500
#: The most problem lines shown at once; a last line says how many more there were.
MAX_SHOWN_PROBLEMS = 50


def clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with "…"."""
    text = str(text)
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A bounded quotation of the user's input: its ``repr``, at most ``limit`` characters.

    Containers are never rendered whole first: one built from YAML aliases can be huge."""
    if isinstance(value, str):
        return clip(repr(value[: limit + 1]), limit) if len(value) > limit else clip(repr(value), limit)
    return clip(_REPR.repr(value), limit)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = EXCERPT_CHARS, EXCERPT_CHARS, EXCERPT_CHARS


def shown(problems: Sequence[str]) -> list[str]:
    """The problem lines to print: each clipped, at most :data:`MAX_SHOWN_PROBLEMS` of them."""
    lines = [clip(p, MAX_LINE_CHARS) for p in problems[:MAX_SHOWN_PROBLEMS]]
    if len(problems) > MAX_SHOWN_PROBLEMS:
        lines.append(f"… and {len(problems) - MAX_SHOWN_PROBLEMS:,} more problems")
    return lines


class InputError(ValueError):
    """Invalid input. ``problems`` holds one ``field: message`` line per problem (each at most
    :data:`MAX_LINE_CHARS` characters)."""

    def __init__(self, problems: Sequence[str]):
        self.problems = [clip(p, MAX_LINE_CHARS) for p in problems]
        super().__init__("\n".join(shown(self.problems)))


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model of the mapping at ``loc`` (inside ``model``), if that mapping is one."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        current = _model_in(info.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return current
    return None


def _allowed_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys a mapping at ``loc`` (inside ``model``) may hold, for "did you mean"."""
    current = _model_at(model, loc)
    return list(current.model_fields) if current is not None else []


def _moved_to(model: type[BaseModel], loc: Sequence[Any]) -> str | None:
    """Where a key the mapping at ``loc[:-1]`` no longer holds now lives (``recipe.loss``), if
    it moved (:data:`planner.core.specs.MOVED_KEYS`)."""
    owner = _model_at(model, loc[:-1])
    return MOVED_KEYS.get(owner, {}).get(str(loc[-1])) if owner is not None and loc else None


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
        raw_loc = list(err["loc"])
        # A union's tag follows the field that holds the union (model -> "name" | "dims"); the same
        # word anywhere else is a field or key of its own (a scenario's name, an unknown key "dims").
        loc = [p for i, p in enumerate(raw_loc)
               if not (isinstance(p, str) and p in UNION_TAGS and i > 0 and raw_loc[i - 1] == "model"
                       and i < len(raw_loc) - (err["type"] == "extra_forbidden"))]
        if loc and isinstance(loc[-1], str) and loc[-1].startswith("function-"):
            loc = loc[:-1]
        path = _dotted([prefix, *loc] if prefix else loc)
        kind = err["type"]
        moved = _moved_to(model, loc) if kind == "extra_forbidden" else None
        if moved:
            msg = f"this key belongs in the {moved.split('.')[0]}: section ({moved})"
        elif kind == "extra_forbidden":
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
            msg = msg.removeprefix("Value error, ")
            if kind in {"literal_error", "int_parsing", "float_parsing", "bool_parsing"} or kind.startswith(
                ("greater", "less")
            ):
                msg += f" (got {excerpt(err.get('input'))})"
        line = f"{path}: {clip(msg, MAX_LINE_CHARS // 2)}"
        if line not in lines:
            lines.append(line)
    return lines
