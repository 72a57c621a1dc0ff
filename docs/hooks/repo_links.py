"""MkDocs hook: links to files of the repository outside docs/ (results, scripts, sources).

Write them as `[text](repo:PATH)`, PATH relative to the repository's root, e.g.
`[results.json](repo:benchmarks/results/cpu/results.json)`. Each PATH must exist (a missing one
is a warning, so `mkdocs build --strict` fails and such links cannot rot). With `repo_url` set
in mkdocs.yml the link goes to `REPO_URL/blob/main/PATH`; without one it is rendered as the
path in code (nothing to link to off the checkout).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!`)\[([^\]]+)\]\(repo:([^)\s]+)\)")   # not in a code span
log = logging.getLogger("mkdocs.hooks.repo_links")


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (MkDocs' hook signature)
    base = (config.get("repo_url") or "").rstrip("/")

    def replace(match: re.Match) -> str:
        text, path = match.groups()
        if not (ROOT / path.split("#")[0]).exists():
            log.warning("%s links to repo:%s, which does not exist", page.file.src_uri, path)
        if base:
            return f"[{text}]({base}/blob/main/{path})"
        return f"`{path}`" if text.strip("`") == path else f"{text} (`{path}`)"

    return LINK.sub(replace, markdown)
