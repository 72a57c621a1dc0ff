"""The code's budgets and stage boundaries, held as tests rather than habits (STYLE.md):
files of the package, benchmarks and scripts stay under 500 lines and their functions under 60;
the stages import each other only along the pipeline (ARCHITECTURE.md's import rules)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "aotc"
BUDGETED = (PACKAGE, ROOT / "benchmarks", ROOT / "scripts")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def _python_files():
    return sorted(p for d in BUDGETED for p in d.rglob("*.py"))


def _imports(tree: ast.AST) -> set[str]:
    """Every module a file imports, absolute names (aotc's imports are absolute)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def test_files_and_functions_within_budget():
    over = []
    for path in _python_files():
        src = path.read_text()
        rel = path.relative_to(ROOT)
        if (n := src.count("\n")) > MAX_FILE_LINES:
            over.append(f"{rel}: {n} lines (budget {MAX_FILE_LINES}: split it by concern)")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over.append(f"{rel}:{node.lineno} {node.name}: {n} lines "
                                f"(budget {MAX_FUNCTION_LINES}: extract named steps)")
    assert not over, "over the size budgets:\n" + "\n".join(over)


def _stage_imports(stage: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((PACKAGE / stage).rglob("*.py")):
        out[str(path.relative_to(PACKAGE))] = _imports(ast.parse(path.read_text()))
    return out


@pytest.mark.parametrize("stage,forbidden", [
    ("artifact", ("aotc.runtime", "aotc.exporter", "aotc.codegen", "aotc.cli", "aotc.serve",
                  "aotc.api", "aotc.options", "aotc.prove", "aotc.nn")),
    ("runtime", ("aotc.exporter", "aotc.codegen", "aotc.cli")),
    ("exporter", ("aotc.cli",)),
    ("codegen", ("aotc.cli",)),
])
def test_stages_import_along_the_pipeline(stage, forbidden):
    """The runtime never reaches back into the compiler (a serving host loads artifacts without
    it); no stage imports the CLI, which only parses and presents."""
    bad = [f"{f} imports {name}" for f, names in _stage_imports(stage).items()
           for name in sorted(names) if name.startswith(forbidden)]
    assert not bad, "\n".join(bad)


# The compiler writes through the contract (aotc.artifact) and reaches into the runtime only
# where a rule names it, with the reason.
RUNTIME_USES = {
    "codegen/assemble.py": {"aotc.runtime.runner_file":
                            "runner files are derived by the runtime's program builder, at "
                            "export as at load (one derivation)"},
    "codegen/triton/autotune.py": {"aotc.runtime.cuda": "autotune times candidate configs "
                                   "with the launcher the runtime runs them with"},
    "codegen/triton/build.py": {"aotc.runtime.interpret": "kernels cross-compiled for the "
                                "Triton interpreter get the runtime's interpreter settings"},
    "exporter/fft.py": {"aotc.runtime.fourier": "aotc's custom FFT op, which graphs call"},
    "exporter/hf_decoder.py": {"aotc.runtime.attention": "aotc's custom attention op"},
    "exporter/train_attention.py": {"aotc.runtime.attention": "aotc::sdpa_backward traces "
                                    "with the function the runtime runs it with"},
    "exporter/hf_folder.py": {"aotc.runtime.tokenizer": "a folder's tokenizer is read the way "
                              "the runtime reads the artifact's copy"},
}


@pytest.mark.parametrize("stage", ["exporter", "codegen"])
def test_compiler_reaches_the_runtime_only_where_a_rule_names_it(stage):
    bad = [f"{f} imports {name}" for f, names in _stage_imports(stage).items()
           for name in sorted(names) if name.startswith("aotc.runtime")
           and not any(name == m or name.startswith(m + ".") for m in RUNTIME_USES.get(f, {}))]
    assert not bad, ("the compiler imports the runtime outside the named uses (write through "
                     "aotc.artifact, or name the use in RUNTIME_USES with its reason):\n"
                     + "\n".join(bad))
