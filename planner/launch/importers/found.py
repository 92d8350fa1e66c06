"""What the config readers found, and every key of a config accounted for.

:class:`Found` holds the flat scenario keys read from configs, where each came from, and the notes,
warnings and problems of the reading. :class:`Tracked` records which keys a reader consulted;
:func:`account` sorts every key of a config into read, passed over (with a note) or unknown (with a
warning), so that nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from planner.core.errors import clip

#: Why a key was passed over, by category (the words of the note).
PASSED_OVER = {
    "ignored": "not read, no bearing on memory per GPU",
    "tuning": "not read, tuning whose effect on memory the planner does not model",
}


@dataclass
class Found:
    """Flat scenario keys read from configs, where each came from, notes, warnings and problems."""

    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: What the planner cannot represent or does not know, each naming the key.
    warnings: list[str] = field(default_factory=list)
    #: Raw facts the checks need (the config's own words: bf16 asked, FA2 asked, TP…).
    facts: dict[str, Any] = field(default_factory=dict)
    #: Per config file: its keys (dotted paths) by what became of them: read, ignored, tuning,
    #: unknown (see :func:`account`).
    keys: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def set(self, key: str, value: Any, where: str) -> None:
        self.values[key] = value
        self.where[key] = where

    def default(self, key: str, value: Any, where: str, tool: str) -> None:
        if key not in self.values:
            self.set(key, value, where)
            self.notes.append(f"{where}: not set; {tool}'s default {value!r} applies")

    def take(self, cfg: dict, cfg_key: str, key: str, default: Any, where: str, tool: str) -> None:
        """``cfg[cfg_key]`` as ``key``; the tool's ``default`` (noted) when the config leaves it out."""
        if cfg.get(cfg_key) is not None:
            self.set(key, cfg[cfg_key], f"{where}.{cfg_key}")
        else:
            self.default(key, default, f"{where}.{cfg_key}", tool)

    def warn(self, where: str, message: str) -> None:
        line = f"{where}: {message}"
        if line not in self.warnings:
            self.warnings.append(line)

    def read(self) -> list[dict[str, Any]]:
        """What was read, key by key, with the config key it came from (for reports)."""
        return [{"key": k, "value": v, "from": self.where.get(k, "")} for k, v in self.values.items()]


class Tracked(dict):
    """A config mapping that records which of its keys a reader consulted (dotted paths)."""

    def __init__(self, data: dict, used: set[str], prefix: str = "", last: list | None = None) -> None:
        super().__init__(data)
        self._used = used
        self._prefix = prefix
        #: the last key read and its value, shared by the whole config: where a reader fails on a
        #: value of the wrong kind (a list where the tool takes a mapping), that is the key to name
        self.last: list = [None, None] if last is None else last

    def _wrap(self, key: Any, value: Any) -> Any:
        self.last[:] = [f"{self._prefix}{key}", value]
        if isinstance(value, dict) and not isinstance(value, Tracked):
            return Tracked(value, self._used, f"{self._prefix}{key}.", self.last)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        self._used.add(f"{self._prefix}{key}")
        return self._wrap(key, super().__getitem__(key)) if dict.__contains__(self, key) else default

    def __getitem__(self, key: Any) -> Any:
        self._used.add(f"{self._prefix}{key}")
        return self._wrap(key, super().__getitem__(key))

    def wrong_kind(self) -> str:
        """The last key read, with the kind of value it held (for a reader that failed on it)."""
        key, value = self.last
        kind = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", int: "a number",
                float: "a number", type(None): "empty"}.get(type(value), type(value).__name__)
        return f"{key}: {kind} ({clip(repr(value), 60)}) is not what the tool takes here" if key \
            else "the top level is not what the tool takes"

    def __contains__(self, key: object) -> bool:
        self._used.add(f"{self._prefix}{key}")
        return super().__contains__(key)

    def whole(self, key: str) -> Any:
        """``key`` and everything under it, read as one value."""
        self._used.add(f"{self._prefix}{key}")
        self._used.add(f"{self._prefix}{key}.*")
        return dict.get(self, key)


def _leaves(data: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, path + ".")
        else:
            yield path, value


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _matches(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(p, pat) for p in _ancestors(path) for pat in patterns)


def account(data: dict, used: set[str], where: str, f: Found, ignored: Iterable[str] = (),
            tuning: Iterable[str] = ()) -> None:
    """Sort every key of ``data`` (a config as loaded) into read, ignored, tuning or unknown;
    note the passed-over ones and warn about the unknown ones, by name."""
    sorted_keys: dict[str, list[str]] = {"read": [], "ignored": [], "tuning": [], "unknown": []}
    for path, value in _leaves(data):
        if path in used or any(a + ".*" in used for a in _ancestors(path)[1:]):
            sorted_keys["read"].append(path)
        elif value is None or value == "" or value == [] or value == {}:
            sorted_keys["ignored"].append(path)  # unset: the tool's default, as if absent
        elif _matches(path, ignored):
            sorted_keys["ignored"].append(path)
        elif _matches(path, tuning):
            sorted_keys["tuning"].append(path)
        else:
            sorted_keys["unknown"].append(path)
    f.keys[where] = sorted_keys
    for kind in ("ignored", "tuning"):
        if sorted_keys[kind]:
            f.notes.append(f"{where}: {PASSED_OVER[kind]}: {_brief(sorted_keys[kind], data)}")
    if sorted_keys["unknown"]:
        f.warn(where, f"{_brief(sorted_keys['unknown'], data)}: not known to the planner and not read; "
                      "what they change in memory is not in the estimate")


def _brief(paths: list[str], data: dict) -> str:
    """The keys, a section named once (``profiler.*``) when all its keys are among them."""
    out: list[str] = []
    for path in paths:
        top = path.split(".")[0]
        section = data.get(top)
        if "." in path and isinstance(section, dict) and all(
                p in paths for p, _ in _leaves(section, top + ".")):
            if top + ".*" not in out:
                out.append(top + ".*")
        else:
            out.append(path)
    return ", ".join(out)
