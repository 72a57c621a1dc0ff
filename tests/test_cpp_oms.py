"""OpenSSF Model Signing bundles (model.sig) in the C++ front end (runtime/cpp/frontend/oms.cpp,
keys.cpp), held against Python's artifact/oms.py on the same artifacts: EC keys accepted as
trusted keys, a bundle aotc signed accepted with its key and refused with another, and a
tampered, extra or missing file, another artifact's bundle, a corrupted signature or a malformed
bundle refused by both front ends with the same error (class, what, where; the same text where
both can say the same). The certificate method likewise; packages carry the bundle; an
artifact signed both ways verifies when either signature does. The tool is tests/cpp/signing's
(conftest.py)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import aotc
from aotc import errors
from aotc.errors import AotcError
from aotc.artifact import format as fmt
from aotc.artifact.package import pack
from aotc.artifact.schema import rules
from aotc.artifact.signing import generate_keys, sign_artifact
from hostile import copy_artifact, edit_json

pytest.importorskip("cryptography")
pytest.importorskip("model_signing")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


@pytest.fixture
def keys(tmp_path):
    """((private, public) of the producer, (private, public) of another), EC P-256."""
    return generate_keys(tmp_path / "producer"), generate_keys(tmp_path / "other")


@pytest.fixture
def signed(mlp_artifact, tmp_path, keys) -> Path:
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, keys[0][0])
    return art


def py_outcome(art: Path, trusted=()) -> str:
    try:
        m = aotc.load(art, trusted_keys=list(trusted) or None)
        return f"signer {m.signer or ''}"
    except AotcError as e:
        return f"{type(e).__name__}: {e}"


def cpp_outcome(tool: Path, art: Path, trusted=()) -> str:
    env = {k: v for k, v in os.environ.items() if k != "AOTC_TRUSTED_KEYS"}
    done = subprocess.run([str(tool), "load", str(art), *map(str, trusted)], capture_output=True,
                          text=True, timeout=300, env=env)
    if done.returncode == 0:
        return done.stdout.rstrip("\n")
    out = done.stderr.rstrip("\n")
    assert done.returncode == getattr(errors, out.split(":")[0]).exit_code, out
    return out


def verdict(outcome: str) -> tuple[str, str]:
    """An outcome's class and message, and where it points."""
    lines = outcome.splitlines()
    return lines[0], next((x for x in lines if x.startswith("  where: ")), "")


def same(tool: Path, art: Path, trusted=(), exact=True) -> str:
    want, got = py_outcome(art, trusted), cpp_outcome(tool, art, trusted)
    assert (got == want) if exact else (verdict(got) == verdict(want)), (want, got)
    return want


def test_an_oms_signed_artifact_loads_with_its_key_and_only_with_it(cpp_signing_tool, signed,
                                                                     keys):
    (_, pub), (_, other) = keys
    ok = same(cpp_signing_tool, signed, [pub])
    assert ok.startswith("signer OMS key ")
    assert same(cpp_signing_tool, signed, [pub.read_text()]) == ok        # PEM text
    assert same(cpp_signing_tool, signed, [other, pub]) == ok
    refused = same(cpp_signing_tool, signed, [other])
    assert refused.startswith(f"ArtifactError: {rules.OMS_UNTRUSTED['what']}")
    assert "Key mismatch" in refused
    assert same(cpp_signing_tool, signed) == "signer "            # nothing trusted: not required


def _tamper(art, other):
    edit_json(art, fmt.plan_file("forward"), lambda p: p["stats"].update(evil=True))


def _extra(art, other):
    (art / "extra.txt").write_text("not signed")
    (art / "sub").mkdir()
    (art / "sub" / "deeper.bin").write_bytes(b"x")
    (art / ".git").mkdir()                       # git's own files are never signed
    (art / ".git" / "HEAD").write_text("ref")


def _missing(art, other):
    (art / fmt.SAMPLE_REFERENCE).unlink()
    edit_json(art, fmt.MANIFEST, lambda m: m["files"].pop(fmt.SAMPLE_REFERENCE) and None)


def _another(art, other):
    another = copy_artifact(art, art.parent / "another.aotc")
    edit_json(another, fmt.MANIFEST, lambda m: m["model"].update(name="another"))
    sign_artifact(another, other[0])
    shutil.copy(another / fmt.OMS_SIGNATURE, art / fmt.OMS_SIGNATURE)


def _bundle_edit(edit):
    def change(art, other):
        doc = json.loads((art / fmt.OMS_SIGNATURE).read_text())
        edit(doc)
        (art / fmt.OMS_SIGNATURE).write_text(json.dumps(doc))
    return change


