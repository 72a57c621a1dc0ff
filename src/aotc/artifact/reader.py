"""Opening an artifact directory: every byte used is read once, from inside it, and verified.

`Artifact(path)` opens the directory once and reads each file relative to that descriptor,
refusing symlinks at every step and anything that is not a regular file, so no path in a
manifest can reach outside the artifact. The manifest is parsed from the bytes whose self-hash
was checked, with the typed schema (artifact/schema); a signature, when the caller requires
one, is checked over those same bytes (artifact/signing.py). Every listed file is then checked
against its size and digests (artifact/hashing.py), from the bytes the runtime goes on to use:
small files are read into memory and checked at open; weights shards, which are large, are
checked when they are used and before any tensor is made of them: memory-mapped privately from
the descriptor and hashed from that mapping, chunks over all cores (`mapped`), or hashed chunk
by chunk from the staging buffers that carry them to a GPU (`stream`, runtime/transfer.py).
Swapping a file on disk after this changes nothing that was loaded. Files the manifest does not
list are never opened.

A path that is a regular file is a package (artifact/package.py): the same files as members of
one file, whose layout is checked when it is opened; each member is then read, mapped or
streamed from its offset in the package exactly as the file of the same name is from a
directory, and a member the manifest does not list is refused.
"""
from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.hashing import Checker
from aotc.artifact.package import Package, is_package
from aotc.artifact.schema import load_json, parse_manifest, parse_plan
from aotc.artifact.schema.flow import check_collectives, check_states
from aotc.artifact.schema.migrate import migrate_manifest, migrate_plan
from aotc.artifact.schema.quant import check_plan as check_quantized

MAX_MANIFEST = 64 << 20
MAPPED = 1 << 20          # files at least this large are memory-mapped, not read


