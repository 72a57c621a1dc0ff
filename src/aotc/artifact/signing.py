"""Signed artifacts (runtime stage): the trust check a load makes, and `aotc sign`.

Two signature formats sit at an artifact's root, neither listed in its manifest: model.sig, an
OpenSSF Model Signing bundle over every file (artifact/oms.py; EC keys or certificates, the
format `aotc sign` writes with the key `aotc keygen` makes), and the older signatures.json,
Ed25519 signatures over manifest.json's exact bytes (which hash every other file). Loading with
a trust policy (`aotc.load(path, trusted_keys=...)`, AOTC_TRUSTED_KEYS, `--trusted-key`;
artifact/trust.py) requires a valid signature by one of its keys, in either format, before
anything else is read; a policy that yields no key refuses every load. Without a policy no
signature is required, and `aotc inspect` says who signed and whether it verifies. Signing
needs the optional extra `aotc[sign]` (cryptography, model-signing).

    signatures.json: {"format": 1, "signatures": [{"algorithm": "ed25519", "key_id": <hex16>,
                      "public_key": <base64 of the 32 raw bytes>, "signature": <base64>}]}
"""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact import oms
from aotc.artifact.trust import EC_CURVES, crypto, key_id, policy, public_key_bytes

MAX_SIGNATURES = 64
MAX_SIGNATURE_FILE = 1 << 20
_SIGN_FIX = "sign it with a trusted key (`aotc sign ART --key KEY`), or load it from the " \
    "producer you trust"


def _crypto():
    ed25519, _, serialization, _ = crypto()
    from cryptography.exceptions import InvalidSignature
    return ed25519, serialization, InvalidSignature


def read_signatures(artifact) -> list[dict]:
    """The signatures beside the manifest, checked for form (not yet verified)."""
    from aotc.artifact.schema.fields import load_json
    data = artifact._read_file(fmt.SIGNATURES, MAX_SIGNATURE_FILE, optional=True)
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
    """Who signed the artifact among the trusted keys (an Ed25519 key id, or 'OMS key ID' /
    'OMS certificate SUBJECT'); None when the load names no trust policy (no signature
    required). ArtifactError when a policy is named and no signature by a trusted key covers
    the artifact, or when the policy yields no key at all (artifact/trust.py: fail closed)."""
    trust = policy(trusted_keys)
    if trust is None:
        return None
    refusals = []
    if trust.of("ec", "certificate"):
        bundle = oms.read_bundle(artifact)
        if bundle is not None:
            try:
                signer = oms.verify(artifact, bundle, trust.of("ec", "certificate"))
                return f"OMS {signer.method} {signer.id}"
            except ArtifactError as e:
                refusals.append(e)
    if trust.of("ed25519"):
        found = _ed25519_signer(artifact, {a.key_id for a in trust.of("ed25519")})
        if not isinstance(found, ArtifactError):
            return found
        refusals.append(found)
    if refusals:
        raise refusals[0]
    present = [n for n in (fmt.OMS_SIGNATURE, fmt.SIGNATURES)
               if artifact._read_file(n, MAX_SIGNATURE_FILE, optional=True) is not None]
    raise ArtifactError("the artifact is not signed by a trusted key",
                        where=artifact.where(present[0] if present else fmt.MANIFEST),
                        expected="a signature by one of "
                                 f"{[f'{a.kind} {a.key_id}' for a in trust.anchors]}",
                        found=("only " + " and ".join(present) + ", which no trusted key of "
                               "its kind can check") if present else "no signature",
                        fix=_SIGN_FIX)


def _ed25519_signer(artifact, trusted: set[str]):
    """A trusted Ed25519 key id that signed signatures.json, or the ArtifactError saying why
    none did."""
    signatures = read_signatures(artifact)
    valid = {k for k, ok in verified_signers(artifact, signatures).items() if ok}
    good = sorted(valid & trusted)
    if good:
        return good[0]
    found = ("no signature" if not signatures else
             f"signatures by {sorted(s['key_id'] for s in signatures)}"
             + ("" if valid >= {s["key_id"] for s in signatures} else " (some do not verify)"))
    return ArtifactError("the artifact is not signed by a trusted key",
                         where=artifact.where(fmt.SIGNATURES),
                         expected=f"a valid signature by one of {sorted(trusted)}", found=found,
                         fix=_SIGN_FIX)


