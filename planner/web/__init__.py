"""``planner serve``: the HTTP API and the page (planner.web.app)."""
