"""Trust policies in the C++ front end (runtime/cpp/frontend/signing.cpp, keys.cpp): a policy
that names keys but yields none fails closed, a private key given as a trusted key is refused
without its bytes in the message, and AOTC_TRUSTED_KEYS folders of EC keys and certificates are
read as Python reads them. The tool is tests/cpp/signing's (conftest.py).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import aotc
from aotc.errors import ArtifactError
from aotc.artifact.schema.rules import NO_USABLE_KEY, PRIVATE_KEY
from aotc.artifact.signing import generate_keys, sign_artifact
from hostile import copy_artifact

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


@pytest.fixture
def signed(mlp_artifact, tmp_path) -> tuple[Path, Path, Path]:
    """(a signed artifact, its signer's private key, its public key)."""
    private, public = generate_keys(tmp_path / "producer")
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, private)
    return art, private, public


def load(tool: Path, art: Path, *args: str, env: dict | None = None):
    import os
    environ = {k: v for k, v in os.environ.items() if k != "AOTC_TRUSTED_KEYS"}
    return subprocess.run([str(tool), "load", str(art), *args], capture_output=True, text=True,
                          timeout=300, env={**environ, **(env or {})})


def _policies(tmp_path: Path) -> dict:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no key here")
    return {"a directory with no key file": ([], {"AOTC_TRUSTED_KEYS": str(tmp_path / "empty")}),
            "only separators": ([], {"AOTC_TRUSTED_KEYS": ":"}),
            "an empty list given": (["-e"], None)}


def test_a_policy_that_yields_no_key_refuses_every_load(cpp_signing_tool, signed, mlp_artifact,
                                                        tmp_path):
    art, _, _ = signed
    for name, (args, env) in _policies(tmp_path).items():
        for target in (art, mlp_artifact):   # signed or not: nothing can be trusted
            done = load(cpp_signing_tool, target, *args, env=env)
            assert done.returncode == ArtifactError.exit_code, (name, done.stdout + done.stderr)
            assert done.stderr.startswith(f"ArtifactError: {NO_USABLE_KEY['what']}"), done.stderr
            assert f"where: {NO_USABLE_KEY['where']}" in done.stderr
            assert f"found: {NO_USABLE_KEY['found']}" in done.stderr
    assert load(cpp_signing_tool, art).stdout == "signer \n"    # no policy: none required
    assert load(cpp_signing_tool, art, "-e", str(signed[2])).stdout.startswith("signer ")


def test_python_refuses_the_same_policies(signed, tmp_path, monkeypatch):
    art, _, _ = signed
    for name, (args, env) in _policies(tmp_path).items():
        if env is None:
            continue
        monkeypatch.setenv("AOTC_TRUSTED_KEYS", env["AOTC_TRUSTED_KEYS"])
        with pytest.raises(ArtifactError) as err:
            aotc.load(art)
        assert err.value.found == NO_USABLE_KEY["found"], name


def test_a_private_key_is_refused_without_echoing_it(cpp_signing_tool, signed):
    art, private, _ = signed
    secret = private.read_text()
    body = "".join(secret.splitlines()[1:-1])
    for key in (str(private), secret):   # its file, and its text
        done = load(cpp_signing_tool, art, key)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"UsageError: {PRIVATE_KEY['what']}"), done.stderr
        assert body[:16] not in done.stderr and body[-16:] not in done.stderr


def test_ec_keys_and_certificates_from_the_environment(cpp_signing_tool, mlp_artifact, tmp_path,
                                                       monkeypatch):
    """AOTC_TRUSTED_KEYS folders hold EC keys (*.pub) and CA certificates (*.crt), read by both
    front ends alike: the OMS signer, or the same refusal."""
    from test_cpp_oms import _certificates
    keys = tmp_path / "keys"
    keys.mkdir()
    private, _ = generate_keys(keys / "producer")               # EC P-256, keys/producer.pub
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, private)
    ca, key, leaf = _certificates(tmp_path)
    by_cert = copy_artifact(mlp_artifact, tmp_path / "c.aotc")
    sign_artifact(by_cert, key, certificate=leaf, chain=[ca])
    (keys / "ca.crt").write_bytes(ca.read_bytes())
    env = {"AOTC_TRUSTED_KEYS": str(keys)}
    for target, want in ((art, "OMS key "), (by_cert, "OMS certificate CN=aotc test signer")):
        done = load(cpp_signing_tool, target, env=env)
        assert done.stdout.startswith(f"signer {want}"), done.stderr
        with monkeypatch.context() as m:
            m.setenv("AOTC_TRUSTED_KEYS", str(keys))
            assert aotc.load(target).signer.startswith(want)
    (keys / "ca.crt").unlink()
    done = load(cpp_signing_tool, by_cert, env=env)
    assert done.returncode == ArtifactError.exit_code
    assert "certificate method, and no trusted key of that kind" in done.stderr
