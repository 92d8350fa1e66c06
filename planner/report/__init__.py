"""Rendering: terminal tables, JSON, files (CSV, Parquet, Markdown, HTML) and pictures. Nothing here computes."""
