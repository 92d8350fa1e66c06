"""The corpus of real configs in ``tests/fixtures/configs``: each file copied from a public
repository (provenance in ``INDEX.yaml`` and in each YAML file's header), read by ``--config`` as the
index says, written by hand from the config and its tool's documented defaults; and every key of
every file read, passed over with a note, or warned about: nothing is dropped silently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from planner.launch.importers import read_configs
from planner.launch.importers.found import _leaves

ROOT = Path(__file__).parent / "fixtures" / "configs"
INDEX = yaml.safe_load((ROOT / "INDEX.yaml").read_text(encoding="utf-8"))
ROWS = INDEX["configs"]
COMBINED = INDEX.get("combined") or []
#: What every row states (null: the config does not set it, so nothing may be read for it).
CORE = ("method", "quant_bits", "precision", "optimizer", "micro_batch", "grad_accum", "zero", "offload",
        "checkpointing", "loss", "seq_len")
#: The Workload/Layout default a key has when no config sets it.
DEFAULTS = {"loss": "standard", "optimizer_step": "foreach", "activation_offload": False,
            "optimizer_paged": False, "compile": False}


def _read(tool: str, files: list[str], monkeypatch):
    """Read as a user of ``tool`` does: from its folder (a repository root), naming the files relative to it."""
    base = ROOT / tool
    monkeypatch.chdir(base)
    return read_configs([Path(f).relative_to(tool) for f in files])


def _reading(found, expect: dict) -> dict:
    return {k: found.values.get(k, DEFAULTS.get(k)) for k in expect}


def _id(row: dict) -> str:
    return row.get("file") or "+".join(Path(f).name for f in row["files"])


@pytest.mark.parametrize("row", ROWS + COMBINED, ids=_id)
def test_reading_is_the_expected_one(row, monkeypatch):
    files = row.get("files") or [row["file"]]
    found = _read(row["tool"], files, monkeypatch)
    expect = row["expect"]
    assert not set(CORE) - set(expect), f"the index states every core key: {set(CORE) - set(expect)}"
    assert _reading(found, expect) == expect, (found.where, found.notes, found.warnings)
    for key in row.get("warns") or ():
        assert any(key in w for w in found.warnings), (key, found.warnings)


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_key_is_read_noted_or_warned(row, monkeypatch):
    found = _read(row["tool"], [row["file"]], monkeypatch)
    path = ROOT / row["file"]
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    sorted_keys = found.keys[path.name]
    leaves = [p for p, _ in _leaves(data)]
    assert sorted(k for keys in sorted_keys.values() for k in keys) == sorted(leaves)  # each key once
    notes, warnings = "\n".join(found.notes), "\n".join(found.warnings)
    for key in sorted_keys["ignored"] + sorted_keys["tuning"]:
        assert _named(key, notes), key
    for key in sorted_keys["unknown"]:
        assert _named(key, warnings), key


def _named(key: str, text: str) -> bool:
    """``key`` is named in ``text``, itself or as its whole section (``profiler.*``)."""
    return re.search(rf"(^|[ :,]){re.escape(key)}($|[ :,])", text, re.MULTILINE) is not None \
        or f"{key.split('.')[0]}.*" in text


def test_the_corpus_is_real_configs_with_their_provenance():
    files = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and p.name != "INDEX.yaml")
    assert sorted(r["file"] for r in ROWS) == files  # every fixture has its row, every row its file
    assert len(ROWS) >= 30
    for row in ROWS:
        src = row["source"]
        assert row["file"] == f"{row['tool']}/{src['path']}" and len(src["commit"]) == 40
        if not row["file"].endswith(".json"):
            head = (ROOT / row["file"]).read_text(encoding="utf-8").splitlines()[:2]
            assert head[0] == f"# Source: https://github.com/{src['repo']}/blob/{src['commit']}/{src['path']}"
            assert f"repository {src['repo']}, path {src['path']}, commit {src['commit']}" in head[1]
