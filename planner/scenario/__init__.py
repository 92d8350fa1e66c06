"""Scenario files in, validated and resolved scenarios out: defaults, model lookup, layout legality."""