def _flip_signature(doc):
    env = doc["dsseEnvelope"]
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[len(sig) // 2] ^= 4
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()


def _edit_payload(doc):   # a statement changed under its signature
    env = doc["dsseEnvelope"]
    st = json.loads(base64.b64decode(env["payload"]))
    st["predicate"]["resources"] = st["predicate"]["resources"][1:]
    env["payload"] = base64.b64encode(json.dumps(st).encode()).decode()


CHANGES = {   # what changed -> the template of both refusals (the key: the producer's)
    "tampered file": (_tamper, rules.OMS_NOT_EXACT),
    "extra file": (_extra, rules.OMS_NOT_EXACT),
    "missing file": (_missing, rules.OMS_NOT_EXACT),
    "another artifact's bundle": (_another, rules.OMS_UNTRUSTED),
    "corrupted signature": (_bundle_edit(_flip_signature), rules.OMS_UNTRUSTED),
    "statement changed": (_bundle_edit(_edit_payload), rules.OMS_UNTRUSTED),
    "no hint": (_bundle_edit(lambda d: d["verificationMaterial"]["publicKey"].pop("hint")),
                None),
}


@pytest.mark.parametrize("kind", list(CHANGES))
def test_changes_are_refused_as_python_refuses_them(cpp_signing_tool, signed, keys, kind):
    change, template = CHANGES[kind]
    change(signed, keys[1])
    out = same(cpp_signing_tool, signed, [keys[0][1]])
    if template is None:
        assert out.startswith("signer OMS key "), out
    else:
        assert out.startswith(f"ArtifactError: {template['what']}"), out


def test_another_artifacts_bundle_by_the_same_key_is_refused(cpp_signing_tool, signed, keys,
                                                             mlp_artifact, tmp_path):
    another = copy_artifact(mlp_artifact, tmp_path / "b.aotc")
    edit_json(another, fmt.MANIFEST, lambda m: m["model"].update(name="another"))
    sign_artifact(another, keys[0][0])
    shutil.copy(another / fmt.OMS_SIGNATURE, signed / fmt.OMS_SIGNATURE)
    out = same(cpp_signing_tool, signed, [keys[0][1]])
    assert "found: hash differs from the signed one: manifest.json\n" in out


MALFORMED = {
    "not json": "not json",
    "media type a number": '{"mediaType": 1}',
    "empty": "{}",
    "unknown field": lambda d: d.update(comment="x"),
    "two key materials": lambda d: d["verificationMaterial"].update(
        certificate={"rawBytes": "AAAA"}),
    "payload not base64": lambda d: d["dsseEnvelope"].update(payload="AAA"),
    "signatures not a list": lambda d: d["dsseEnvelope"].update(signatures={}),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_bundle_is_refused_by_both(cpp_signing_tool, signed, keys, kind):
    junk, path = MALFORMED[kind], signed / fmt.OMS_SIGNATURE
    if callable(junk):
        doc = json.loads(path.read_text())
        junk(doc)
        junk = json.dumps(doc)
    path.write_text(junk)
    out = same(cpp_signing_tool, signed, [keys[0][1]], exact=False)
    assert out.startswith(f"ArtifactError: {rules.OMS_MALFORMED['what']}"), out


def test_a_keyless_bundle_is_refused_by_both(cpp_signing_tool, signed, keys):
    path = signed / fmt.OMS_SIGNATURE
    doc = json.loads(path.read_text())
    doc["verificationMaterial"]["tlogEntries"] = [{
        "logIndex": "1", "logId": {"keyId": "AAAA"}, "canonicalizedBody": "AAAA",
        "kindVersion": {"kind": "dsse", "version": "0.0.1"},
        "inclusionProof": {"logIndex": "1", "rootHash": "AAAA", "treeSize": "2", "hashes": []}}]
    path.write_text(json.dumps(doc))
    out = same(cpp_signing_tool, signed, [keys[0][1]])
    assert out.startswith(f"ArtifactError: {rules.OMS_KEYLESS['what']}"), out


def test_packages_carry_the_bundle(cpp_signing_tool, signed, mlp_artifact, keys, tmp_path):
    (priv, pub), (_, other) = keys
    pkg = pack(signed, tmp_path / "a.aotcpkg")
    assert same(cpp_signing_tool, pkg, [pub]).startswith("signer OMS key ")
    assert f"{pkg}:{fmt.OMS_SIGNATURE}" in same(cpp_signing_tool, pkg, [other])
    plain = pack(mlp_artifact, tmp_path / "b.aotcpkg")
    sign_artifact(plain, priv)                              # signing a package adds the member
    assert same(cpp_signing_tool, plain, [pub]).startswith("signer OMS key ")
    assert same(cpp_signing_tool, plain) == "signer "


def test_either_signature_by_a_trusted_key_verifies(cpp_signing_tool, signed, keys, tmp_path):
    (_, pub), (_, other) = keys
    old_priv, old_pub = generate_keys(tmp_path / "old", "ed25519")
    old_id = sign_artifact(signed, old_priv)
    assert same(cpp_signing_tool, signed, [old_pub]) == f"signer {old_id}"
    assert same(cpp_signing_tool, signed, [pub, old_pub]).startswith("signer OMS key ")
    _bundle_edit(_flip_signature)(signed, None)            # model.sig no longer verifies
    assert same(cpp_signing_tool, signed, [pub, old_pub]) == f"signer {old_id}"
    assert same(cpp_signing_tool, signed, [pub]).startswith(
        f"ArtifactError: {rules.OMS_UNTRUSTED['what']}")
    (signed / fmt.OMS_SIGNATURE).unlink()                   # only signatures.json is left
    out = same(cpp_signing_tool, signed, [other])
    assert "found: only signatures.json, which no trusted key of its kind can check" in out


def test_keys_of_other_curves(cpp_signing_tool, mlp_artifact, tmp_path):
    """P-384 signs with SHA-384 (model_signing's rule); a curve OMS does not take (secp256k1)
    is no key of the key method, and the same UsageError in both front ends."""
    key = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "k384").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    pub = tmp_path / "k384.pub"
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, tmp_path / "k384")
    assert same(cpp_signing_tool, art, [pub]).startswith("signer OMS key ")
    k1 = ec.generate_private_key(ec.SECP256K1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    for out in (py_outcome(art, [k1]), cpp_outcome(cpp_signing_tool, art, [k1])):
        assert out.startswith("UsageError: the trusted key is not an Ed25519 key"), out


def _certificates(tmp_path: Path, signing: bool = True):
    """(CA certificate file, signing key file, signing certificate file); `signing`: the signing
    certificate allows digital signatures."""
    from test_oms import _cert, _write
    ca_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    ca = _cert("aotc test CA", ca_key, ca_key, ca=True)
    leaf = _cert("aotc test signer", ca_key, leaf_key, issuer=ca.subject)
    if not signing:   # the CA signs a certificate that may only sign certificates
        leaf = _cert("aotc test signer", ca_key, leaf_key, issuer=ca.subject, ca=True)
    (tmp_path / "leaf.key").write_bytes(leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return (_write(tmp_path / "ca.pem", ca), tmp_path / "leaf.key",
            _write(tmp_path / "leaf.pem", leaf))


def test_the_certificate_method(cpp_signing_tool, mlp_artifact, keys, tmp_path):
    ca, key, leaf = _certificates(tmp_path)
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, key, certificate=leaf, chain=[ca])
    ok = same(cpp_signing_tool, art, [ca])
    assert ok == "signer OMS certificate CN=aotc test signer", ok
    assert same(cpp_signing_tool, art, [keys[0][1], ca]) == ok     # a key: key bundles only
    refused = same(cpp_signing_tool, art, [keys[0][1]])
    assert "certificate method, and no trusted key of that kind" in refused
    (tmp_path / "another_ca").mkdir()
    other, _, _ = _certificates(tmp_path / "another_ca")
    out = same(cpp_signing_tool, art, [other], exact=False)         # OpenSSL's words differ
    assert out.startswith(f"ArtifactError: {rules.OMS_UNTRUSTED['what']}"), out
    _extra(art, None)
    assert same(cpp_signing_tool, art, [ca]).startswith(
        f"ArtifactError: {rules.OMS_NOT_EXACT['what']}")
    pkg = pack(copy_artifact(mlp_artifact, tmp_path / "b.aotc"), tmp_path / "b.aotcpkg")
    sign_artifact(pkg, key, certificate=leaf, chain=[ca])
    assert same(cpp_signing_tool, pkg, [ca]) == ok


def test_a_certificate_that_may_not_sign_is_refused(cpp_signing_tool, mlp_artifact, tmp_path):
    ca, key, leaf = _certificates(tmp_path, signing=False)
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, key, certificate=leaf, chain=[ca])
    out = same(cpp_signing_tool, art, [ca])
    assert "Signing certificate cannot be used for signing" in out, out


