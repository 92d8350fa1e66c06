"""Memoisation for pure functions of a spec object and hashable arguments.

Catalog specs hold lists, so they cannot be dictionary keys; they are immutable (frozen pydantic
models), so their identity stands for their value while the cache keeps the object alive. The
search evaluates the same layer shapes for thousands of layouts: this makes those repeats free.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Entries kept per function before the cache is emptied (bounds memory in long sessions).
MAX_ENTRIES = 200_000


def by_spec(fn: F) -> F:
    """Cache ``fn(spec, *args, **kwargs)`` by the identity of ``spec`` and the other arguments.
    The result must be treated as immutable by callers."""
    cache: dict[tuple, tuple[Any, Any]] = {}

    @wraps(fn)
    def wrapper(spec: Any, *args: Any, **kwargs: Any) -> Any:
        key = (id(spec), args, tuple(sorted(kwargs.items())) if kwargs else ())
        hit = cache.get(key)
        if hit is not None and hit[0] is spec:
            return hit[1]
        value = fn(spec, *args, **kwargs)
        if len(cache) >= MAX_ENTRIES:
            cache.clear()
        cache[key] = (spec, value)
        return value

    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
