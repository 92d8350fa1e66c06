"""The HTTP API and the page: the library's answers over loopback, the same JSON as the CLI's
``--json`` (``planner serve``).

Every body is JSON (or YAML, sent as ``application/yaml``): a scenario is the mapping a scenario
file holds, a portfolio the mapping a portfolio file holds. Bad input answers 422 with ``problems``, one line per problem naming the
field (the CLI's messages); a request nothing satisfies answers 200 with its ``status`` and
explanation; bodies over :data:`Limits.body_bytes` answer 413, more scenarios than
:data:`Limits.scenarios` or a time limit over :data:`Limits.solver_s` 422 naming the bound.
Solves run in threads behind two capacity limiters (estimates, and the CP-SAT searches), so that
heavy requests queue instead of starving the others. Nothing is written to disk.
"""

from __future__ import annotations

import html
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

import planner
from planner.core.errors import InputError
from planner.core.textfiles import parse_json, parse_yaml

STATIC = Path(__file__).resolve().parent / "static"


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server."""

    #: Request body, bytes (a scenario is a few hundred bytes; a portfolio of 100 jobs ~50 kB).
    body_bytes: int = 1_000_000
    #: Scenarios in one ``/api/batch`` request.
    scenarios: int = 50
    #: A scenario's or portfolio's ``time_limit_s``, at most (the default is the library's, 30 s).
    solver_s: float = 60.0
    #: Searches (plan, batch, procure) running at once; more wait their turn.
    searches: int = 2
    #: Estimates running at once (each takes milliseconds).
    estimates: int = 8


class RequestProblem(Exception):
    """A request refused before the library sees it: HTTP status and problems."""

    def __init__(self, status: int, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.status, self.problems = status, problems


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, list):
        return [_jsonable(o) for o in obj]
    return obj


def create_app(limits: Limits = Limits()) -> FastAPI:
    """The ASGI app. ``/docs`` is a page of this package (no external script); the OpenAPI
    document is at ``/openapi.json``."""
    app = FastAPI(title="planner", version=planner.__version__, docs_url=None, redoc_url=None, lifespan=_warm)
    searches = anyio.CapacityLimiter(limits.searches)
    estimates = anyio.CapacityLimiter(limits.estimates)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(RequestProblem)
    async def _refused(_: Request, exc: RequestProblem) -> JSONResponse:
        return JSONResponse({"problems": exc.problems}, status_code=exc.status)

    @app.exception_handler(InputError)
    async def _bad_input(_: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"problems": list(exc.problems)}, status_code=422)

    async def body_of(request: Request, kind: str) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.body_bytes:
            raise RequestProblem(413, [(f"body: {int(declared):,} bytes is more than the {limits.body_bytes:,} "
                                       "a request takes")])
        data, size = bytearray(), 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.body_bytes:
                raise RequestProblem(413, [f"body: more than the {limits.body_bytes:,} bytes a request takes"])
            data.extend(chunk)
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestProblem(422, ["body: not UTF-8 text"]) from None
        yaml_body = "yaml" in request.headers.get("content-type", "")
        value = parse_yaml(text, "body") if yaml_body else parse_json(text, "body")
        if not isinstance(value, dict):
            raise RequestProblem(422, [f"body: a mapping (a {kind}), not {type(value).__name__}"])
        return value

    def bounded(raw: dict[str, Any], where: str) -> dict[str, Any]:
        problems = _limit_problems(raw, where, limits)
        if problems:
            raise RequestProblem(422, problems)
        return raw

    async def run(limiter: anyio.CapacityLimiter, fn: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(fn, limiter=limiter)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_page(app.openapi()))

    @app.get("/api/version")
    async def version() -> dict[str, str]:
        """The planner's version."""
        return {"version": planner.__version__}

    @app.get("/api/gpus")
    async def gpus() -> list[dict[str, Any]]:
        """The GPU catalog (as ``planner gpus --json``)."""
        from planner import catalog

        return [g.model_dump(mode="json") for g in catalog.gpus()]

    @app.get("/api/models")
    async def models() -> list[dict[str, Any]]:
        """The model catalog: id, name, parameters (total and active) and the architecture."""
        from planner import catalog
        from planner.core.arch import param_counts

        out = []
        for m in catalog.models():
            counts = param_counts(m)
            out.append({"id": m.id, "name": m.name, "params": counts.total, "active_params": counts.active,
                        "layers": m.layers, "hidden": m.hidden, "vocab": m.vocab})
        return out

    @app.get("/api/stacks")
    async def stacks() -> list[dict[str, Any]]:
        """The training stacks the search picks from, with their recipes."""
        from planner.catalog.stacks import stacks as all_stacks

        return [s.model_dump(mode="json") for s in all_stacks()]

    @app.post("/api/model")
    async def model_from_config(request: Request) -> Any:
        """A Hugging Face ``config.json`` (its content) → the model as a scenario's inline
        ``model`` (architecture as the planner reads it)."""
        from planner.catalog.hf_config import ConfigError, spec_from_hf_config

        cfg = await body_of(request, "config.json")
        try:
            spec = spec_from_hf_config(cfg, source="config.json")
        except ConfigError as exc:
            raise RequestProblem(422, [str(exc)]) from None
        return spec.model_dump(mode="json", exclude_none=True)

    @app.post("/api/estimate")
    async def estimate(request: Request) -> Any:
        """Memory per GPU of a scenario (as ``planner estimate --json``)."""
        from planner.memory.estimate import estimate_resolved
        from planner.scenario.resolve import resolve

        raw = await body_of(request, "scenario")
        return _jsonable(await run(estimates, lambda: estimate_resolved(resolve(raw, source="request"))))

    @app.post("/api/plan")
    async def plan(request: Request, pareto: bool = False) -> Any:
        """Ranked plans (as ``planner plan --json``); ``status: infeasible`` with the explanation."""
        from planner.search.answer import plan_raw

        raw = bounded(await body_of(request, "scenario"), "")
        return _jsonable(await run(searches, lambda: plan_raw(raw, source="request", pareto=pareto)))

    @app.post("/api/batch")
    async def batch(request: Request) -> Any:
        """``{"scenarios": [...]}``: each scenario's plans or its problems; one bad scenario
        never loses the others' answers."""
        from planner.search.answer import plan_raw

        body = await body_of(request, "batch")
        items = body.get("scenarios")
        if not isinstance(items, list) or not items:
            raise RequestProblem(422, ["scenarios: a non-empty list of scenarios"])
        if len(items) > limits.scenarios:
            raise RequestProblem(422, [(f"scenarios: {len(items):,} is more than the {limits.scenarios} a request "
                                       "takes")])
        problems = [p for i, raw in enumerate(items) if isinstance(raw, dict)
                    for p in _limit_problems(raw, f"scenarios[{i}].", limits)]
        if problems:
            raise RequestProblem(422, problems)

        def answer() -> list[dict[str, Any]]:
            out = []
            for i, raw in enumerate(items):
                name = raw.get("name", f"scenarios[{i}]") if isinstance(raw, dict) else f"scenarios[{i}]"
                try:
                    if not isinstance(raw, dict):
                        raise InputError([f"scenarios[{i}]: a mapping, not {type(raw).__name__}"])
                    out.append({"name": name, **_jsonable(plan_raw(raw, source=f"scenarios[{i}]"))})
                except InputError as exc:
                    out.append({"name": name, "status": "invalid", "problems": list(exc.problems)})
            return out

        return {"results": await run(searches, answer)}

    @app.post("/api/procure")
    async def procure(request: Request) -> Any:
        """A portfolio (the mapping a portfolio file holds, its jobs' scenarios inline): the fleet
        to buy or rent, each job's plan and slot (as ``planner procure --format json``)."""
        from planner.fleet.procure import procure_data
        from planner.report.procurement import tables

        raw = bounded(await body_of(request, "portfolio"), "")
        result = await run(searches, lambda: procure_data(raw))
        return {"status": result.status, **tables(result).to_dict()}

    @app.post("/api/export")
    async def export(request: Request) -> Response:
        """``{"scenario": a plan's pinned_scenario, "stack": its stack}``: the launch configs
        that run it (as ``planner export``), as a zip to download."""
        import io
        import zipfile

        from planner.launch.exporters import export_resolved
        from planner.scenario.resolve import resolve

        body = await body_of(request, "plan to export")
        pinned, stack = body.get("scenario"), body.get("stack")
        problems = ([] if isinstance(pinned, dict) else ["scenario: a plan's pinned_scenario (a mapping)"]) + \
            ([] if stack is None or isinstance(stack, str) else ["stack: a stack's id"])
        if problems:
            raise RequestProblem(422, problems)

        def bundle() -> bytes:
            files = export_resolved(resolve(pinned, source="request"), stack=stack).files
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
                for name, text in files.items():
                    zf.writestr(f"launch/{name}", text)
            return buffer.getvalue()

        data = await run(estimates, bundle)
        return Response(data, media_type="application/zip",
                        headers={"content-disposition": 'attachment; filename="launch.zip"'})

    @app.post("/api/scenario.yaml", response_class=PlainTextResponse)
    async def scenario_yaml(request: Request) -> Response:
        """The posted scenario as a scenario file (YAML), to download."""
        import yaml

        raw = await body_of(request, "scenario")
        text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
        name = str(raw.get("name") or "scenario").replace('"', "")[:60]
        return PlainTextResponse(text, media_type="application/yaml",
                                 headers={"content-disposition": f'attachment; filename="{name}.yaml"'})

    return app