# ------------------------------------------------------------------------------ producing
KEY_KINDS = ("p256", "ed25519")    # OMS (model.sig); the older signatures.json


def generate_keys(dest: str | os.PathLike, kind: str = "p256") -> tuple[Path, Path]:
    """Write a new key pair: `dest` (private, PKCS#8 PEM, 0600) and `dest`.pub. kind 'p256':
    an EC P-256 key, signing OMS bundles (model.sig); 'ed25519': the older signatures.json."""
    ed25519, ec, serialization, _ = crypto()
    if kind not in KEY_KINDS:
        raise UsageError(f"unknown key kind {kind!r}", where="aotc keygen --kind",
                         expected=list(KEY_KINDS), found=repr(kind)[:40], fix="use p256")
    dest = Path(dest)
    pub_path = dest.with_name(dest.name + ".pub")
    for p in (dest, pub_path):
        if p.exists():
            raise UsageError(f"{p} exists", where=str(p), expected="a new file",
                             found="an existing file", fix="choose another name (-o)")
    key = ec.generate_private_key(ec.SECP256R1()) if kind == "p256" else \
        ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pub_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return dest, pub_path


def sign_artifact(path: str | os.PathLike, key_file: str | os.PathLike, *,
                  certificate=None, chain=()) -> str:
    """Sign an artifact with the private key in `key_file`; who signed (as check_signature
    names it). An EC key writes an OMS bundle, model.sig (with `certificate` and its `chain`:
    OMS's certificate method); an Ed25519 key adds or replaces its entry in signatures.json.
    The artifact is fully checked first: only what verifies gets signed."""
    from aotc.artifact.reader import Artifact
    key = _private_key(key_file)
    ed25519, ec, _, _ = crypto()
    if certificate is not None and not isinstance(key, ec.EllipticCurvePrivateKey):
        raise UsageError("a certificate signs with an EC key", where=str(key_file),
                         expected="an EC private key", found=type(key).__name__,
                         fix="pass the certificate's EC private key")
    art = Artifact(path, signature_policy=False)
    try:
        art.verify_all()
        if isinstance(key, ed25519.Ed25519PrivateKey):
            name, doc, who = fmt.SIGNATURES, *_ed25519_document(art, key)
        else:
            data, signer = oms.sign(art, key_file, certificate, chain)
            name, doc, who = fmt.OMS_SIGNATURE, data, f"OMS {signer.method} {signer.id}"
        if art.package is not None:   # a package is rewritten whole, with the new member
            from aotc.artifact.package import write_package
            write_package(art, art.root, replace={name: doc})
        else:
            tmp = art.root / f".{name}.tmp-{os.getpid()}"
            tmp.write_bytes(doc)
            os.replace(tmp, art.root / name)
    finally:
        art.close()
    return who


def _private_key(key_file):
    ed25519, ec, serialization, _ = crypto()
    try:
        key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"cannot read the private key {key_file}", where=str(key_file),
                         expected="an unencrypted PEM private key written by `aotc keygen`",
                         found=str(e).splitlines()[0][:120] if str(e) else type(e).__name__,
                         fix="pass the private key file (not the .pub)") from None
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in EC_CURVES or \
            isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    raise UsageError("the signing key is of a kind aotc does not sign with", where=str(key_file),
                     expected=f"an EC key on {'/'.join(EC_CURVES)} (OMS) or Ed25519",
                     found=getattr(getattr(key, "curve", None), "name", type(key).__name__),
                     fix="use a key written by `aotc keygen`")


def _ed25519_document(art, key) -> tuple[bytes, str]:
    """signatures.json with `key`'s signature over the manifest added or replaced; its id."""
    existing = read_signatures(art)
    raw = public_key_bytes(key.public_key())
    entry = {"algorithm": "ed25519", "key_id": key_id(raw),
             "public_key": base64.b64encode(raw).decode(),
             "signature": base64.b64encode(key.sign(art.manifest_bytes)).decode()}
    sigs = [dict(s, algorithm="ed25519") for s in existing if s["key_id"] != entry["key_id"]]
    doc = json.dumps({"format": 1, "signatures": sigs + [entry]}, indent=1, sort_keys=True)
    return doc.encode() + b"\n", entry["key_id"]
