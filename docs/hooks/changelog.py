"""MkDocs hook: the artifact format's changelog table, generated from src/aotc/artifact/format.py.

A page that holds the line `<!-- format-changelog -->` gets, in its place, one table row per
format version of `CHANGELOG` (newest first) and the current `FORMAT_VERSION`, so the page
cannot drift from the code. The module is read with `ast` (no import: the docs build needs
neither torch nor aotc installed).
"""
from __future__ import annotations

import ast
from pathlib import Path

MARKER = "<!-- format-changelog -->"
FORMAT_PY = Path(__file__).resolve().parents[2] / "src" / "aotc" / "artifact" / "format.py"


def read_changelog(path: Path = FORMAT_PY) -> tuple[int, dict[int, tuple[str, str]]]:
    """(FORMAT_VERSION, CHANGELOG) as the module assigns them, by literal evaluation."""
    version, changelog = None, None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name == "FORMAT_VERSION":
                version = ast.literal_eval(node.value)
            elif name == "CHANGELOG":
                changelog = ast.literal_eval(node.value)
    if version is None or changelog is None:
        raise ValueError(f"{path}: FORMAT_VERSION or CHANGELOG is not a literal assignment")
    return version, changelog


def changelog_table(path: Path = FORMAT_PY) -> str:
    version, changelog = read_changelog(path)
    rows = [f"This aotc writes format **{version}** and reads every version below.", "",
            "| version | date | what changed |", "|---:|---|---|"]
    for number in sorted(changelog, reverse=True):
        date, text = changelog[number]
        rows.append(f"| {number} | {date} | {' '.join(text.split()).replace('<', '&lt;').replace('|', '&#124;')} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (MkDocs' hook signature)
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, changelog_table())
    return markdown
