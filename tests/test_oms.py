"""OpenSSF Model Signing (model.sig): aotc signs what `model_signing` verifies and loads what
`model_signing` signs; a statement that does not cover exactly the artifact's files and hashes
(a tampered, extra or missing file, another key, another artifact's statement) is refused with a
typed error; packages carry the bundle; trust policies that yield no key fail closed."""
from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import pytest

import aotc
from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.package import pack
from aotc.artifact.signing import generate_keys, sign_artifact
from conftest import run_aotc
from hostile import copy_artifact, edit_json

pytest.importorskip("cryptography")
model_signing = pytest.importorskip("model_signing")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


@pytest.fixture
def keys(tmp_path):
    return generate_keys(tmp_path / "producer"), generate_keys(tmp_path / "other")


@pytest.fixture
def signed(mlp_artifact, tmp_path, keys):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, keys[0][0])
    return art


def oms_verify(art, pub):
    """model_signing's own verification of `art` (its Python API, the key method)."""
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(
        art, art / fmt.OMS_SIGNATURE)


def test_aotc_signs_what_model_signing_verifies(signed, keys):
    (_, pub), (_, other) = keys
    oms_verify(signed, pub)
    with pytest.raises(ValueError, match="Key mismatch"):
        oms_verify(signed, other)
    m = aotc.load(signed, trusted_keys=[pub])
    assert m.signer.startswith("OMS key ")
    m(*m.random_inputs())


def test_model_signing_signs_what_aotc_loads(mlp_artifact, tmp_path, keys):
    (priv, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    hashing = model_signing.hashing.Config().set_ignored_paths(paths=[fmt.OMS_SIGNATURE])
    model_signing.signing.Config().use_elliptic_key_signer(private_key=priv) \
        .set_hashing_config(hashing).sign(art, art / fmt.OMS_SIGNATURE)
    assert aotc.load(art, trusted_keys=pub).signer.startswith("OMS key ")   # one key alone


def _tamper(art):
    edit_json(art, fmt.plan_file("forward"), lambda p: p["stats"].update(evil=True))


def _extra(art):
    (art / "extra.txt").write_text("not signed")


def _missing(art):
    """A listed file removed with its manifest entry: the artifact alone is consistent."""
    (art / fmt.SAMPLE_REFERENCE).unlink()
    edit_json(art, fmt.MANIFEST, lambda m: m["files"].pop(fmt.SAMPLE_REFERENCE) and None)


@pytest.mark.parametrize("change, found", [
    (_tamper, "hash differs from the signed one: manifest.json, plans/forward.json"),
    (_extra, "not covered by the signature (extra): extra.txt"),
    (_missing, "signed but missing from the artifact: samples/reference.safetensors")])
def test_a_statement_that_does_not_match_the_artifact_is_refused(signed, keys, change, found):
    (_, pub), _ = keys
    change(signed)
    with pytest.raises(ArtifactError, match="does not cover exactly") as e:
        aotc.load(signed, trusted_keys=[pub])
    assert found in str(e.value.found)
    with pytest.raises(ValueError):
        oms_verify(signed, pub)           # model_signing agrees


def test_a_file_changed_behind_the_manifest_is_refused(signed, keys):
    (_, pub), _ = keys
    (signed / fmt.WEIGHTS).write_bytes(b"x" * (signed / fmt.WEIGHTS).stat().st_size)
    with pytest.raises(ArtifactError, match=fmt.WEIGHTS):
        aotc.load(signed, trusted_keys=[pub])


def test_another_key_and_another_artifacts_statement_are_refused(mlp_artifact, signed, keys,
                                                                 tmp_path):
    (priv, pub), (_, other) = keys
    with pytest.raises(ArtifactError, match="not by a trusted key") as e:
        aotc.load(signed, trusted_keys=[other])
    assert "Key mismatch" in str(e.value.found)
    another = copy_artifact(mlp_artifact, tmp_path / "b.aotc")    # another artifact, same key
    edit_json(another, fmt.MANIFEST, lambda m: m["model"].update(name="another"))
    sign_artifact(another, priv)
    shutil.copy(another / fmt.OMS_SIGNATURE, signed / fmt.OMS_SIGNATURE)
    with pytest.raises(ArtifactError, match="does not cover exactly") as e:
        aotc.load(signed, trusted_keys=[pub])
    assert str(e.value.found) == "hash differs from the signed one: manifest.json"


def test_a_statement_hashed_another_way_is_refused(mlp_artifact, tmp_path, keys):
    """model_signing may hash by shards; aotc checks whole-file sha256 statements only."""
    (priv, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    hashing = model_signing.hashing.Config().use_shard_serialization(
        ignore_paths=[fmt.OMS_SIGNATURE])
    model_signing.signing.Config().use_elliptic_key_signer(private_key=priv) \
        .set_hashing_config(hashing).sign(art, art / fmt.OMS_SIGNATURE)
    with pytest.raises(ArtifactError, match="in a way aotc does not check") as e:
        aotc.load(art, trusted_keys=[pub])
    assert "method 'shards'" in str(e.value.found)


@pytest.mark.parametrize("junk", ["not json", '{"mediaType": 1}', "{}"])
def test_a_malformed_bundle_is_a_typed_error(signed, keys, junk):
    (_, pub), _ = keys
    (signed / fmt.OMS_SIGNATURE).write_text(junk)
    with pytest.raises(ArtifactError, match="model.sig"):
        aotc.load(signed, trusted_keys=[pub])


def test_trust_policies_that_yield_no_key_fail_closed(signed, keys, tmp_path, monkeypatch):
    (_, pub), _ = keys
    (tmp_path / "empty").mkdir()
    for trusted, env in (([], None), (None, ":"), (None, str(tmp_path / "empty"))):
        if env is None:
            monkeypatch.delenv("AOTC_TRUSTED_KEYS", raising=False)
        else:
            monkeypatch.setenv("AOTC_TRUSTED_KEYS", env)
        with pytest.raises(ArtifactError, match="names no usable key") as e:
            aotc.load(signed, trusted_keys=trusted)
        assert e.value.where == "trusted keys" and e.value.found == "no usable key"
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", ":")
    proc = run_aotc("run", signed, "--runs", "1")
    assert proc.returncode == 5 and "no usable key" in proc.stderr
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(pub.parent))   # the folder of the .pub files
    assert aotc.load(signed).signer.startswith("OMS key ")


def test_a_private_key_is_refused_without_showing_it(signed, keys):
    (priv, _), _ = keys
    body = "".join(priv.read_text().splitlines()[1:-1])
    for given in (priv, priv.read_text(), priv.read_bytes()):
        with pytest.raises(UsageError, match="a private key was given") as e:
            aotc.load(signed, trusted_keys=given)
        assert not any(body[i:i + 8] in str(e.value) for i in range(0, len(body) - 8))


def test_packages_carry_the_bundle(signed, mlp_artifact, keys, tmp_path):
    (priv, pub), (_, other) = keys
    pkg = pack(signed, tmp_path / "a.aotcpkg")
    assert aotc.load(pkg, trusted_keys=[pub]).signer.startswith("OMS key ")
    with pytest.raises(ArtifactError, match="not by a trusted key"):
        aotc.load(pkg, trusted_keys=[other])
    plain = pack(mlp_artifact, tmp_path / "b.aotcpkg")
    sign_artifact(plain, priv)                              # signing a package adds the member
    assert aotc.load(plain, trusted_keys=[pub]).signer.startswith("OMS key ")
    aotc.load(plain)                                        # no policy: no signature required


def test_an_old_signed_artifact_gains_the_bundle(mlp_artifact, tmp_path, keys):
    (priv, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    old_priv, old_pub = generate_keys(tmp_path / "old", "ed25519")
    old_id = sign_artifact(art, old_priv)
    sign_artifact(art, priv)
    assert aotc.load(art, trusted_keys=[old_pub]).signer == old_id
    assert aotc.load(art, trusted_keys=[pub]).signer.startswith("OMS key ")
    oms_verify(art, pub)                     # signatures.json is not part of the statement
    sign_artifact(art, generate_keys(tmp_path / "old2", "ed25519")[0])
    oms_verify(art, pub)                     # so another Ed25519 signature leaves it valid
    assert aotc.load(art, trusted_keys=[pub, old_pub]).signer


def _cert(subject, issuer_key, key, issuer=None, ca=False):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=not ca, key_cert_sign=ca,
                                            crl_sign=ca, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True))
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path, obj):
    path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    return path


