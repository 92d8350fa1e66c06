"""Text files people give the planner, read within limits: size, encoding, kind of file, and for
YAML and JSON the depth of nesting, the number of values (aliases expanded), the length of any
text and duplicate keys. Every problem is one line of :class:`InputError` naming the file (and
the field, where the parser knows it); nothing a file holds can exhaust memory or the stack.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.core.errors import EXCERPT_CHARS, InputError, clip, excerpt

#: The largest YAML file read (scenario or portfolio): far above any real one (the shipped
#: examples are under 4 KiB), small enough that reading it stays quick.
MAX_INPUT_BYTES = 1 << 20
#: The deepest nesting of mappings and lists (a portfolio's job scenario is 5 deep).
MAX_DEPTH = 32
#: The most values (scalars, mappings, lists) a file may hold once its aliases are expanded:
#: thousands of scenarios of a few dozen values each. A few hundred bytes of nested aliases
#: ("billion laughs") would otherwise expand to billions.
MAX_VALUES = 100_000
#: The longest text (a key or a value) accepted anywhere: names, paths, catalog names.
MAX_TEXT_CHARS = 1024


class _Refused(yaml.MarkedYAMLError):
    """A YAML document refused by a limit; ``where`` names the field."""

    def __init__(self, where: str, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)
        self.where = where


try:  # libyaml's parser (C) under the Python composer below: about 3× faster on large files
    from yaml._yaml import CParser as _CParser

    class _SafeBase(yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver,
                    _CParser):
        def __init__(self, stream):
            _CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)
except ImportError:  # PyYAML built without libyaml
    _SafeBase = yaml.SafeLoader  # type: ignore[misc,assignment]


class _BoundedLoader(_SafeBase):
    """PyYAML's safe loader with limits checked while the document is composed (before any
    value is built): depth, values after alias expansion, text length; and duplicate keys."""

    max_text_chars = MAX_TEXT_CHARS

    def __init__(self, stream):
        super().__init__(stream)
        self._path: list[str] = []
        self._values = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values expanded, height)

    def _where(self) -> str:
        def dotted(parts: list[str]) -> str:
            return "".join(p if p.startswith("[") or i == 0 else "." + p for i, p in enumerate(parts))

        if len(self._path) > 6:
            return f"{dotted(self._path[:3])}…{dotted(self._path[-2:])}"
        return dotted(self._path) or "(top level)"

    def compose_node(self, parent, index):
        if isinstance(parent, yaml.MappingNode):
            label = "(a key)" if index is None else (clip(index.value, 40) if isinstance(index, yaml.ScalarNode)
                                                   else "(complex key)")
        elif isinstance(parent, yaml.SequenceNode):
            label = f"[{index}]"
        else:
            label = None
        if label is not None:
            self._path.append(label)
        try:
            return self._compose_bounded(parent, index)
        finally:
            if label is not None:
                self._path.pop()

    def _compose_bounded(self, parent, index):
        event = self.peek_event()
        depth = len(self._path)
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise _Refused(self._where(), f"alias *{clip(event.anchor, 40)} refers to a value that contains it",
                               event.start_mark)
            self._count(size[0], event.start_mark)
            if depth + size[1] > MAX_DEPTH:
                raise _Refused(self._where(), f"nested deeper than {MAX_DEPTH} levels (through alias "
                               f"*{clip(event.anchor, 40)})", event.start_mark)
            return node
        if depth > MAX_DEPTH:
            raise _Refused(self._where(), f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > self.max_text_chars:
            raise _Refused(self._where(), f"text of {len(event.value):,} characters is longer than the "
                           f"{self.max_text_chars:,} allowed: {excerpt(event.value)}", event.start_mark)
        before = self._values
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        height = 1 + max((self._sizes[id(n)][1] for n in self._children(node)), default=0)
        self._sizes[id(node)] = (self._values - before, height)
        return node

    @staticmethod
    def _children(node):
        if isinstance(node, yaml.SequenceNode):
            return node.value
        if isinstance(node, yaml.MappingNode):
            return [n for kv in node.value for n in kv]
        return ()

    def _count(self, n: int, mark) -> None:
        self._values += n
        if self._values > MAX_VALUES:
            raise _Refused(self._where(), f"more than {MAX_VALUES:,} values (aliases expanded)", mark)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {excerpt(key)} (first at line {first.line + 1})",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # e.g. a timestamp 2027-13-45
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {excerpt(node.value) if isinstance(node, yaml.ScalarNode) else 'a value'}: "
                f"{clip(str(exc), EXCERPT_CHARS)}", node.start_mark) from None


def read_text_bounded(path: str | Path, *, limit: int = MAX_INPUT_BYTES) -> str:
    """A regular file's text (UTF-8, at most ``limit`` bytes); anything else is one line of InputError.

    The file is opened without blocking and checked again once open, so a named pipe or a
    device never stalls the read."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        if _is_link(path):
            raise InputError([f"{path}: a broken symbolic link or a link loop"]) from None
        if isinstance(exc, FileNotFoundError):
            raise InputError([f"{path}: no such file"]) from None
        # e.g. a name longer than a file name may be: the message quotes an excerpt of it
        raise InputError([f"{excerpt(str(path))}: cannot read: {exc.strerror or exc}"]) from None
    except ValueError:  # a NUL byte in the path
        raise InputError([f"{path}: no such file"]) from None
    _check_regular(path, st, limit)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        _check_regular(path, os.fstat(fd), limit)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise InputError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputError([f"{path}: larger than the {limit:,} bytes allowed"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError([f"{path}: not a UTF-8 text file (byte {exc.start:,})"]) from None


def _is_link(path: Path) -> bool:
    return _holds(Path.is_symlink, path)


def _check_regular(path: Path, st: os.stat_result, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise InputError([f"{path}: a folder, not a file"])
    if not stat.S_ISREG(st.st_mode):
        raise InputError([f"{path}: not a regular file ({_file_kind(st.st_mode)})"])
    if st.st_size > limit:
        raise InputError([f"{path}: {st.st_size:,} bytes is larger than the {limit:,} allowed"])


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


def parse_yaml(text: str, source: str, *, max_text_chars: int = MAX_TEXT_CHARS) -> Any:
    """YAML text -> data, within the limits above; any problem is one line of InputError."""
    loader = _BoundedLoader(text)
    loader.max_text_chars = max_text_chars
    try:
        return loader.get_single_data()
    except _Refused as exc:
        mark = exc.problem_mark
        raise InputError([(f"{source}: {exc.where}: {exc.problem} (line {mark.line + 1}, column "
                          f"{mark.column + 1})")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "maximum nesting depth" in problem:  # libyaml ≥ 0.2.5 stops at 1,000 levels itself
            raise InputError([f"{source}: {where}nested deeper than {MAX_DEPTH} levels"]) from None
        context = getattr(exc, "context", None)
        if context and context.startswith("found"):  # "found duplicate anchor 'x'; first occurrence"
            cmark = getattr(exc, "context_mark", None)
            problem = f"{context} at line {cmark.line + 1}, {problem}" if cmark else f"{context}, {problem}"
        raise InputError([f"{source}: malformed YAML: {where}{clip(problem, 2 * EXCERPT_CHARS)}"]) from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content, read within the limits above (:data:`MAX_INPUT_BYTES`,
    :data:`MAX_DEPTH`, :data:`MAX_VALUES`, :data:`MAX_TEXT_CHARS`, no duplicate keys); a
    missing, unreadable, oversized, malformed or non-UTF-8 file is one line of InputError."""
    return parse_yaml(read_text_bounded(path), str(path))


def parse_json(text: str, source: str) -> Any:
    """JSON text -> data, nested at most :data:`MAX_DEPTH` deep (the parser recurses: a file
    nested deeper than the stack allows would otherwise end in RecursionError, not an answer);
    any problem is one line of InputError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError([f"{source}: not valid JSON: {clip(str(exc), 2 * EXCERPT_CHARS)}"]) from None
    except RecursionError:
        raise InputError([f"{source}: nested deeper than {MAX_DEPTH} levels"]) from None
    if _depth(data) > MAX_DEPTH:
        raise InputError([f"{source}: nested deeper than {MAX_DEPTH} levels"])
    return data


def _depth(data: Any) -> int:
    """How deeply lists and objects nest (a scalar: 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:  # deeper is refused whatever lies below
            stack.extend((c, depth + 1) for c in children)
    return deepest


def load_json(path: str | Path, *, limit: int = MAX_INPUT_BYTES) -> Any:
    """A JSON file's content, read within the limits above; any problem is one line of InputError."""
    return parse_json(read_text_bounded(path, limit=limit), str(path))


def is_file(path: str | Path) -> bool:
    """``Path.is_file``, False (not an error) for what no file system takes as a path: a part
    longer than a file name may be, a NUL character."""
    return _holds(Path.is_file, path)


def is_dir(path: str | Path) -> bool:
    """``Path.is_dir``, False for what no file system takes as a path (see :func:`is_file`)."""
    return _holds(Path.is_dir, path)


def _holds(test, path: str | Path) -> bool:
    """``test(path)``, False where the file system cannot take ``path`` at all."""
    try:
        return test(Path(path))
    except (OSError, ValueError):
        return False
