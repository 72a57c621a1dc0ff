"""Signed artifacts: Ed25519 signatures over manifest.json, kept beside it in signatures.json.

The manifest hashes every other file, so a signature over its exact bytes covers the whole
artifact. `aotc keygen` writes a key pair (PEM: PKCS#8 private key, mode 0600, and the public
key), `aotc sign ART --key KEY` adds or replaces that key's signature, and loading with trusted
keys (`aotc.load(path, trusted_keys=[...])`, or the files and directories named in
AOTC_TRUSTED_KEYS) makes a valid signature by one of them mandatory: an artifact re-hashed or
re-signed by anyone else is refused before anything else is read. Without trusted keys a
signature is not required, and `aotc inspect` says who signed and whether it verifies.
Signing needs the optional `cryptography` package (`pip install aotc[sign]`).

    signatures.json: {"format": 1, "signatures": [{"algorithm": "ed25519", "key_id": <hex16>,
                      "public_key": <base64 of the 32 raw bytes>, "signature": <base64>}]}
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import NoReturn

from aotc.errors import ArtifactError, UsageError
from aotc.runtime import format as fmt

ENV = "AOTC_TRUSTED_KEYS"
MAX_SIGNATURES = 64


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise UsageError("signatures need the cryptography package", where="aotc signing",
                         expected="cryptography installed", found="not installed",
                         fix="pip install 'aotc[sign]' (or pip install cryptography)") from None
    return ed25519, serialization, InvalidSignature


def key_id(raw_public: bytes) -> str:
    return hashlib.sha256(raw_public).hexdigest()[:16]


def public_key_bytes(key) -> bytes:
    """The 32 raw bytes of an Ed25519 public key given as raw bytes, base64 text, PEM text or
    bytes, a path to a PEM or base64 file, or a cryptography key object."""
    ed25519, serialization, _ = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if isinstance(key, (str, os.PathLike)) and not str(key).startswith("-----") \
            and Path(key).is_file():
        key = Path(key).read_bytes()
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, bytes) and len(key) == 32:
        return key
    if isinstance(key, bytes) and key.lstrip().startswith(b"-----BEGIN"):
        from cryptography.exceptions import UnsupportedAlgorithm
        try:
            loaded = serialization.load_pem_public_key(key)
        except ValueError:   # no PUBLIC KEY block, or one that does not parse
            _not_a_key(key)
        except UnsupportedAlgorithm:
            loaded = None
        if not isinstance(loaded, ed25519.Ed25519PublicKey):
            raise UsageError("the trusted key is not an Ed25519 key", where="trusted_keys",
                             expected="an Ed25519 public key",
                             found=type(loaded).__name__ if loaded is not None else
                             "a key of an algorithm cryptography does not support",
                             fix="use a key written by `aotc keygen`")
        return public_key_bytes(loaded)
    try:
        raw = base64.b64decode(key.strip(), validate=True)
    except (ValueError, TypeError, AttributeError):
        raw = b""
    if len(raw) != 32:
        _not_a_key(key)
    return raw


def _not_a_key(key) -> NoReturn:
    raise UsageError("a trusted key is not an Ed25519 public key", where="trusted_keys",
                     expected="a PEM public key, its file, or 32 raw bytes (base64)",
                     found=repr(key)[:60], fix="use the .pub file `aotc keygen` wrote")


def trusted_from_env() -> list:
    """Keys named by AOTC_TRUSTED_KEYS: files, or directories of *.pub / *.pem files."""
    value = os.environ.get(ENV, "")
    keys = []
    for part in filter(None, value.split(os.pathsep)):
        p = Path(part)
        if p.is_dir():
            keys += sorted(q for q in p.iterdir() if q.suffix in (".pub", ".pem"))
        elif p.is_file():
            keys.append(p)
        else:
            raise UsageError(f"{ENV} names {part!r}, which is no key file or directory",
                             where=ENV, expected="key files or directories", found=part,
                             fix=f"fix {ENV} (entries separated by {os.pathsep!r})")
    return keys


def read_signatures(artifact) -> list[dict]:
    """The signatures beside the manifest, checked for form (not yet verified)."""
    from aotc.runtime.schema.fields import load_json
    data = artifact._read_file(fmt.SIGNATURES, 1 << 20, optional=True)
    if data is None:
        return []
    doc = load_json(data, fmt.SIGNATURES).obj(required=("format", "signatures"))
    doc.get("format").int(1, 1)
    out = []
    for s in doc.get("signatures").list(MAX_SIGNATURES):
        s.obj(required=("algorithm", "key_id", "public_key", "signature"))
        s.get("algorithm").str(choices={"ed25519"})
        entry = {k: s.get(k).str(max_len=128) for k in ("key_id", "public_key", "signature")}
        out.append(entry)
    return out


def verified_signers(artifact, signatures: list[dict]) -> dict[str, bool]:
    """key id -> whether its signature over the manifest's bytes verifies."""
    ed25519, _, invalid = _crypto()
    out = {}
    for s in signatures:
        try:
            raw = base64.b64decode(s["public_key"], validate=True)
            sig = base64.b64decode(s["signature"], validate=True)
            ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(sig, artifact.manifest_bytes)
            out[key_id(raw)] = key_id(raw) == s["key_id"]
        except (ValueError, invalid):
            out[s["key_id"]] = False
    return out


