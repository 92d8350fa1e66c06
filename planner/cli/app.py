"""The typer application and what every command shares: exit codes, error lines, the console."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan LLM training and fine-tuning: memory per GPU, hardware and configuration.",
)

EXIT_OK, EXIT_INFEASIBLE, EXIT_INVALID = 0, 1, 2


def fail(problems: list[str]) -> None:
    """One ``error:`` line per problem on stderr (each bounded, at most a screenful), exit 2."""
    from planner.core.errors import shown

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    for line in shown(problems):
        err.print(f"error: {line}", markup=False)
    raise typer.Exit(EXIT_INVALID)


def console() -> Console:
    """A terminal's own width; piped output is not cut at 80 columns."""
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=False, width=200)
    return console
