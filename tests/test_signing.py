"""Signed artifacts: keygen, sign, load with trusted keys (argument and AOTC_TRUSTED_KEYS);
a re-hashed or re-signed artifact is refused when a signature is required."""
from __future__ import annotations

import json

import pytest

import aotc
from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.signing import generate_keys, key_id, public_key_bytes, sign_artifact
from conftest import run_aotc
from hostile import copy_artifact, edit_json

pytest.importorskip("cryptography")


@pytest.fixture
def keys(tmp_path):
    return (generate_keys(tmp_path / "producer", "ed25519"),
            generate_keys(tmp_path / "other", "ed25519"))


def test_signed_artifact_loads_with_its_key_and_only_with_it(mlp_artifact, tmp_path, keys):
    (priv, pub), (_, other_pub) = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    with pytest.raises(ArtifactError, match="not signed by a trusted key"):
        aotc.load(art, trusted_keys=[pub])
    kid = sign_artifact(art, priv)
    assert kid == key_id(public_key_bytes(pub))
    m = aotc.load(art, trusted_keys=[pub])
    assert m.signer == kid
    m(*m.random_inputs())
    with pytest.raises(ArtifactError, match="not signed by a trusted key") as e:
        aotc.load(art, trusted_keys=[other_pub])
    assert kid in str(e.value.found)
    aotc.load(art)     # no key trusted: no signature required


def test_rehashed_artifact_is_refused_when_a_signature_is_required(mlp_artifact, tmp_path, keys):
    (priv, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, priv)
    edit_json(art, fmt.plan_file("forward"), lambda p: p["stats"].update(evil=True))
    aotc.load(art)    # its own hashes agree: integrity alone cannot tell
    with pytest.raises(ArtifactError, match="not signed by a trusted key") as e:
        aotc.load(art, trusted_keys=[pub])
    assert "do not verify" in str(e.value.found)


def test_a_signature_copied_from_another_artifact_does_not_verify(exported, tmp_path, keys):
    (priv, pub), _ = keys
    a = copy_artifact(exported("mlp").path, tmp_path / "a.aotc")
    b = copy_artifact(exported("cnn").path, tmp_path / "b.aotc")
    sign_artifact(a, priv)
    (b / fmt.SIGNATURES).write_bytes((a / fmt.SIGNATURES).read_bytes())
    with pytest.raises(ArtifactError):
        aotc.load(b, trusted_keys=[pub])


def test_environment_trusted_keys_make_signatures_mandatory(mlp_artifact, tmp_path, keys,
                                                           monkeypatch):
    (priv, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(pub.parent))     # a directory of *.pub
    with pytest.raises(ArtifactError):
        aotc.load(art)
    sign_artifact(art, priv)
    assert aotc.load(art).signer == key_id(public_key_bytes(pub))
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(tmp_path / "missing.pub"))
    with pytest.raises(UsageError, match="AOTC_TRUSTED_KEYS"):
        aotc.load(art)


@pytest.mark.parametrize("junk", ['{"format": 1, "signatures": [{"algorithm": "rsa"}]}',
                                  "[" * 100000, "not json", '{"format": 2, "signatures": []}'])
def test_malformed_signature_files_are_typed_errors(mlp_artifact, tmp_path, keys, junk):
    _, pub = keys[0]
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    (art / fmt.SIGNATURES).write_text(junk)
    with pytest.raises(ArtifactError):
        aotc.load(art, trusted_keys=[pub])


def test_trusted_keys_in_every_form(mlp_artifact, tmp_path, keys):
    (priv, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, priv)
    raw = public_key_bytes(pub)
    import base64
    for key in (pub, str(pub), pub.read_bytes(), pub.read_text(), raw,
                base64.b64encode(raw).decode()):
        assert aotc.load(art, trusted_keys=[key]).signer == key_id(raw)
    with pytest.raises(UsageError):
        aotc.load(art, trusted_keys=["not a key"])
    private = (tmp_path / "producer").read_text()   # a PEM, but no public key
    for given in (private, tmp_path / "producer"):
        with pytest.raises(UsageError, match="a private key was given") as e:
            aotc.load(art, trusted_keys=[given])
        body = "".join(private.splitlines()[1:-1])
        assert not any(body[i:i + 8] in str(e.value) for i in range(0, len(body) - 8, 4))
    junk = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
    with pytest.raises(UsageError, match="a trusted key is not an Ed25519 public key"):
        aotc.load(art, trusted_keys=[junk])


def test_cli_keygen_sign_inspect_and_verify(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    proc = run_aotc("keygen", "--kind", "ed25519", "-o", tmp_path / "k")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "k").stat().st_mode & 0o077 == 0
    assert run_aotc("keygen", "-o", tmp_path / "k").returncode == 2     # never overwritten
    proc = run_aotc("sign", art, "--key", tmp_path / "k")
    assert proc.returncode == 0, proc.stderr
    kid = proc.stdout.split()[-1]
    out = run_aotc("inspect", art).stdout
    assert f"signed:  by {kid} (valid)" in out
    proc = run_aotc("verify", art, "--trusted-key", tmp_path / "k.pub")
    assert proc.returncode == 0, proc.stderr
    edit_json(art, fmt.MANIFEST, lambda m: m["model"].update(name="evil"))
    assert "INVALID" in run_aotc("inspect", art).stdout
    proc = run_aotc("run", art, "--trusted-key", tmp_path / "k.pub")
    assert proc.returncode == 5 and "not signed by a trusted key" in proc.stderr


def test_signing_verifies_before_it_signs(mlp_artifact, tmp_path, keys):
    (priv, _), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    (art / fmt.WEIGHTS).write_bytes(b"tampered")
    with pytest.raises(ArtifactError):
        sign_artifact(art, priv)
    assert not (art / fmt.SIGNATURES).exists()
    json.loads((art / fmt.MANIFEST).read_text())
