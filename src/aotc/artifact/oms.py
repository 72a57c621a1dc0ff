"""OpenSSF Model Signing (OMS) bundles for artifacts: model.sig, read and written with the
`model-signing` library (runtime stage; the optional extra `aotc[sign]`).

model.sig is a Sigstore bundle holding a DSSE envelope over an in-toto statement whose resources
are every file of the artifact with its sha256: manifest.json and each file the manifest lists,
nothing else. The two signature files, model.sig and signatures.json, are not signed (the
statement records them as ignored paths, so `model_signing verify` skips them too), nor are
git's own files, which OMS always skips. Signing (`sign`) builds that statement from the bytes
aotc has verified (a package is signed as its directory would be); verifying (`verify`) checks
the envelope with the library against each trusted EC key (key method) or CA certificate
(certificate method), then requires the statement to list exactly the artifact's files with
their digests: a tampered, extra or missing file, another artifact's statement or another key
is an ArtifactError naming what differs. Keyless Sigstore bundles need the network (Rekor,
Fulcio) and are refused as such.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.schema import rules
from aotc.artifact.schema.rules import MAX_BUNDLE, MAX_OMS_RESOURCES, fill
from aotc.artifact.trust import Anchor, crypto, key_id

GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")   # OMS never signs these
IGNORED = (fmt.OMS_SIGNATURE, fmt.SIGNATURES) + GIT_PATHS


@dataclass(frozen=True, slots=True, kw_only=True)
class Signer:
    """Who signed model.sig: method 'key' (id: the key's id, OMS's hint) or 'certificate'
    (id: the signing certificate's subject)."""
    method: str
    id: str


def lib():
    try:
        from model_signing import manifest as mf
        from model_signing._hashing.hashing import Digest
        from model_signing._signing import sign_certificate, sign_ec_key, signing
        from model_signing._signing import sign_sigstore_pb as pb
    except ImportError:
        raise UsageError("OMS signatures need the model-signing package", where="aotc signing",
                         expected="model-signing installed", found="not installed",
                         fix="pip install 'aotc[sign]'") from None
    return mf, Digest, signing, pb, sign_ec_key, sign_certificate


def read_bundle(art) -> bytes | None:
    return art._read_file(fmt.OMS_SIGNATURE, MAX_BUNDLE, optional=True)


# ------------------------------------------------------------------------------- the statement
def artifact_digests(art) -> dict[str, str]:
    """name -> sha256 of every file an OMS statement of the artifact covers. A listed file's
    digest is the manifest's (checked against its bytes when they are used); a weights shard,
    which the manifest hashes by chunks, is hashed whole here."""
    out = {fmt.MANIFEST: hashlib.sha256(art.manifest_bytes).hexdigest()}
    for rel, entry in art.manifest.files.items():
        out[rel] = entry.sha256 if entry.sha256 is not None else _whole_sha256(art, rel)
    return out


def _whole_sha256(art, rel: str) -> str:
    data, _ = art.mapping(rel)
    try:
        return hashlib.sha256(data).hexdigest()
    finally:
        if hasattr(data, "close"):
            data.close()


def statement_diff(signed: dict[str, str], actual: dict[str, str]) -> list[str]:
    """What differs between a statement's files and the artifact's, one phrase per kind."""
    out = []
    for label, names in (
            ("hash differs from the signed one", [n for n in sorted(set(signed) & set(actual))
                                                  if signed[n] != actual[n]]),
            ("not covered by the signature (extra)", sorted(set(actual) - set(signed))),
            ("signed but missing from the artifact", sorted(set(signed) - set(actual)))):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                            else "")
            out.append(f"{label}: {shown}")
    return out


def unlisted_files(art) -> list[str]:
    """Files of an artifact directory that neither the manifest lists nor OMS ignores (a
    package's members are checked when it is opened)."""
    if art.package is not None:
        return []
    root, out = str(art.root), []
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        if rel_top == ".":
            dirs[:] = [d for d in dirs if d not in GIT_PATHS]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            if rel not in art.manifest.files and rel != fmt.MANIFEST and \
                    not (rel_top == "." and name in IGNORED):
                out.append(rel)
    return sorted(out)


