"""`aotc config`: what this installation of aotc provides (its plan runner)."""
from __future__ import annotations

import click


@click.command()
@click.option("--runner", "show_runner", is_flag=True,
              help="Print the plan runner CPU artifacts get here (cpp, or python and why).")
def config(show_runner):
    """Show how aotc is installed: its plan runner."""
    from aotc.runtime.cpp_runner import runner_status
    runner, why = runner_status()
    line = f"cpp (built against torch {runner.TORCH_VERSION})" if runner else f"python ({why})"
    click.echo(line if show_runner else f"runner: {line}")
