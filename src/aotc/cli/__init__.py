"""Stage 4, the `aotc` command line: argument parsing and presentation only."""
from aotc.cli.main import main

__all__ = ["main"]