class Artifact:
    """An artifact directory opened for reading (see the module doc)."""

    def __init__(self, path, *, verify_hashes: bool = True, trusted_keys=None,
                 signature_policy: bool = True, isa: str | None = None):
        """`signature_policy=False`: require no signature whatever AOTC_TRUSTED_KEYS says (for
        `aotc sign`, which adds one). `isa`: the CPU level whose kernel library to load (None:
        the best this host supports; runtime/native.py select_level)."""
        self.root = Path(path)
        self.isa = _check_isa(isa)
        self.verify_hashes = verify_hashes
        self.dirfd, self.package = -1, None
        if is_package(self.root):
            self.package = Package(self.root)
        else:
            self.dirfd = _open_root(self.root)
        try:
            self.manifest_bytes = self._read_file(fmt.MANIFEST, None)
            raw = fmt.parse_manifest_bytes(self.manifest_bytes, self.where(fmt.MANIFEST))
            self.version = raw["format_version"]
            self.manifest = parse_manifest(load_json_obj(migrate_manifest(raw), fmt.MANIFEST))
            self._check_members()
            from aotc.artifact.signing import check_signature
            self.signer = check_signature(self, trusted_keys) if signature_policy else None
            if self.signer is not None and not verify_hashes:
                raise UsageError("a required signature means nothing without the hash checks",
                                 where="aotc.load(verify_hashes=False)", expected="True",
                                 found=False, fix="leave verify_hashes on with trusted keys")
            self._cache: dict[str, object] = {}
            self.rank = None     # tensor-parallel artifacts: set when loading selects one
            self._verify_all()
        except BaseException:
            self.close()
            raise

    def where(self, rel: str) -> str:
        return self.package.where(rel) if self.package is not None else str(self.root / rel)

    def close(self, _close=os.close) -> None:
        # (`_close` bound here: at interpreter exit `__del__` may run after `os` is gone)
        if getattr(self, "dirfd", -1) >= 0:
            _close(self.dirfd)
            self.dirfd = -1
        if getattr(self, "package", None) is not None:
            self.package.close()

    def __del__(self):
        self.close()

    # ---------------------------------------------------------------------------- reading
    def listed(self, rel: str) -> bool:
        return rel in self.manifest.files

    def read(self, rel: str) -> bytes:
        """A listed file's bytes, as verified (kept from the check at open, or read and
        verified now)."""
        data = self._cache.get(rel)
        if isinstance(data, bytes):
            return data
        if isinstance(data, mmap.mmap):
            return data[:]
        return self._load(rel)[0]

    def mapped(self, rel: str):
        """A listed file as a private (copy-on-write) mapping of the bytes that were hashed
        (a file below MAPPED bytes: the bytes read at the check)."""
        data = self._cache.get(rel)
        if data is not None:
            return data
        data = self._cache[rel] = self._load(rel, mapped=True)[0]
        return data

    def mapping(self, rel: str) -> tuple[object, Checker]:
        """(private mapping, checker) of a listed file whose size was checked, not yet hashed:
        for a reader that checks every chunk before anything computed from it is used
        (artifact/shards.py)."""
        fd, base = self._open_sized(rel)
        try:
            size = self.manifest.files[rel].size
            data = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, offset=base,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE) if size else b""
        finally:
            os.close(fd)
        return data, self.checker(rel)

    def stream(self, rel: str) -> tuple[int, Checker, int]:
        """(descriptor, checker, offset of the file in it) of a listed file whose size was
        checked, for a reader that hashes each chunk from the very buffer it uses
        (runtime/transfer.py); the caller closes the descriptor."""
        fd, base = self._open_sized(rel)
        return fd, self.checker(rel), base

    def checker(self, rel: str) -> Checker:
        return Checker(self.manifest.files[rel], self.where(rel), rel, self.verify_hashes)

    def verify_all(self) -> None:
        """Check the files whose check waits for their first use (weights shards, every
        rank's) now."""
        for rel in self.weight_shards():
            self.mapped(rel)

    def weight_shards(self) -> tuple:
        """The weights shards of the artifact: every rank's for a tensor-parallel one, until
        loading selects a rank (runtime/parallel.py)."""
        tp = self.manifest.tensor_parallel
        return self.manifest.weights.shards if tp is None or self.rank is not None \
            else tp.shards()

    def plans(self) -> dict:
        """Every entry's plan (entry -> Plan), each checked by the schema. The runtime loads
        them through runtime/runner_file.py `checked_plans`, which also refuses a stored
        runner file its plan does not derive."""
        return {name: self.plan(name) for name in self.manifest.entries}

    def plan(self, entry: str):
        spec = self.manifest.entries[entry]
        raw = migrate_plan(load_json_obj(self.read(spec.plan), spec.plan).value, self.version)
        doc = load_json_obj(raw, spec.plan)
        plan = parse_plan(doc, entry, set(spec.symbols), spec)
        check_states(plan, {s.name: s for s in self.manifest.state}, doc)
        tp = self.manifest.tensor_parallel
        check_collectives(plan, tp.world_size if tp is not None else None, doc)
        check_quantized(plan, self.manifest.quantization, self.manifest.weights.stored, doc)
        return plan

    # ---------------------------------------------------------------------------- checking
    def _verify_all(self) -> None:
        """Every listed file exists with its size; all but the weights shards (checked at
        their first use, see the module doc) are read and hashed now."""
        deferred = set(self.weight_shards())
        for rel in sorted(self.manifest.files):
            if rel in deferred:
                os.close(self._open_sized(rel)[0])
                continue
            data, _ = self._load(rel, mapped=self.manifest.files[rel].size >= MAPPED)
            self._cache[rel] = data

    def _load(self, rel: str, mapped: bool = False):
        """(bytes or mmap, size) of listed file `rel`, checked against the file table."""
        size = self.manifest.files[rel].size
        if mapped and size:
            data, checker = self.mapping(rel)
        else:
            fd, base = self._open_sized(rel)
            try:
                data, checker = _read_at(fd, base, size), self.checker(rel)
            finally:
                os.close(fd)
        checker.check_all(data)
        return data, size

    def _open_sized(self, rel: str) -> tuple[int, int]:
        """(a descriptor, the offset in it) of listed file `rel`, whose size matches the file
        table (a package: a duplicate of its descriptor, the member's offset)."""
        entry = self.manifest.files.get(rel)
        if entry is None:
            raise ArtifactError(f"the artifact reads {rel}, which its manifest does not list",
                                where=self.where(rel), expected="a file listed in the manifest",
                                found="an unlisted file", fix="re-export the model")
        if self.package is not None:
            member = self._member(rel)
            fd, base, size = os.dup(self.package.fd), member.offset, member.size
        else:
            fd, base = self._open(rel), 0
            size = os.fstat(fd).st_size
        if size != entry.size:
            os.close(fd)
            raise ArtifactError(f"artifact file {rel} has the wrong size (truncated or "
                                "modified)", where=self.where(rel),
                                expected=f"{entry.size} bytes", found=f"{size} bytes",
                                fix="re-export or re-copy the artifact")
        return fd, base

    def _member(self, rel: str, optional: bool = False):
        member = self.package.members.get(rel)
        if member is None and not optional:
            raise ArtifactError(f"artifact file {rel} is missing from the package",
                                where=self.where(rel), expected="the file the manifest lists",
                                found="no such member", fix="re-pack the artifact with "
                                "`aotc pack`, or re-copy the package")
        return member

    def _check_members(self) -> None:
        """A package holds the manifest, the signature files and listed files, nothing else."""
        if self.package is None:
            return
        for name in self.package.members:
            if name not in self.manifest.files and name not in fmt.UNLISTED:
                raise ArtifactError(f"package member {name} is not listed in its manifest",
                                    where=self.where(name),
                                    expected="only files the manifest lists",
                                    found=f"an unlisted member {name}",
                                    fix="re-pack the artifact with `aotc pack`")

    def _read_file(self, rel: str, limit: int | None, optional: bool = False) -> bytes | None:
        """An unlisted file of the format (fmt.UNLISTED), size-bounded;
        None for a missing `optional` one."""
        if self.package is not None:
            member = self._member(rel, optional)
            if member is not None and member.size > (limit or MAX_MANIFEST):
                raise ArtifactError(f"{rel} is larger than aotc reads", where=self.where(rel),
                                    expected=f"at most {limit or MAX_MANIFEST} bytes",
                                    found=f"{member.size} bytes", fix="re-export the model")
            return self.package.pread(member) if member is not None else None
        if optional:
            try:
                os.stat(rel, dir_fd=self.dirfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
        fd = self._open(rel)
        try:
            size = os.fstat(fd).st_size
            if size > (limit or MAX_MANIFEST):
                raise ArtifactError(f"{rel} is larger than aotc reads", where=self.where(rel),
                                    expected=f"at most {limit or MAX_MANIFEST} bytes",
                                    found=f"{size} bytes", fix="re-export the model")
            return _read_fd(fd, size)
        finally:
            os.close(fd)

    def _open(self, rel: str) -> int:
        """A descriptor of regular file `rel` inside the artifact, reached without following
        any symlink."""
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
            raise ArtifactError(f"path {rel!r} leaves the artifact", where=self.where(rel),
                                expected="a relative path inside the artifact", found=rel,
                                fix="re-export the model")
        cur, owned = self.dirfd, []
        try:
            for part in parts[:-1]:
                cur = self._openat(part, cur, rel, os.O_DIRECTORY)
                owned.append(cur)
            fd = self._openat(parts[-1], cur, rel, os.O_NONBLOCK)
        finally:
            for d in owned:
                os.close(d)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ArtifactError(f"artifact file {rel} is not a regular file",
                                where=self.where(rel), expected="a regular file",
                                found=stat.filemode(mode), fix="re-export the model")
        return fd

    def _openat(self, name: str, dirfd: int, rel: str, flags: int) -> int:
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags,
                           dir_fd=dirfd)
        except FileNotFoundError:
            raise ArtifactError(f"artifact file {rel} is missing", where=self.where(rel),
                                expected="the file the manifest lists", found="no such file",
                                fix="re-export the model or copy the whole artifact "
                                    "directory") from None
        except OSError as e:   # ELOOP: a symlink; ENOTDIR: a file where a folder should be
            raise ArtifactError(f"artifact file {rel} cannot be opened inside the artifact "
                                f"({os.strerror(e.errno)})", where=self.where(rel),
                                expected="a regular file, no symlinks on the way",
                                found=os.strerror(e.errno), fix="re-export the model; never "
                                "place links in an artifact") from None


def _check_isa(isa):
    from aotc.artifact.isa import LEVELS
    if isa is not None and isa not in LEVELS:
        raise UsageError(f"unknown CPU level {isa!r}", where="aotc.load(isa=)",
                         expected=sorted(LEVELS), found=repr(isa)[:60],
                         fix="pass one of the levels `aotc inspect` lists, or leave isa unset")
    return isa


def _open_root(root: Path) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        exists = root.exists()
        raise ArtifactError(f"no artifact directory at {root}", where=str(root),
                            expected="a directory written by `aotc export`",
                            found="a file" if exists else "nothing",
                            fix="check the path, or export the model first with `aotc export`") \
            from None


def _read_fd(fd: int, size: int) -> bytes:
    return _read_at(fd, 0, size)


def _read_at(fd: int, base: int, size: int) -> bytes:
    """`size` bytes of `fd` from `base` (fewer where it ends: the hash check then fails)."""
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(size - done, 1 << 24), base + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def load_json_obj(data, file: str):
    """A JSON document (bytes, or an already parsed object) as a schema cursor."""
    from aotc.artifact.schema.fields import At
    return load_json(data, file) if isinstance(data, (bytes, bytearray)) else At.root(file, data)
