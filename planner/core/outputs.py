"""Result files written atomically, to a target checked before the work that fills it.

A file is written to a temporary sibling, flushed to disk, then renamed over the target, so a
crash or Ctrl-C never leaves a half-written result (``os.replace`` is atomic on one filesystem).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` fills a temporary file beside ``path``, which then replaces ``path``.

    The result has the permissions a plain ``open(path, "w")`` would give it: those of the
    file it replaces, or 0666 less the umask for a new one (not the 0600 of a temporary file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_sibling(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        except FileNotFoundError:
            pass
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _create_sibling(path: Path) -> Path:
    """A new empty file ``.NAME.XXXXXXXX.tmp`` beside ``path``, created as ``open()`` creates
    files (mode 0666, less the umask)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"{path}: no free temporary name beside it")


def check_writable(path: str | Path) -> str | None:
    """Why ``path`` cannot be written as a result file, or None when it can: it is not a
    folder, not read-only, and its folder (or the nearest one that exists, where folders are
    to be made) takes new files. Checked by creating and removing a file there, the one test
    that also covers read-only mounts and access lists."""
    try:
        return _why_not_writable(Path(path))
    except (OSError, ValueError) as exc:
        return f"{path}: {getattr(exc, 'strerror', None) or exc}"


def _why_not_writable(path: Path) -> str | None:
    if path.is_dir():
        return f"{path} is a folder"
    if os.path.lexists(path) and not os.access(path, os.W_OK, follow_symlinks=True):
        return f"{path} is read-only"
    folder = path.parent
    while not folder.exists():
        if os.path.lexists(folder) or folder.parent == folder:
            return f"{folder} cannot be made"
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        _create_sibling(folder / path.name).unlink()
    except OSError as exc:
        return f"cannot write in {folder}: {exc.strerror or exc}"
    return None


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
