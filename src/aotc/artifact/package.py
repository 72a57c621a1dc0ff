"""Single-file packages: an artifact as one uncompressed file, read in place (`aotc pack`).

A package holds exactly the files of an artifact directory: manifest.json, the signature files
(model.sig, signatures.json) when the artifact is signed, and every file the manifest lists, byte for byte, so the manifest's
hashes and signatures cover a package as they cover the directory. Loading reads the manifest
and plans from it and memory-maps the weights shards from it (artifact/reader.py); nothing is
unpacked to disk (the kernel library goes to a sealed memfd as from a directory).

Layout (integers little-endian):

    offset  size
    0       8    magic b"AOTCPKG\\0"
    8       4    package layout version (1)
    12      4    0
    16      8    L, the index's length
    24      L    the index: canonical JSON {"members": [[name, offset, size], ...]}, in offset
                 order
    ...          the members, each at the offset its index row gives: the first at the next
                 multiple of its alignment after the index, each next one at the next multiple
                 of its alignment after the end of the one before, zeros in between. The
                 alignment is 4096 (a page: mapped in place) for weights shards and members of
                 at least 4096 bytes, 64 for the others.
    end          the end of the last member is the end of the file; nothing may follow

A reader refuses a bad magic, version or header, an index that is not that JSON (strict JSON of
that shape; its bytes need not be canonical), a member name that is not a safe relative path, a
name twice, a member out of bounds, overlapping or not at its aligned place, non-zero padding,
bytes after the last member (all here), and members the manifest does not list or listed files
that are not members (artifact/reader.py). The C++ front end reads packages by the same rules,
with the same messages (runtime/cpp/frontend/package.cpp).
"""
from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.publish import (check_destination, check_destination_parent, fsync_tree,
                                  publish_mode, swap_into_place)

MAGIC = b"AOTCPKG\0"
LAYOUT = 1
HEADER = struct.Struct("<8sIIQ")
PAGE, SMALL = 4096, 64
MAX_INDEX = 64 << 20
SUFFIX = ".aotcpkg"
_FIX = "re-pack the artifact with `aotc pack`, or re-copy the package"


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    offset: int
    size: int


def alignment(name: str, size: int) -> int:
    return PAGE if size >= PAGE or fmt_shard(name) else SMALL


def fmt_shard(name: str) -> bool:
    from aotc.artifact.schema.files import SHARD
    return bool(SHARD.match(name))


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def is_package(path) -> bool:
    """Whether `path` is a regular file (a package; an artifact directory is not)."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


# ------------------------------------------------------------------------------------ read

class Package:
    """An open package: its descriptor and its members by name, every layout rule checked."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as e:
            raise ArtifactError(f"cannot open the package {path} ({os.strerror(e.errno)})",
                                where=str(path), expected="a package written by `aotc pack`",
                                found=os.strerror(e.errno), fix=_FIX) from None
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._fail(f"{path} is not a regular file", "header", "a package file",
                                 stat.filemode(st.st_mode))
            self.size = st.st_size
            self.members = {m.name: m for m in self._index()}
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1

    def where(self, name: str) -> str:
        return f"{self.path}:{name}"

    def pread(self, member: Member) -> bytes:
        return _pread(self.fd, member.offset, member.size, self.where(member.name))

    def _fail(self, what: str, name: str, expected, found) -> ArtifactError:
        return ArtifactError(what, where=self.where(name), expected=expected, found=found,
                             fix=_FIX)

    def _index(self) -> list[Member]:
        head = _pread(self.fd, 0, min(self.size, HEADER.size), str(self.path))
        if head[:8] != MAGIC:
            raise self._fail(f"no artifact directory at {self.path}: a file that is not an "
                             "aotc package", "header",
                             f"{MAGIC.hex()} (hex)", f"{head[:8].hex()} (hex)")
        if len(head) < HEADER.size:
            raise self._fail("the package ends inside its header", "header",
                             f"at least {HEADER.size} bytes", f"{len(head)} bytes")
        _, layout, zero, length = HEADER.unpack(head)
        if layout != LAYOUT:
            raise self._fail(f"package layout {layout} is not supported by this aotc", "header",
                             f"layout {LAYOUT}", layout)
        if zero != 0:
            raise self._fail("the package header's reserved field is not zero", "header", 0,
                             zero)
        if length > min(MAX_INDEX, self.size - HEADER.size):
            raise self._fail("the package index is larger than the package", "index",
                             f"at most {min(MAX_INDEX, self.size - HEADER.size)} bytes",
                             f"{length} bytes")
        rows = _parse_index(_pread(self.fd, HEADER.size, length, str(self.path)), self)
        return self._placed(rows, HEADER.size + length)

    def _placed(self, rows: list[Member], end: int) -> list[Member]:
        """The members, each checked to lie at its aligned place after the one before."""
        prev = None
        for m in rows:
            if m.offset < end:
                raise self._fail(f"package member {m.name} overlaps "
                                 f"{prev.name if prev else 'the index'}", m.name,
                                 f"an offset of at least {end}", m.offset)
            if m.offset + m.size > self.size:
                raise self._fail(f"package member {m.name} lies past the end of the package",
                                 m.name, f"an end within {self.size} bytes",
                                 f"ends at {m.offset + m.size}")
            want = _align(end, alignment(m.name, m.size))
            if m.offset != want:
                raise self._fail(f"package member {m.name} is not at its aligned place", m.name,
                                 f"offset {want}", m.offset)
            self._check_zero(end, m.offset, m.name)
            end, prev = m.offset + m.size, m
        if end != self.size:
            raise self._fail(f"the package has {self.size - end} bytes after its last member",
                             "end", f"{end} bytes in all", f"{self.size} bytes")
        return rows

    def _check_zero(self, lo: int, hi: int, name: str) -> None:
        if hi > lo and _pread(self.fd, lo, hi - lo, str(self.path)).strip(b"\0"):
            raise self._fail(f"the padding before package member {name} is not zeros", name,
                             "zero bytes", "other bytes")


