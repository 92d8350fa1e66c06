"""Array helpers the search and the memory profiles share."""

from __future__ import annotations

import numpy as np


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D array and, for each row, the index of its distinct row.

    Like ``np.unique(rows, axis=0, return_inverse=True)`` but with the rows compared as raw bytes
    (one ``void`` element each): about 8× faster on the search's 10^5-row tables. The distinct
    rows come in byte order, not numeric order; callers use them as ids only."""
    rows = np.ascontiguousarray(rows)
    if rows.shape[0] == 0:
        return rows.reshape(0, rows.shape[1] if rows.ndim == 2 else 0), np.zeros(0, dtype=np.int64)
    width = rows.dtype.itemsize * rows.shape[1]
    keys = rows.view(np.dtype((np.void, width))).ravel()
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq.view(rows.dtype).reshape(-1, rows.shape[1]), inverse.ravel().astype(np.int64)
