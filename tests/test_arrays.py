"""planner.core.arrays: distinct rows by their bytes, checked against numpy's own."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from planner.core.arrays import unique_rows


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40).flatmap(lambda n: st.integers(1, 5).flatmap(
    lambda m: arrays(st.sampled_from([np.int64, np.float64]), (n, m),
                     elements=st.integers(0, 4)))))
def test_unique_rows_are_numpy_s_distinct_rows(rows):
    uniq, inverse = unique_rows(rows)
    want = np.unique(rows, axis=0) if len(rows) else rows
    assert sorted(map(tuple, uniq.tolist())) == sorted(map(tuple, want.tolist()))
    assert len(inverse) == len(rows)
    if len(rows):
        assert (uniq[inverse] == rows).all()