# ----------------------------------------------------------------------------------- verifying
def verify(art, data: bytes, anchors: tuple[Anchor, ...]) -> Signer:
    """The signer of bundle `data` among `anchors` (EC keys, certificates), after the statement
    was checked to cover exactly the artifact; ArtifactError otherwise (see the module doc)."""
    where = art.where(fmt.OMS_SIGNATURE)
    manifest, signer, failures = None, None, []
    with tempfile.TemporaryDirectory(prefix="aotc-oms-") as tmp:
        signature = _read_signature(data, Path(tmp), where)
        kind = _method(signature.bundle)     # each anchor checks bundles of its own method
        if not any(a.kind == kind for a in anchors):
            failures.append(f"a bundle of the {'key' if kind == 'ec' else kind} method, "
                            "and no trusted key of that kind")
        for anchor in (a for a in anchors if a.kind == kind):
            try:
                manifest = _verifier(anchor, Path(tmp)).verify(signature)
            except Exception as e:     # any failure of the library's checks refuses (fail closed)
                failures.append(f"{anchor.key_id}: {_first_line(e)}")
                continue
            signer = _signer_of(anchor, signature)
            break
    if manifest is None:
        raise ArtifactError(**fill(rules.OMS_UNTRUSTED, where=where,
                                   ids=str([a.key_id for a in anchors]),
                                   found="; ".join(failures)[:400]))
    _check_statement(art, manifest, where)
    return signer


def _method(bundle) -> str:
    """The anchor kind that verifies `bundle`: 'certificate' when it carries a chain, else 'ec'."""
    chain = bundle.verification_material.x509_certificate_chain
    return "certificate" if chain is not None and chain.certificates else "ec"


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:100] if text else type(e).__name__


def _check_statement(art, manifest, where: str) -> None:
    args = manifest.serialization_type
    if args.get("method") != "files" or args.get("hash_type") != "sha256":
        raise ArtifactError(**fill(rules.OMS_HASHING, where=where,
                                   found=f"method {args.get('method')!r}, hash_type "
                                         f"{args.get('hash_type')!r}"))
    count = sum(1 for _ in manifest.resource_descriptors())
    if count > MAX_OMS_RESOURCES:
        raise ArtifactError(**fill(rules.OMS_TOO_MANY, where=where, found=f"{count} resources"))
    signed = {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()
              if rd.digest.algorithm == "sha256"}
    if len(signed) != count:
        raise ArtifactError(**fill(rules.OMS_NOT_SHA256, where=where))
    diff = statement_diff(signed, artifact_digests(art))
    extra = unlisted_files(art)
    if extra:
        diff.append("not covered by the signature (extra): " + ", ".join(extra[:5]))
    if diff:
        raise ArtifactError(**fill(rules.OMS_NOT_EXACT, where=where, found="; ".join(diff)[:600]))


def _read_signature(data: bytes, tmp: Path, where: str):
    _, _, _, pb, _, _ = lib()
    path = tmp / fmt.OMS_SIGNATURE
    path.write_bytes(data)
    try:
        signature = pb.Signature.read(path)
    except Exception as e:     # JSON, protobuf or field errors: a malformed bundle
        raise ArtifactError(**fill(rules.OMS_MALFORMED, where=where,
                                   found=f"{type(e).__name__}: {str(e)[:120]}")) from None
    if signature.bundle.verification_material.tlog_entries:
        raise ArtifactError(**fill(rules.OMS_KEYLESS, where=where))
    return signature


def _verifier(anchor: Anchor, tmp: Path):
    _, _, _, _, sign_ec_key, sign_certificate = lib()
    path = tmp / f"{anchor.kind}-{key_id(anchor.raw)}.pem"
    path.write_bytes(anchor.raw)
    if anchor.kind == "ec":
        return sign_ec_key.Verifier(path)
    return sign_certificate.Verifier([path])


