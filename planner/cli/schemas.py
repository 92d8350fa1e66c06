"""JSON Schemas of the input files: a scenario, a scenario file, a procurement portfolio."""

from __future__ import annotations

import copy
from typing import Any

from planner.core.specs import Scenario


def scenario_schema() -> dict[str, Any]:
    return Scenario.model_json_schema()


def scenario_file_schema() -> dict[str, Any]:
    """A file: one scenario, a list of them, or ``scenarios:`` (a list) with ``defaults:``
    (a partial scenario deep-merged under each; so it may leave out required keys)."""
    one = scenario_schema()
    defs = one.pop("$defs", {})
    partial = copy.deepcopy(one)
    partial.pop("required", None)
    partial["title"] = "Defaults"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Scenario file",
        "$defs": {**defs, "Scenario": one, "Defaults": partial},
        "oneOf": [
            {"$ref": "#/$defs/Scenario"},
            {"type": "array", "items": {"$ref": "#/$defs/Scenario"}, "minItems": 1},
            {"type": "object", "additionalProperties": False, "required": ["scenarios"],
             "properties": {"defaults": {"$ref": "#/$defs/Defaults"},
                            "scenarios": {"type": "array", "minItems": 1,
                                          "items": {"$ref": "#/$defs/Defaults"}}}},
        ],
    }


def portfolio_schema() -> dict[str, Any]:
    from planner.fleet.portfolio import Portfolio

    return Portfolio.model_json_schema()


SCHEMAS = {"scenario": scenario_schema, "file": scenario_file_schema, "portfolio": portfolio_schema}
