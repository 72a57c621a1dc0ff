"""Trust policies: the keys and certificates a load requires a signature by (runtime stage).

In: `trusted_keys` as given to `aotc.load` (None, one key, or a list of keys) and the files and
folders named in AOTC_TRUSTED_KEYS. Out: a `Policy` (None when neither names anything: no
signature required) holding typed anchors: Ed25519 public keys (signatures.json,
artifact/signing.py), elliptic-curve public keys and CA certificates (OMS bundles, model.sig,
artifact/oms.py). A policy that names keys but yields none (an empty list, a folder without key
files, AOTC_TRUSTED_KEYS=":") refuses every load (fail closed), and key material is never
echoed in an error (a private key passed by mistake stays out of logs).
"""
from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from aotc.errors import ArtifactError, UsageError
from aotc.artifact.schema.rules import NO_USABLE_KEY, PRIVATE_KEY

ENV = "AOTC_TRUSTED_KEYS"
KEY_SUFFIXES = (".pub", ".pem", ".crt")
EC_CURVES = ("secp256r1", "secp384r1", "secp521r1")     # the curves OMS's key method takes


@dataclass(frozen=True, slots=True, kw_only=True)
class Anchor:
    """One trusted key or certificate. kind: 'ed25519' (raw: the 32 key bytes), 'ec' (raw: the
    public key's PEM, SubjectPublicKeyInfo) or 'certificate' (raw: the certificate's PEM)."""
    kind: str
    raw: bytes
    key_id: str


@dataclass(frozen=True, slots=True)
class Policy:
    anchors: tuple[Anchor, ...]

    def of(self, *kinds: str) -> tuple[Anchor, ...]:
        return tuple(a for a in self.anchors if a.kind in kinds)


def key_id(raw: bytes) -> str:
    """A key's id: the first 16 hex digits of sha256 of its bytes (Ed25519: the 32 raw bytes;
    EC: the PEM SubjectPublicKeyInfo, whose full sha256 is OMS's key hint)."""
    return hashlib.sha256(raw).hexdigest()[:16]


def crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    except ImportError:
        raise UsageError("signatures need the cryptography package", where="aotc signing",
                         expected="cryptography installed", found="not installed",
                         fix="pip install 'aotc[sign]' (or pip install cryptography)") from None
    return ed25519, ec, serialization, x509


def policy(trusted_keys) -> Policy | None:
    """The trust policy of a load (see the module doc); None when nothing is named."""
    env = os.environ.get(ENV, "")
    if trusted_keys is None and not env:
        return None
    if isinstance(trusted_keys, (str, bytes, os.PathLike)) or _is_key_object(trusted_keys):
        trusted_keys = [trusted_keys]     # one key given alone
    named = list(trusted_keys or []) + (_from_env(env) if env else [])
    anchors = tuple(a for k in named for a in anchors_of(k))
    if not anchors:
        raise ArtifactError(**NO_USABLE_KEY)      # one template for both front ends
    return Policy(anchors)


def _from_env(value: str) -> list[Path]:
    """Key files named by AOTC_TRUSTED_KEYS: files, or folders of *.pub / *.pem / *.crt."""
    keys = []
    for part in filter(None, value.split(os.pathsep)):
        p = Path(part)
        if p.is_dir():
            keys += sorted(q for q in p.iterdir() if q.suffix in KEY_SUFFIXES and q.is_file())
        elif p.is_file():
            keys.append(p)
        else:
            raise UsageError(f"{ENV} names {part!r}, which is no key file or directory",
                             where=ENV, expected="key files or directories", found=part,
                             fix=f"fix {ENV} (entries separated by {os.pathsep!r})")
    return keys


def _is_key_object(key) -> bool:
    if key is None or isinstance(key, (list, tuple, set, frozenset)):
        return False
    ed25519, ec, _, x509 = crypto()
    return isinstance(key, (ed25519.Ed25519PublicKey, ec.EllipticCurvePublicKey,
                            x509.Certificate))


def anchors_of(key) -> list[Anchor]:
    """The anchors one trusted key stands for: a key or certificate object, PEM text or bytes
    (a public key, or one or more certificates), a path to such a file, or an Ed25519 key in
    any form public_key_bytes reads."""
    ed25519, ec, serialization, x509 = crypto()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return [_ec_anchor(key)]
    if isinstance(key, x509.Certificate):
        pem = key.public_bytes(serialization.Encoding.PEM)
        return [Anchor(kind="certificate", raw=pem, key_id=_subject(key))]
    text = key
    if isinstance(key, (str, os.PathLike)) and not str(key).startswith("-----") \
            and Path(key).is_file():
        text = Path(key).read_bytes()
    if isinstance(text, str):
        text = text.encode()
    label = _pem_label(text) if isinstance(text, bytes) else None
    if label == "CERTIFICATE":
        try:
            return [anchors_of(c)[0] for c in x509.load_pem_x509_certificates(text)]
        except ValueError:
            _not_a_key(key)
    if label == "PUBLIC KEY":
        try:
            loaded = serialization.load_pem_public_key(text)
        except Exception:     # not readable: public_key_bytes says why, as C++ does
            loaded = None
        if isinstance(loaded, ec.EllipticCurvePublicKey) and loaded.curve.name in EC_CURVES:
            return [_ec_anchor(loaded)]
    raw = public_key_bytes(key)
    return [Anchor(kind="ed25519", raw=raw, key_id=key_id(raw))]


def _pem_label(data: bytes) -> str | None:
    """The label of the first PEM block in `data` (as cryptography finds it), else None."""
    at = data.find(b"-----BEGIN ")
    end = data.find(b"-----", at + 11) if at >= 0 else -1
    return data[at + 11:end].decode("ascii", "replace") if end >= 0 else None


def _refuse_private(data: bytes) -> None:
    label = _pem_label(data) or ""
    if "PRIVATE KEY" in label:
        raise UsageError(**PRIVATE_KEY)           # never echoing the key (both front ends)


def public_key_bytes(key) -> bytes:
    """The 32 raw bytes of an Ed25519 public key given as raw bytes, base64 text, PEM text or
    bytes, a path to a PEM or base64 file, or a cryptography key object (the rules the C++
    front end's keys.cpp mirrors; a private key is refused without being shown)."""
    ed25519, _, serialization, _ = crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if isinstance(key, (str, os.PathLike)) and not str(key).startswith("-----") \
            and Path(key).is_file():
        key = Path(key).read_bytes()
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, bytes):
        _refuse_private(key)
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


def _ec_anchor(key) -> Anchor:
    _, _, serialization, _ = crypto()
    pem = key.public_bytes(serialization.Encoding.PEM,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return Anchor(kind="ec", raw=pem, key_id=key_id(pem))


def _subject(cert) -> str:
    return cert.subject.rfc4514_string()[:200] or "an unnamed certificate"


def _not_a_key(key) -> NoReturn:
    raise UsageError("a trusted key is not an Ed25519 public key", where="trusted_keys",
                     expected="a PEM public key, its file, or 32 raw bytes (base64)",
                     found=repr(key)[:60], fix="use the .pub file `aotc keygen` wrote")