@asynccontextmanager
async def _warm(_: FastAPI) -> AsyncIterator[None]:
    """Load the catalogs and the solver's modules, and answer one estimate, before the first
    request: otherwise the first requests wait together for them."""
    def warm() -> None:
        from planner.memory.estimate import estimate_resolved
        from planner.scenario.resolve import resolve
        from planner.search.answer import plan_raw  # noqa: F401  (imported for its import time)

        estimate_resolved(resolve({"model": "llama-3.1-8b", "layout": {"gpu": "h100"}}, source="warm-up"))

    await anyio.to_thread.run_sync(warm)
    yield


def _limit_problems(raw: dict[str, Any], where: str, limits: Limits) -> list[str]:
    limit = raw.get("time_limit_s")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > limits.solver_s:
        return [f"{where}time_limit_s: {limit:g} s is more than the {limits.solver_s:g} s a request may search"]
    return []


def docs_page(spec: dict[str, Any]) -> str:
    """The API's endpoints, from its OpenAPI document, as a page with no external resource."""
    rows = []
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            doc = html.escape((op.get("description") or op.get("summary") or "").strip())
            rows.append(f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                        f"<td>{doc}</td></tr>")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>planner API</title>"
            "<link rel=stylesheet href=/static/app.css></head><body><main><h1>planner API "
            f"{html.escape(spec.get('info', {}).get('version', ''))}</h1>"
            "<p>Bodies are JSON: a scenario is the mapping a scenario file holds. Bad input: 422 with "
            "<code>problems</code>, one per field. The whole OpenAPI document: <a href=/openapi.json>"
            "/openapi.json</a>.</p><table><thead><tr><th>method</th><th>path</th><th>what</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></main></body></html>")