def _signer_of(anchor: Anchor, signature) -> Signer:
    if anchor.kind == "ec":
        return Signer(method="key", id=anchor.key_id)
    _, _, _, x509 = crypto()
    chain = signature.bundle.verification_material.x509_certificate_chain.certificates
    leaf = x509.load_der_x509_certificate(chain[0].raw_bytes)
    return Signer(method="certificate", id=leaf.subject.rfc4514_string()[:200])


# ------------------------------------------------------------------------------------- signing
def sign(art, key_file, certificate=None, chain=()) -> tuple[bytes, Signer]:
    """(model.sig's bytes, its signer) for the open, verified artifact `art`, signed with the
    EC private key in `key_file` (with `certificate` and `chain`: the certificate method)."""
    mf, Digest, signing, _, sign_ec_key, sign_certificate = lib()
    extra = unlisted_files(art)
    if extra:
        raise ArtifactError("the artifact folder holds files its manifest does not list",
                            where=str(art.root), expected="only the artifact's own files",
                            found=", ".join(extra[:5]), fix="remove them, then sign again")
    serialization = mf.SerializationType.from_args(
        {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
         "ignore_paths": list(IGNORED)})
    items = [mf.FileManifestItem(path=PurePosixPath(name), digest=Digest("sha256",
                                                                          bytes.fromhex(d)))
             for name, d in sorted(artifact_digests(art).items())]
    manifest = mf.Manifest(art.root.name, items, serialization)
    key_file = Path(key_file)
    if certificate is None:
        signer, who = sign_ec_key.Signer(key_file), Signer(method="key", id=_key_id_of(key_file))
    else:
        signer = sign_certificate.Signer(key_file, Path(certificate), [Path(c) for c in chain])
        _, _, _, x509 = crypto()
        leaf = x509.load_pem_x509_certificate(Path(certificate).read_bytes())
        who = Signer(method="certificate", id=leaf.subject.rfc4514_string()[:200])
    return signer.sign(signing.Payload(manifest)).bundle.to_json().encode(), who


def _key_id_of(key_file: Path) -> str:
    _, _, serialization, _ = crypto()
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    return key_id(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


# ------------------------------------------------------------------------------------ inspect
def describe(art, data: bytes, anchors: tuple[Anchor, ...]) -> str:
    """One line for `aotc inspect`: the method, the signer, and whether the signature verifies
    (with `anchors`: against them; without: the statement is checked against the artifact and
    the signature is said to be unchecked, since a key bundle carries only its key's hint)."""
    if anchors:
        try:
            signer = verify(art, data, anchors)
            return f"OMS {signer.method} method, by {signer.id} (valid)"
        except ArtifactError as e:
            return f"OMS (model.sig): INVALID: {e.what}: {e.found}"
    with tempfile.TemporaryDirectory(prefix="aotc-oms-") as tmp:
        try:
            bundle = _read_signature(data, Path(tmp), art.where(fmt.OMS_SIGNATURE)).bundle
            manifest = _unverified_manifest(bundle)
            _check_statement(art, manifest, art.where(fmt.OMS_SIGNATURE))
        except ArtifactError as e:
            return f"OMS (model.sig): INVALID: {e.what}: {e.found}"
        except Exception as e:     # a statement the library cannot read
            return f"OMS (model.sig): INVALID: {type(e).__name__}: {str(e)[:100]}"
    material = bundle.verification_material
    if _method(bundle) == "certificate":
        _, _, _, x509 = crypto()
        leaf = x509.load_der_x509_certificate(
            material.x509_certificate_chain.certificates[0].raw_bytes)
        who = f"certificate method, by {leaf.subject.rfc4514_string()[:200]}"
    else:
        who = f"key method, by key {(material.public_key.hint or '?')[:16]}"
    return (f"OMS {who} (covers every file; signature not checked: pass --trusted-key "
            "with the public key or CA certificate)")


def _unverified_manifest(bundle):
    import base64
    import json
    _, _, signing, _, _, _ = lib()
    return signing.dsse_payload_to_manifest(json.loads(base64.b64decode(
        bundle.dsse_envelope.payload) if isinstance(bundle.dsse_envelope.payload, str)
        else bundle.dsse_envelope.payload))
