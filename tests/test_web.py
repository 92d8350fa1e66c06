"""The HTTP API (planner.web.app) through the ASGI test client: every endpoint answers what the
library answers for the same scenario, every class of bad request gets its status and one problem
per field, and concurrent requests all get their answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from planner.memory.estimate import estimate_resolved
from planner.scenario.resolve import resolve
from planner.search.answer import plan_raw
from planner.web.app import Limits, create_app

ROOT = Path(__file__).resolve().parents[1]

FIT = {"name": "web", "model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 4096, "micro_batch": 1},
       "layout": {"gpu": "h100", "gpus": 1}}
PLAN = {"name": "web", "model": "llama-3.1-70b", "workload": {"method": "qlora", "seq_len": 4096, "tokens": 2e8},
        "top": 3}


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(Limits(body_bytes=100_000, scenarios=3, solver_s=20.0)))


def test_catalog_endpoints(client):
    assert client.get("/api/version").json()["version"]
    gpus = client.get("/api/gpus").json()
    assert any(g["id"] == "h100-sxm-80gb" and g["memory_mib"] == 81559 for g in gpus)
    models = {m["id"]: m for m in client.get("/api/models").json()}
    assert models["llama-3.1-8b"]["params"] == 8_030_261_248  # the architecture's count
    assert {s["id"] for s in client.get("/api/stacks").json()} >= {"hf-fsdp", "torchtune"}


def test_estimate_is_the_library_estimate(client):
    got = client.post("/api/estimate", json=FIT).json()
    want = estimate_resolved(resolve(FIT, source="request")).model_dump(mode="json")
    assert got["total_bytes"] == want["total_bytes"] and got["components"] == want["components"]
    assert got["verdict"] == want["verdict"] == "fits"


def test_plan_is_the_library_plan(client):
    got = client.post("/api/plan", json=PLAN).json()
    want = plan_raw(PLAN, source="request").model_dump(mode="json")
    assert got["status"] == want["status"] == "optimal"
    assert [(p["gpu"], p["gpus"], p["cost_usd"]) for p in got["plans"]] == \
        [(p["gpu"], p["gpus"], p["cost_usd"]) for p in want["plans"]]


def test_yaml_body_is_read_like_a_scenario_file(client):
    text = "model: llama-3.1-8b\nworkload: {method: lora, seq_len: 4096, micro_batch: 1}\nlayout: {gpu: h100, gpus: 1}\n"
    got = client.post("/api/estimate", content=text, headers={"content-type": "application/yaml"}).json()
    assert got["total_bytes"] == client.post("/api/estimate", json=FIT).json()["total_bytes"]


def test_infeasible_is_an_answer_with_its_explanation(client):
    body = {"model": "llama-3.1-70b", "workload": {"method": "full", "seq_len": 4096, "tokens": 1e8},
            "search": {"gpu_types": ["rtx-4090"], "max_gpus": 1}}
    r = client.post("/api/plan", json=body)
    assert r.status_code == 200
    assert r.json()["status"] == "infeasible" and r.json()["plans"] == []
    assert "memory" in r.json()["explanation"]["binding"]


@pytest.mark.parametrize("body, kwargs, status, needle", [
    ({"model": "llama-3.1-8b", "workload": {"seq_ln": 4096}}, {}, 422, "workload.seq_ln: unknown key; did you mean 'seq_len'?"),
    ({"model": "no-such-model"}, {}, 422, "no-such-model"),
    ({"model": "llama-3.1-8b", "workload": {"seq_len": -5}}, {}, 422, "seq_len"),
    (None, {"content": b'{"model": '}, 422, "body: not valid JSON"),
    (None, {"content": b"[1, 2]"}, 422, "body: a mapping"),
    (None, {"content": b"\xff\xfe"}, 422, "body: not UTF-8"),
    (None, {"content": b"model: [unclosed", "headers": {"content-type": "application/yaml"}}, 422, "malformed YAML"),
    (None, {"content": b" " * 200_000}, 413, "100,000"),
])
def test_bad_requests(client, body, kwargs, status, needle):
    r = client.post("/api/estimate", json=body, **kwargs) if body is not None else client.post("/api/estimate", **kwargs)
    assert r.status_code == status
    problems = r.json()["problems"]
    assert isinstance(problems, list) and any(needle in p for p in problems), problems


def test_bounds_name_themselves(client):
    r = client.post("/api/plan", json={**PLAN, "time_limit_s": 100})
    assert r.status_code == 422 and r.json()["problems"] == [
        "time_limit_s: 100 s is more than the 20 s a request may search"]
    r = client.post("/api/batch", json={"scenarios": [PLAN] * 4})
    assert r.status_code == 422 and "more than the 3" in r.json()["problems"][0]
    r = client.post("/api/batch", json={"scenarios": []})
    assert r.status_code == 422 and r.json()["problems"] == ["scenarios: a non-empty list of scenarios"]


def test_batch_keeps_every_answer(client):
    r = client.post("/api/batch", json={"scenarios": [{**PLAN, "name": "good"}, {"name": "bad", "model": "nope"}, 7]})
    results = r.json()["results"]
    assert r.status_code == 200 and [x["status"] for x in results] == ["optimal", "invalid", "invalid"]
    assert results[0]["plans"] and "nope" in results[1]["problems"][0] and "a mapping" in results[2]["problems"][0]


def test_procure_inline_portfolio_and_no_files(client):
    portfolio = {"name": "two", "horizon_days": 60, "lifetime_months": 36, "rent": ["on_demand"],
                 "defaults": {"profile": "seed", "workload": {"precision": "mixed", "seq_len": 4096}},
                 "jobs": [{"name": "a", "scenario": {"model": "llama-3.1-8b", "workload": {"method": "lora", "tokens": 2e9}},
                           "deadline_hours": 720}],
                 "time_limit_s": 10}
    r = client.post("/api/procure", json=portfolio)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["status"] in ("optimal", "feasible") and got["summary"]["total_usd"] <= got["summary"]["rent_all_usd"] + 1e-6
    assert {row["job"] for row in got["schedule"]} == {"a"}
    r = client.post("/api/procure", json={**portfolio, "prices": [{"path": "/etc/passwd"}],
                                          "jobs": [{"name": "a", "scenario": "job.yaml"}]})
    assert r.status_code == 422 and len(r.json()["problems"]) == 2


def test_scenario_download_is_the_scenario(client):
    import yaml

    r = client.post("/api/scenario.yaml", json=PLAN)
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    assert yaml.safe_load(r.text) == json.loads(json.dumps(PLAN))


def test_pages_ship_everything_they_load(client):
    """No CDN: every script, style and link of the page and the docs is served by the app."""
    import re

    for path in ("/", "/docs"):
        text = client.get(path).text
        assert not re.search(r"(src|href)=\"?https?://", text), path
        for ref in re.findall(r"(?:src|href)=\"?(/static/[^\" >]+)", text):
            assert client.get(ref).status_code == 200, ref
    js = client.get("/static/app.js").text
    assert "http://" not in js.replace("http://www.w3.org", "") and "https://" not in js
    assert "/api/plan" in client.get("/docs").text


def test_concurrent_requests_all_answer():
    """Twenty estimates and three plans at once through a two-search limiter: every one answers,
    each with the answer it gets alone."""
    app = create_app(Limits(searches=2, estimates=4))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            bodies = [{**FIT, "workload": {**FIT["workload"], "micro_batch": 1 + i % 4}} for i in range(20)]
            tasks = [c.post("/api/estimate", json=b) for b in bodies] + [c.post("/api/plan", json=PLAN) for _ in range(3)]
            return bodies, await asyncio.gather(*tasks)

    bodies, answers = asyncio.run(go())
    assert all(r.status_code == 200 for r in answers)
    for body, r in zip(bodies, answers[:20]):
        assert r.json()["total_bytes"] == estimate_resolved(resolve(body, source="request")).total_bytes
    assert len({json.dumps(r.json()["plans"], sort_keys=True) for r in answers[20:]}) == 1


def test_export_bundle_is_the_cli_bundle(client):
    """A plan's launch configs as a zip: the files ``planner export`` writes for the same plan."""
    import io
    import zipfile

    from planner.launch.exporters import export_resolved

    plan = client.post("/api/plan", json=PLAN).json()["plans"][0]
    r = client.post("/api/export", json={"scenario": plan["pinned_scenario"], "stack": plan["stack"]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    files = {n.removeprefix("launch/"): zipfile.ZipFile(io.BytesIO(r.content)).read(n).decode()
             for n in zipfile.ZipFile(io.BytesIO(r.content)).namelist()}
    want = export_resolved(resolve(plan["pinned_scenario"], source="request"), stack=plan["stack"]).files
    assert files == want and "PLAN.md" in files
    bad = client.post("/api/export", json={"scenario": "x", "stack": 5})
    assert bad.status_code == 422 and len(bad.json()["problems"]) == 2


def test_pasted_config_json_is_the_model(client):
    """A config.json's content becomes the scenario's inline model: the estimate equals the one
    of the same config read from its file."""
    path = ROOT / "scenarios" / "configs" / "llama-3.1-8b" / "config.json"
    model = client.post("/api/model", content=path.read_bytes()).json()
    inline = client.post("/api/estimate", json={**FIT, "model": model}).json()
    from_file = client.post("/api/estimate", json={**FIT, "model": str(path)}).json()
    assert inline["total_bytes"] == from_file["total_bytes"] and inline["params"] == 8_030_261_248
    r = client.post("/api/model", json={"model_type": "llama", "hidden_size": 0})
    assert r.status_code == 422 and r.json()["problems"]
