"""Temporary directories that a killed process does not leave behind for good.

An export builds its artifact in a sibling directory `.NAME.aotc.tmp-*` and compiles kernels in
`aotc-cc-*` under the temporary directory. A process killed with SIGKILL runs no cleanup, so
each such directory has a lock file beside it (`<dir>.lock`) that its creator keeps locked
(flock) while it lives; the kernel releases the lock when the process dies. The next process
that stages a directory with the same prefix in the same place removes every such directory
whose lock it can take: those whose creator is gone. A live process's directory is never
touched, nor anything without a lock file.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path


class Staging:
    """A temporary directory guarded by a held lock; `remove()` deletes both."""

    def __init__(self, prefix: str, parent: str | os.PathLike | None = None):
        parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        remove_stale(parent, prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def remove(self) -> None:
        if getattr(self, "_lock", -1) >= 0:
            shutil.rmtree(self.path, ignore_errors=True)
            try:
                os.unlink(self.lock_path)
            except FileNotFoundError:
                pass
            os.close(self._lock)
            self._lock = -1

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        self.remove()

    def __del__(self):
        self.remove()


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove the staged directories `parent/prefix*` whose creating process is gone."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".lock")):
            continue
        lock = parent / name
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue    # a live process holds it
        directory = lock.with_name(name[:-len(".lock")])
        if directory.is_dir() and not directory.is_symlink():
            shutil.rmtree(directory, ignore_errors=True)
        try:
            os.unlink(lock)
        except FileNotFoundError:
            pass
        os.close(fd)
        removed.append(directory)
    return removed