def check_signature(artifact, trusted_keys) -> str | None:
    """The key id of a trusted key that signed the artifact; None when no key is trusted
    (no signature required). ArtifactError when keys are trusted and none of them signed."""
    keys = list(trusted_keys or []) + trusted_from_env()
    if not keys:
        return None
    trusted = {key_id(public_key_bytes(k)) for k in keys}
    signatures = read_signatures(artifact)
    valid = {k for k, ok in verified_signers(artifact, signatures).items() if ok}
    good = sorted(valid & trusted)
    if good:
        return good[0]
    found = ("no signature" if not signatures else
             f"signatures by {sorted(s['key_id'] for s in signatures)}"
             + ("" if valid >= {s["key_id"] for s in signatures} else " (some do not verify)"))
    raise ArtifactError("the artifact is not signed by a trusted key",
                        where=artifact.where(fmt.SIGNATURES),
                        expected=f"a valid signature by one of {sorted(trusted)}", found=found,
                        fix="sign it with a trusted key (`aotc sign ART --key KEY`), or load "
                            "it from the producer you trust")


# ------------------------------------------------------------------------------ producing
def generate_keys(dest: str | os.PathLike) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: `dest` (private, 0600) and `dest`.pub."""
    ed25519, serialization, _ = _crypto()
    dest = Path(dest)
    pub_path = dest.with_name(dest.name + ".pub")
    for p in (dest, pub_path):
        if p.exists():
            raise UsageError(f"{p} exists", where=str(p), expected="a new file",
                             found="an existing file", fix="choose another name (-o)")
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pub_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return dest, pub_path


def sign_artifact(path: str | os.PathLike, key_file: str | os.PathLike) -> str:
    """Add (or replace) the signature of the key in `key_file` to an artifact; its key id.
    The artifact is fully checked first: only what verifies gets signed."""
    from aotc.runtime.artifact import Artifact
    ed25519, serialization, _ = _crypto()
    try:
        key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"cannot read the private key {key_file}", where=str(key_file),
                         expected="a PEM private key written by `aotc keygen`",
                         found=str(e)[:120], fix="pass the private key file (not the .pub)") \
            from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError("the signing key is not an Ed25519 key", where=str(key_file),
                         expected="Ed25519", found=type(key).__name__,
                         fix="use a key written by `aotc keygen`")
    art = Artifact(path, signature_policy=False)
    try:
        existing = read_signatures(art)
        raw = public_key_bytes(key.public_key())
        entry = {"algorithm": "ed25519", "key_id": key_id(raw),
                 "public_key": base64.b64encode(raw).decode(),
                 "signature": base64.b64encode(key.sign(art.manifest_bytes)).decode()}
        sigs = [s for s in existing if s["key_id"] != entry["key_id"]]
        sigs = [dict(s, algorithm="ed25519") for s in sigs] + [entry]
        doc = json.dumps({"format": 1, "signatures": sigs}, indent=1,
                         sort_keys=True).encode() + b"\n"
        if art.package is not None:   # a package is rewritten whole, with the new member
            from aotc.runtime.package import write_package
            write_package(art, art.root, signatures=doc)
            return entry["key_id"]
        tmp = art.root / f".{fmt.SIGNATURES}.tmp-{os.getpid()}"
        tmp.write_bytes(doc)
        os.replace(tmp, art.root / fmt.SIGNATURES)
    finally:
        art.close()
    return entry["key_id"]