def _parse_index(raw: bytes, pkg: Package) -> list[Member]:
    from aotc.artifact.schema.fields import load_json
    from aotc.artifact.schema.manifest import PATH
    doc = load_json(raw, "package index")
    doc.obj(required=("members",))
    rows, seen = [], set()
    for row in doc.get("members").list(1 << 17):
        name, offset, size = row.list(3, 3)
        name = name.str(max_len=600)
        if not PATH.match(name) or ".." in name.split("/"):
            shown = json.dumps(name[:200], ensure_ascii=False)
            raise pkg._fail(f"package member name {shown} is not a safe relative path",
                            name[:200], "a relative path inside the artifact (letters, digits, "
                            "_ . -; no ..)", shown)
        if name in seen:
            raise pkg._fail(f"package member {name} appears twice", name, "distinct names",
                            f"{name} twice")
        seen.add(name)
        rows.append(Member(name, offset.int(0, 1 << 62), size.int(0, 1 << 62)))
    for name in sorted(seen):   # "a" and "a/b": no directory can hold both (unpack)
        for folder in (name[:i] for i, c in enumerate(name) if c == "/"):
            if folder in seen:
                raise pkg._fail(f"package member {folder} is both a file and a folder", folder,
                                "each name a file or a folder, not both", f"{folder} and {name}")
    return rows


def _pread(fd: int, offset: int, size: int, where: str) -> bytes:
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(size - done, 1 << 24), offset + done)
        if not chunk:
            raise ArtifactError(f"{where} ended while being read", where=where,
                                expected=f"{size} bytes", found=f"{done} bytes", fix=_FIX)
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------------- write

def _members(art, replace: dict[str, bytes]) -> list[tuple[str, object]]:
    """(name, verified bytes or mapping) of every file of the open artifact `art`, with the
    signature files in `replace` stored instead of its own."""
    out = [(fmt.MANIFEST, art.manifest_bytes)]
    for name, limit in ((fmt.SIGNATURES, 1 << 20), (fmt.OMS_SIGNATURE, 16 << 20)):
        data = replace[name] if name in replace else art._read_file(name, limit, optional=True)
        if data is not None:
            out.append((name, data))
    for rel in sorted(art.manifest.files):
        out.append((rel, art.mapped(rel)))
    return out


def _layout(members: list[tuple[str, object]]) -> tuple[bytes, list[Member]]:
    """The header and index, and each member's place."""
    length = 0
    while True:   # the index's length moves the members; iterate to its fixed point
        end, rows = HEADER.size + length, []
        for name, data in members:
            end = _align(end, alignment(name, len(data)))
            rows.append(Member(name, end, len(data)))
            end += len(data)
        index = fmt.dumps({"members": [[m.name, m.offset, m.size] for m in rows]})
        if len(index) == length:
            return HEADER.pack(MAGIC, LAYOUT, 0, length) + index, rows
        length = len(index)


def write_package(art, dest, replace: dict[str, bytes] | None = None) -> Path:
    """Write the open, verified artifact `art` as a package at `dest`, atomically (a partial
    file beside it, renamed into place). `replace`: signature files (signatures.json,
    model.sig) to store instead of the artifact's own (`aotc sign` of a package)."""
    dest = check_package_destination(dest)
    members = _members(art, replace or {})
    head, rows = _layout(members)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        with open(part, "wb") as f:
            f.write(head)
            for (name, data), m in zip(members, rows):
                f.write(b"\0" * (m.offset - f.tell()))
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, dest)
    finally:
        if part.exists():
            part.unlink()
    return dest


def check_package_destination(dest) -> Path:
    dest = check_destination_parent(dest)
    if dest.exists() and not (dest.is_file() and _has_magic(dest)):
        raise ArtifactError(f"refusing to replace {dest}: it exists and is not an aotc package",
                            where=str(dest), expected="an aotc package or no file",
                            found="a directory" if dest.is_dir() else "another file",
                            fix="choose another output path (-o) or remove it yourself")
    return dest


def _has_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def pack(src, dest) -> Path:
    """`aotc pack`: the artifact at `src` (a directory or a package), fully verified, as a
    package at `dest`."""
    from aotc.artifact.reader import Artifact
    art = Artifact(src, signature_policy=False)
    try:
        art.verify_all()
        return write_package(art, dest)
    finally:
        art.close()


def unpack(src, dest) -> Path:
    """`aotc unpack`: the package at `src`, fully verified, as an artifact directory at `dest`
    (byte-identical to the directory it was packed from), swapped into place atomically."""
    from aotc.artifact.reader import Artifact
    from aotc.artifact.staging import Staging
    if not is_package(src):
        raise UsageError(f"{src} is not a package file", where=str(src),
                         expected=f"a {SUFFIX} file written by `aotc pack`",
                         found="a directory" if Path(src).is_dir() else "nothing",
                         fix="pass the package file; a directory is already unpacked")
    dest = check_destination(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    art = Artifact(src, signature_policy=False)
    staging = Staging(f".{dest.name}.tmp-", dest.parent)
    try:
        art.verify_all()
        for name, data in _members(art, {}):
            p = staging.path / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        fsync_tree(staging.path)
        publish_mode(staging.path)
        swap_into_place(staging.path, dest)
    finally:
        art.close()
        staging.remove()
    return dest


__all__ = ["Package", "pack", "unpack", "write_package", "is_package"]
