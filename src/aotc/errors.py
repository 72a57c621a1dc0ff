"""One error hierarchy for every stage of aotc.

Every message says what went wrong, where (input, dim, op, file:line), the value expected and the
value found, and one concrete fix. The CLI maps each class to its own exit code and prints no
traceback unless asked (`--debug`).
"""
from __future__ import annotations


class AotcError(Exception):
    """Base class. `exit_code` is what the CLI exits with for this class of failure."""

    exit_code = 1

    def __init__(self, what: str, *, where: str | None = None, expected: object = None,
                 found: object = None, fix: str | None = None):
        self.what, self.where, self.expected, self.found, self.fix = what, where, expected, found, fix
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [self.what]
        for label, value in (("where", self.where), ("expected", self.expected),
                             ("found", self.found), ("fix", self.fix)):
            if value is not None:
                lines.append(f"  {label}: {value}")
        return "\n".join(lines)


class UsageError(AotcError):
    """A malformed argument: shape string, dtype, model reference, option value."""
    exit_code = 2


class ExportError(AotcError):
    """The model could not be loaded, run or captured as one graph."""
    exit_code = 3


class LoweringError(AotcError):
    """Codegen could not turn a captured graph into a plan or kernels."""
    exit_code = 4


class ArtifactError(AotcError):
    """An artifact directory is missing, damaged, tampered with, or of an unknown format."""
    exit_code = 5


class GuardError(AotcError, ValueError):
    """A runtime input does not satisfy the guards recorded at export."""
    exit_code = 6


class TargetError(AotcError):
    """The artifact was built for a device, ISA or torch ABI that this host cannot run."""
    exit_code = 7


class VerifyError(AotcError):
    """Running the recorded sample inputs did not reproduce the recorded outputs."""
    exit_code = 8


class StateDictError(UsageError, RuntimeError):
    """A state dict or weights file does not fit the artifact's weights (keys, shapes, dtypes);
    a RuntimeError too, as torch's load_state_dict raises one."""