def test_the_format_23_fixture_verifies_in_both(cpp_signing_tool):
    fixtures = Path(__file__).parent / "fixtures"
    art, pub = fixtures / "format_v23_signed.aotc", fixtures / "format_v23_signed.pub"
    assert same(cpp_signing_tool, art, [pub]).startswith("signer OMS key ")


def test_what_model_signing_signs_loads_or_is_refused_alike(cpp_signing_tool, mlp_artifact,
                                                            tmp_path, keys):
    """A bundle `model_signing` wrote over the folder loads in both; one hashed by shards is
    refused by both, as hashed in a way aotc does not check."""
    import model_signing
    (priv, pub), _ = keys
    config = model_signing.hashing.Config
    for name, hashing in (
            ("files", config().set_ignored_paths(paths=[fmt.OMS_SIGNATURE])),
            ("shards", config().use_shard_serialization(ignore_paths=[fmt.OMS_SIGNATURE]))):
        art = copy_artifact(mlp_artifact, tmp_path / f"{name}.aotc")
        model_signing.signing.Config().use_elliptic_key_signer(private_key=priv) \
            .set_hashing_config(hashing).sign(art, art / fmt.OMS_SIGNATURE)
        out = same(cpp_signing_tool, art, [pub])
        assert out.startswith("signer OMS key " if name == "files" else
                              f"ArtifactError: {rules.OMS_HASHING['what']}"), out
