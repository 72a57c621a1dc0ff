"""Publishing an artifact directory (artifact/format.py's writers, packages' unpack, weight
swaps): where it may go (the checks made before any slow work), the private staging folder
beside it, the mode it is published with, and the atomic swap into place, so that a reader or
a killed export sees the previous artifact or the new one, never a mixture.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from aotc.errors import ArtifactError


def staging_beside(dest: Path):
    """The staging directory beside `dest` (its folders made first), or a UsageError where the
    file system refuses (no permission, read-only) though the checks before passed (root)."""
    import errno

    from aotc.errors import UsageError
    from aotc.artifact.staging import Staging
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Staging(f".{dest.name}.tmp-", dest.parent)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise UsageError(f"cannot write {dest}: {e.strerror}", where=str(dest.parent),
                         expected="a writable folder", found=e.strerror,
                         fix="choose an output path (-o) in a folder you can write") from None


def publish_mode(root: Path) -> None:
    """The artifact's root folder with the mode a new folder gets (0755 under umask 022): the
    staging directory is made private (0700) while it is written, and a server running as
    another user must be able to read the artifact once it is in place."""
    os.chmod(root, 0o777 & ~_umask())


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_dir(dest) -> Path:
    """The CLI's `-o`: a new or existing artifact directory in an existing folder (nothing
    else is created), or a UsageError saying why not."""
    from aotc.errors import UsageError
    path = check_destination_parent(dest)
    if path.exists() and not path.is_dir():
        raise UsageError(f"-o {dest}: that is an existing file, and an artifact is a folder",
                         where="-o", expected="a new name or an artifact folder",
                         found=f"the file {path}",
                         fix=f"choose another name, e.g. -o {path.stem}.aotc, or remove the file")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: the folder {path.parent} does not exist",
                         where="-o", expected="an artifact path in an existing folder",
                         found=f"no folder {path.parent}",
                         fix=f"create it first (mkdir -p {path.parent}) or choose another -o")
    return path


def check_destination(dest) -> Path:
    """`dest` as an absolute path an artifact can be written to, or a UsageError / an
    ArtifactError saying why not (checked before any slow work)."""
    from aotc.artifact.format import MANIFEST
    dest = check_destination_parent(dest)
    if dest.exists() and not (dest.is_dir() and (dest / MANIFEST).is_file()):
        raise ArtifactError(f"refusing to replace {dest}: it exists and is not an aotc artifact",
                            where=str(dest), expected=f"a directory holding {MANIFEST} or no file",
                            found="a file or a directory without a manifest",
                            fix="choose another output path (-o) or remove it yourself")
    return dest


def check_destination_parent(dest) -> Path:
    """`dest` as an absolute path under a writable directory, or a UsageError saying why not."""
    from aotc.errors import UsageError
    if str(dest).strip() == "":
        raise UsageError("the output path is empty", where="-o / path", expected="a path",
                         found=repr(str(dest)), fix="name the artifact, e.g. -o model.aotc")
    dest = Path(dest).absolute()
    parent = next((p for p in [dest.parent, *dest.parent.parents] if p.exists()), None)
    if parent is None or not parent.is_dir():
        raise UsageError(f"cannot write {dest}: {parent} is not a directory", where=str(dest),
                         expected="a path under a directory", found=f"{parent} is a file",
                         fix="choose another output path (-o)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {dest}: {parent} is not writable", where=str(parent),
                         expected="a writable directory", found="no write permission",
                         fix="choose a writable output path (-o)")
    return dest


def fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


_RENAME_EXCHANGE = 2


def swap_into_place(tmp: Path, dest: Path) -> None:
    """Rename tmp to dest. If dest exists, exchange the two atomically (renameat2) where the OS
    allows, so there is no moment without a complete artifact at `dest`; tmp then holds the old."""
    if not dest.exists():
        os.rename(tmp, dest)
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd = -100
    if renameat2 is not None and renameat2(at_fdcwd, os.fsencode(tmp), at_fdcwd,
                                           os.fsencode(dest), _RENAME_EXCHANGE) == 0:
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.rename(dest, old)
    os.rename(tmp, dest)
    os.rename(old, tmp)
