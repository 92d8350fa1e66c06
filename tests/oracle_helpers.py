"""The oracle check the search tests share: the search's top plans (with the best-first's hints
and without) are the exhaustive enumeration's, and every plan passes the independent checker."""

from __future__ import annotations

from planner.scenario.resolve import resolve
from planner.search.candidates import enumerate_all, search
from planner.search.checker import check_plan
from planner.search.request import build_request
from planner.search.results import assemble


def assert_search_matches_oracle(raw: dict) -> None:
    _, e_all, top_all = enumerate_all(build_request(resolve(raw, search=True)))
    want = [float(e_all.key[j]) for j in top_all]
    for hints in (True, False):
        req = build_request(resolve(raw, search=True))
        outcome = search(req, time_limit_s=60, hints=hints)
        assert [float(outcome.evaluated.key[j]) for j in outcome.picked] == want, f"hints={hints}"
        for plan in assemble(req, raw, outcome):
            assert check_plan(raw, plan) == []