def test_the_certificate_method(mlp_artifact, tmp_path, capsys):
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca = _cert("aotc test CA", ca_key, ca_key, ca=True)
    leaf = _cert("aotc test signer", ca_key, leaf_key, issuer=ca.subject)
    (tmp_path / "leaf.key").write_bytes(leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    proc = run_aotc("sign", art, "--key", tmp_path / "leaf.key", "--certificate",
                    _write(tmp_path / "leaf.pem", leaf), "--certificate-chain",
                    _write(tmp_path / "ca.pem", ca))
    assert proc.returncode == 0, proc.stderr
    assert "OMS certificate CN=aotc test signer" in proc.stdout
    model_signing.verifying.Config().use_certificate_verifier(
        certificate_chain=[tmp_path / "ca.pem"]).verify(art, art / fmt.OMS_SIGNATURE)
    m = aotc.load(art, trusted_keys=[tmp_path / "ca.pem"])
    assert m.signer == "OMS certificate CN=aotc test signer"
    _, key = generate_keys(tmp_path / "k")     # a key checks key bundles only, quietly
    assert aotc.load(art, trusted_keys=[key, tmp_path / "ca.pem"]).signer == m.signer
    with pytest.raises(ArtifactError, match="not by a trusted key") as e:
        aotc.load(art, trusted_keys=[key])
    assert "certificate method, and no trusted key of that kind" in str(e.value.found)
    assert capsys.readouterr().out == ""
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _write(tmp_path / "other.pem", _cert("another CA", other_key, other_key, ca=True))
    with pytest.raises(ArtifactError, match="not by a trusted key"):
        aotc.load(art, trusted_keys=[other])
    out = run_aotc("inspect", art, "--trusted-key", tmp_path / "ca.pem").stdout
    assert "OMS certificate method, by CN=aotc test signer (valid)" in out


def test_cli_keygen_sign_inspect(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    assert run_aotc("keygen", "-o", tmp_path / "k").returncode == 0
    proc = run_aotc("sign", art, "--key", tmp_path / "k")
    assert proc.returncode == 0, proc.stderr
    kid = proc.stdout.split()[-1]
    out = run_aotc("inspect", art).stdout
    assert f"OMS key method, by key {kid} (covers every file; signature not checked" in out
    _extra(art)
    proc = run_aotc("run", art, "--runs", "1", "--trusted-key", tmp_path / "k.pub")
    assert proc.returncode == 5 and "does not cover exactly" in proc.stderr


def test_the_format_23_fixture_verifies_with_its_key():
    fixtures = Path(__file__).parent / "fixtures"
    art, pub = fixtures / "format_v23_signed.aotc", fixtures / "format_v23_signed.pub"
    oms_verify(art, pub)
    assert json.loads((art / fmt.MANIFEST).read_bytes())["format_version"] == 23
    assert aotc.load(art, trusted_keys=[pub]).signer.startswith("OMS key ")
