"""`aotc config`: what this installation of aotc provides (its plan runner, its C++ runtime)."""
from __future__ import annotations

from pathlib import Path

import click

CPP = Path(__file__).resolve().parent.parent / "runtime" / "cpp"   # aotc/runtime/cpp


@click.command()
@click.option("--runner", "show_runner", is_flag=True,
              help="Print the plan runner CPU artifacts get here (cpp, or python and why).")
@click.option("--cmake-prefix-path", "show_prefix", is_flag=True,
              help="Print CMAKE_PREFIX_PATH for C++ programs using aotc::Module: aotc's CMake "
                   "config folder and torch's, ';'-separated.")
def config(show_runner, show_prefix):
    """Show how aotc is installed: its plan runner and its C++ runtime."""
    if show_prefix:
        from aotc.errors import AotcError
        try:
            click.echo(cmake_prefix_path())
        except AotcError as e:
            click.echo(f"error ({type(e).__name__}): {e}", err=True)
            raise SystemExit(e.exit_code) from None
        return
    from aotc.runtime.cpp_runner import runner_status
    runner, why = runner_status()
    line = f"cpp (built against torch {runner.TORCH_VERSION})" if runner else f"python ({why})"
    click.echo(line if show_runner else f"runner: {line}")
    if not show_runner and runner is not None:   # the C++ front end shares the runner's build
        missing = getattr(runner, "GRAPHS_MISSING", "")
        click.echo("C++ front end CUDA graphs: " + (f"no ({missing})" if missing else "yes"))


def cmake_prefix_path() -> str:
    """aotc's CMake config folder and torch's (`find_package(aotc)` finds libtorch through
    torch's own config), or a UsageError where the C++ runtime was not built."""
    import torch.utils

    from aotc.errors import UsageError
    lib = CPP / "lib" / "libaotc_runtime.so"
    if not lib.is_file():
        raise UsageError("aotc was installed without its C++ runtime", where=str(lib),
                         expected="libaotc_runtime.so", found="no such file",
                         fix="reinstall with torch importable: pip install --no-build-isolation .")
    return f"{CPP / 'cmake'};{torch.utils.cmake_prefix_path}"
