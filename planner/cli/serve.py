"""``planner serve``: the local web app and HTTP API."""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default: the API reads local model "
                                      "configs named in a scenario).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.", min=1, max=65535)] = 8000,
) -> None:
    """Serve the web page and the HTTP API (FastAPI + uvicorn): estimate, plan, batch and procure
    over JSON; the page at http://HOST:PORT/, the API's endpoints at /docs."""
    import uvicorn

    from planner.web.app import create_app

    uvicorn.run(create_app(), host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    app.command()(serve)
