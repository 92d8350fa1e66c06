"""Files for people and programs: tables as CSV, JSON, Parquet, Markdown or HTML, written
atomically (planner.core.outputs). Nothing here computes: results come in, text goes out.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from planner.core.outputs import (  # noqa: F401 - re-exported for the report's callers
    atomic_write,
    atomic_write_text,
    check_writable,
)

TABLE_FORMATS = (".csv", ".json", ".parquet", ".md", ".html")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) >= 100 else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame, columns: list[str] | None = None) -> str:
    cols = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in frame[cols].itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def html_table(frame: pd.DataFrame, columns: list[str] | None = None) -> str:
    cols = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in frame[cols].itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records", date_format="iso"))


def write_frame(frame: pd.DataFrame, path: str | Path, *, document: Callable[[str], str] | None = None) -> Path:
    """Write a table; the format comes from the suffix. ``document(fmt)`` gives a whole report
    (Markdown or HTML) in place of the bare table."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_FORMATS:
        raise ValueError(f"{path}: unknown output format {suffix or '(none)'}; use one of {', '.join(TABLE_FORMATS)}")
    if suffix == ".csv":
        return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))
    if suffix == ".json":
        return atomic_write_text(path, json.dumps(_records(frame), indent=2, ensure_ascii=False) + "\n")
    if suffix == ".parquet":
        return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
    fmt = suffix.lstrip(".")
    text = document(fmt) if document else (markdown_table(frame) if fmt == "md" else html_table(frame))
    return atomic_write_text(path, text)


def write_frame_or_fallback(frame: pd.DataFrame, path: str | Path, *,
                            document: Callable[[str], str] | None = None) -> tuple[Path | None, str | None]:
    """:func:`write_frame`, and when ``path`` cannot be written, the same results elsewhere rather
    than lost: beside it (``NAME.recovered-TIME.EXT``), then in the temporary folder, then as CSV
    there. Returns (where they are, why not at ``path``); (None, why) when nothing could be
    written, for the caller to print them."""
    path = Path(path)
    try:
        return write_frame(frame, path, document=document), None
    except Exception as exc:  # noqa: BLE001 - finished results are never dropped
        why = f"{path}: {getattr(exc, 'strerror', None) or exc}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{path.stem}.recovered-{stamp}-{os.getpid()}"
    tmp_dir = Path(tempfile.gettempdir())
    for target, doc in ((path.with_name(name + path.suffix), document), (tmp_dir / (name + path.suffix), document),
                        (tmp_dir / (name + ".csv"), None)):
        try:
            return write_frame(frame, target, document=doc), why
        except Exception:  # noqa: BLE001, S112 - try the next place
            continue
    return None, why


def image_markup(fmt: str, png: Path | None, alt: str, relative_to: Path) -> str:
    """A picture in a report: a relative link in Markdown, embedded (base64) in HTML."""
    if png is None or not png.is_file():
        return ""
    if fmt == "md":
        return f"![{alt}]({os.path.relpath(png, relative_to)})\n"
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def html_page(title: str, body: str) -> str:
    style = ("body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}"
             "img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n")


def document(fmt: str, title: str, sections: list[tuple[str, str | pd.DataFrame, list[str] | None]],
             out_dir: Path, pictures: list[tuple[str, Path | None]] = ()) -> str:
    """A report: ``sections`` of (heading, text or table, table columns); pictures after them."""
    if fmt == "md":
        parts = [f"# {title}\n"]
        for heading, content, cols in sections:
            parts.append(f"## {heading}\n")
            parts.append(markdown_table(content, cols) if isinstance(content, pd.DataFrame) else content)
            parts.append("")
        for alt, png in pictures:
            parts.append(image_markup("md", png, alt, out_dir))
        return "\n".join(parts) + "\n"
    body = []
    for heading, content, cols in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body.append(html_table(content, cols) if isinstance(content, pd.DataFrame)
                    else "<pre>" + html.escape(content) + "</pre>")
    for alt, png in pictures:
        body.append(image_markup("html", png, alt, out_dir))
    return html_page(title, "\n".join(body))


BATCH_TABLE_COLUMNS = ["scenario", "status", "gpu", "gpus", "dp", "tp", "pp", "cp", "zero", "offload",
                       "micro_batch", "grad_accum", "method", "checkpointing", "memory_bytes", "time_s",
                       "cost_usd", "price_stale", "error"]


def batch_summary(run) -> str:
    counts = run.counts()
    total = sum(counts.values())
    parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    lines = [f"{total} scenarios from {len(run.files)} files in {run.seconds:.1f} s: {parts or 'none'}"]
    lines += [f"skipped {s}" for s in run.skipped]
    stale = run.frame["price_stale"].fillna(False).astype(bool)
    if stale.any():
        gpus = sorted(set(run.frame.loc[stale, "gpu"].dropna()))
        lines.append(f"stale prices (older than the allowed age, or undated): {', '.join(gpus)}")
    return "\n".join(lines)


def batch_document(run, fmt: str, out_dir: Path, plot: Path | None) -> str:
    sections = [("Summary", batch_summary(run), None), ("Plans", run.frame, BATCH_TABLE_COLUMNS)]
    return document(fmt, "planner batch", sections, out_dir, [("memory per GPU", plot)])
