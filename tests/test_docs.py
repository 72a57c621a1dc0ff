"""The documentation site builds and its runnable examples run.

* `mkdocs build --strict` (broken links, missing pages and unresolved API references fail it),
  into a temporary folder; skipped only where mkdocs is not importable (`pip install .[docs]`).
* Every fenced code block marked runnable, an HTML comment `<!-- runnable -->` on the line
  before its opening fence (docs/development.md documents the convention), runs: the blocks of
  one page in order, in one temporary folder that holds a copy of the repository's samples/,
  `bash` blocks with the `aotc` command on PATH and `python` blocks with this checkout's src/
  importable. So the quick start and the guides cannot drift from the code. As the suite's
  in-process exports do (tests/conftest.py's `one_cpu_level`), their exports build C++ kernels
  for this host's CPU level only, not every level `--isa auto` builds: a third of the compiles.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^(`{3,})\s*(\w+)")


def runnable_blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, line) of each block of `page` marked runnable, in page order."""
    lines, blocks, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == MARKER:
            opening = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
            assert opening, f"{page.name}:{i + 1}: {MARKER} must precede an opening ``` fence"
            fence, language = opening.groups()
            end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == fence), None)
            assert end is not None, f"{page.name}:{i + 2}: the runnable block is not closed"
            assert language in ("bash", "python"), f"{page.name}:{i + 2}: runnable blocks are bash or python"
            blocks.append((language, "\n".join(lines[i + 2:end]), i + 3))
            i = end
        i += 1
    return blocks


PAGES = sorted(p for p in DOCS.rglob("*.md") if runnable_blocks(p))


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install .[docs])")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # the format page's changelog is generated from artifact/format.py: every version is listed
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        from changelog import read_changelog
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    version, changelog = read_changelog()
    page = (tmp_path / "site" / "format" / "index.html").read_text()
    assert f"<strong>{version}</strong>" in page
    for number, (date, _) in changelog.items():
        assert f"<td>{date}</td>" in page and f'<td style="text-align: right;">{number}</td>' in page


def test_runnable_blocks_are_found():
    """The quick start is among the pages whose examples run (a marker typo would skip them)."""
    assert DOCS / "quickstart.md" in PAGES
    assert sum(len(runnable_blocks(p)) for p in PAGES) >= 4


ONE_LEVEL = """\
# tests/test_docs.py: exports build this host's CPU level only (as conftest's one_cpu_level)
import aotc.artifact.isa as cpu
cpu.auto_levels = lambda: (cpu.best_level(),)
"""


def _environment(tmp_path: Path) -> dict[str, str]:
    """`aotc` on PATH running this checkout (a shim over this interpreter), src/ importable, and
    a sitecustomize that makes `--isa auto` build one CPU level."""
    bin_dir, site_dir = tmp_path / ".bin", tmp_path / ".site"
    bin_dir.mkdir()
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text(ONE_LEVEL)
    shim = bin_dir / "aotc"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from aotc.cli.main import main; main()" "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site_dir), str(ROOT / "src"),
                                                      env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_runnable_blocks_run(page, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(ROOT / "samples", work / "samples")
    env = _environment(tmp_path)
    for language, code, line in runnable_blocks(page):
        command = (["bash", "-euo", "pipefail", "-c", code] if language == "bash"
                   else [sys.executable, "-c", code])
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (f"{page.relative_to(ROOT)}:{line}: the {language} block failed\n"
                                      f"{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")


def test_repo_links_must_name_files_that_exist(caplog):
    """`[text](repo:PATH)` links (docs/hooks/repo_links.py) fail the strict build when PATH is gone."""
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import repo_links
    finally:
        sys.path.remove(str(DOCS / "hooks"))

    class Page:
        class file:
            src_uri = "page.md"

    text = "[ok](repo:benchmarks/README.md) and [gone](repo:benchmarks/results/nothing/results.json)"
    with caplog.at_level("WARNING", logger="mkdocs.hooks.repo_links"):
        out = repo_links.on_page_markdown(text, Page, {"repo_url": "https://example.org/aotc"}, None)
    assert "(https://example.org/aotc/blob/main/benchmarks/README.md)" in out
    assert [r.getMessage() for r in caplog.records] == [
        "page.md links to repo:benchmarks/results/nothing/results.json, which does not exist"]
