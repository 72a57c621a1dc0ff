"""Signed artifacts in the C++ front end (runtime/cpp/frontend: keys, signing; Ed25519 through
OpenSSL's libcrypto), held against Python on the same inputs: Ed25519 verification against the
RFC 8032 vectors and against the `cryptography` package's verdict (bit flips, random
signatures, the edge cases of point and scalar encodings), base64 and key reading against
artifact/signing.py, and `aotc::Module` loading signed, tampered and unsigned artifacts with the
outcome `aotc.load` has: the same signer, or the same error class and message. Trust policies
that yield no key, private keys: tests/test_cpp_trust.py; OMS bundles: tests/test_cpp_oms.py.

tests/cpp/signing (a CMake project; about a minute on 2 cores) is built once per session.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

import aotc
from aotc import errors
from aotc.errors import AotcError
from aotc.artifact import format as fmt
from aotc.artifact.schema.rules import PRIVATE_KEY
from aotc.artifact.signing import generate_keys, key_id, public_key_bytes, sign_artifact
from hostile import copy_artifact, edit_json

pytest.importorskip("cryptography")
from cryptography.exceptions import InvalidSignature  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
RFC8032 = [   # section 7.1: name, secret key, public key, message, signature
    ("TEST 1", "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9"
     "b46bd25bf5f0595bbe24655141438e7a100b"),
    ("TEST 2", "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f1"
     "1d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("TEST 3", "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984d"
     "c6594a7c15e9716ed28dc027beceea1ec40a"),
    ("TEST SHA(abc)", "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
     "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
     "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3fe"
     "ebbd454d4423643ce80e2a9ac94fa54ca49f",
     "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b58909351fc9ac90b3ecfdfbc7c66431"
     "e0303dca179c138ac17ad9bef1177331a704"),
]


@pytest.fixture
def tool(cpp_signing_tool) -> Path:
    return cpp_signing_tool


def ask(tool: Path, lines: list[str]) -> list[str]:
    """The tool's answers to `lines` (tests/cpp/signing/signing.cpp, mode check)."""
    done = subprocess.run([str(tool), "check"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")[:-1]
    assert len(out) == len(lines), done.stdout[-2000:]
    return out


def h(data: bytes) -> str:
    return data.hex() or "-"


def cpp_verify(tool: Path, cases) -> list[bool]:
    return [a == "1" for a in ask(tool, [f"verify {h(p)} {h(s)} {h(m)}" for p, s, m in cases])]


def py_verify(pub: bytes, sig: bytes, msg: bytes) -> bool:
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(pub).verify(sig, msg)
        return True
    except (ValueError, InvalidSignature):
        return False


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def plus_l(sig: bytes) -> bytes:
    """The same signature with S + L: the same point equation, a non-canonical S."""
    return sig[:32] + (int.from_bytes(sig[32:], "little") + L).to_bytes(32, "little")


def enc(y: int, sign: int = 0) -> bytes:
    return (y | sign << 255).to_bytes(32, "little")


# ----------------------------------------------------------------------------- primitives
def test_rfc8032_vectors_verify_and_every_flipped_bit_fails(tool):
    cases, want = [], []
    for name, sk, pk, msg, sig in RFC8032:
        sk, pk, msg, sig = map(bytes.fromhex, (sk, pk, msg, sig))
        key = ed25519.Ed25519PrivateKey.from_private_bytes(sk)   # the vectors are the RFC's
        assert key.public_key().public_bytes_raw() == pk and key.sign(msg) == sig, name
        cases.append((pk, sig, msg))
        cases += [(pk, flip(sig, b), msg) for b in range(512)]
        cases += [(flip(pk, b), sig, msg) for b in range(256)]
        cases += [(pk, sig, flip(msg, b)) for b in range(8 * len(msg))]
        cases += [(pk, sig, msg + b"\0"), (pk, sig[:63], msg), (pk, sig + b"\0", msg),
                  (pk[:31], sig, msg), (pk + b"\0", sig, msg), (pk, plus_l(sig), msg)]
        want += [True] + [False] * (len(cases) - len(want) - 1)
    assert hashlib.sha512(b"abc").digest() == bytes.fromhex(RFC8032[3][3])
    assert [py_verify(*c) for c in cases] == want
    assert cpp_verify(tool, cases) == want


def edge_cases() -> list[tuple[bytes, bytes, bytes]]:
    """Encodings at the edges: small-order and non-canonical keys (y >= p, x = 0 with the sign
    bit set, no point at all), R likewise, S around L and above 2^253."""
    good = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(32)).public_key().public_bytes_raw()
    keys = [enc(1), enc(P + 1), enc(1, 1), enc(P - 1), enc(P - 1, 1), enc(0), enc(0, 1), enc(P),
            enc(2), enc(2**255 - 1), enc(2**255 - 1, 1), bytes(32), b"\xff" * 32, good]
    rs = [enc(1), enc(P + 1), enc(P - 1), enc(1, 1), enc(0)]
    scalars = [0, 1, L - 1, L, L + 1, 2**253, 2**256 - 1]
    return [(a, r + s.to_bytes(32, "little"), m) for a in keys for r in rs for s in scalars
            for m in (b"", b"m")]


def test_verification_agrees_with_cryptography(tool):
    """On random signatures, their mutations and the edge encodings: exactly what the
    `cryptography` package's Ed25519PublicKey.verify accepts (ed25519.h says which rules)."""
    rng = random.Random(0)
    cases = []
    for _ in range(60):
        key = ed25519.Ed25519PrivateKey.generate()
        pub, msg = key.public_key().public_bytes_raw(), rng.randbytes(rng.randrange(0, 700))
        sig = key.sign(msg)
        cases += [(pub, sig, msg), (pub, sig, msg + b"x"), (pub, plus_l(sig), msg),
                  (pub, flip(sig, rng.randrange(512)), msg), (flip(pub, 255), sig, msg)]
    cases += edge_cases()
    want = [py_verify(*c) for c in cases]
    assert want[:300:5] == [True] * 60 and not any(want[i] for i in range(300) if i % 5)
    assert cpp_verify(tool, cases) == want
    small_order = (enc(1), enc(1) + bytes(32), b"")   # identity key, R = identity, S = 0
    assert py_verify(*small_order)                      # OpenSSL makes no small-order check
    assert not py_verify(enc(1), enc(1) + L.to_bytes(32, "little"), b"")   # S = L refused


B64 = ["", "AA==", "AAA=", "AAAA", "A", "AA", "AAA", "AA=", "A=", "A===", "=", "==", "===",
       "====", "AAAA=", "AAAA==", "AA==AA==", "AA=A", "AA===", "AB==", "AAB=", "AP//", " AAAA",
       "AAAA ", "AA\nAA", "AA-_", "AA+/", "////", "\u00ffAAA", "\0AAA", "AA==\n", "QUJD", "QUI=",
       "QQ==", "Q===", "=QQ=", "QUJDRA==", "QUJDRA=", "QUJDRA"]


def py_b64(text: bytes) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return None


def test_base64_decodes_as_pythons_strict_b64decode(tool):
    rng = random.Random(2)
    texts = [t.encode() for t in B64]
    for n in range(0, 70):
        t = base64.b64encode(rng.randbytes(n))
        texts += [t, t[:-1], t + b"=", t.replace(b"=", b""), t[:n // 2] + b"=" + t[n // 2:]]
    got = ask(tool, [f"b64 {h(t)}" for t in texts])
    want = ["error" if py_b64(t) is None else f"ok {py_b64(t).hex()}" for t in texts]
    assert got == want


def _pem(key) -> str:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_inputs(tmp_path: Path) -> list[str]:
    """Trusted keys as a caller may give them, right and wrong."""
    key = ed25519.Ed25519PrivateKey.generate()
    pem, raw = _pem(key.public_key()), key.public_key().public_bytes_raw()
    b64 = base64.b64encode(raw).decode()
    (tmp_path / "k.pub").write_text(pem)
    (tmp_path / "k.b64").write_text(b64 + "\n")
    (tmp_path / "dir.pub").mkdir()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    pkcs1 = rsa_key.public_bytes(serialization.Encoding.PEM,
                                 serialization.PublicFormat.PKCS1).decode()
    body = pem.splitlines()[1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    bad_bits = body[:-2] + alphabet[alphabet.index(body[-2]) | 1] + "="   # a set bit past the end
    return [pem, pem.replace("\n", "\r\n"), "\n  " + pem, pem + "trailing text\n",
            private + pem, pem + private, private, pem[:40], pem.replace(body, body[:-8] + "AAA="),
            pem.replace(body, bad_bits), pem.replace("PUBLIC KEY", "PUBLIC  KEY"),
            _pem(rsa_key), pkcs1, _pem(ec.generate_private_key(ec.SECP256R1()).public_key()),
            _pem(x25519.X25519PrivateKey.generate().public_key()),
            _pem(ed448.Ed448PrivateKey.generate().public_key()),
            b64, b64 + "\n", " " + b64, b64[:20] + " " + b64[20:], b64[:-4],
            base64.b64encode(raw[:31]).decode(), "a" * 32, "not a key", "it's \"quoted\"\t\x01",
            str(tmp_path / "k.pub"), str(tmp_path / "k.b64"), str(tmp_path / "dir.pub"),
            str(tmp_path / "missing.pub"), "-----" + str(tmp_path / "k.pub"), ""]


def py_key(text: str) -> str:
    try:
        return f"ok {public_key_bytes(text).hex()}"
    except AotcError as e:
        return f"{type(e).__name__}\t{e.what}\t{e.found}"


def test_keys_read_as_python_reads_them(tool, tmp_path):
    """The same key, or the same error class and message; C++ never echoes what is no key
    (it may be a secret), and names a private key as such (rules.PRIVATE_KEY)."""
    texts = key_inputs(tmp_path)
    want = [py_key(t) for t in texts]
    got = ask(tool, [f"key {h(t.encode())}" for t in texts])
    for text, w, g in zip(texts, want, got, strict=True):
        if "PRIVATE KEY" in text and g.startswith("UsageError"):
            assert g.split("\t")[1:] == [PRIVATE_KEY["what"], PRIVATE_KEY["found"]], text
        elif "not an Ed25519 public key" in g:
            assert w.split("\t")[:2] == g.split("\t")[:2]
            assert g.split("\t")[2] == f"{len(text.encode())} bytes (not shown)"
        else:
            assert g == w, text
    assert sum(w.startswith("ok ") for w in want) == 11, want
    assert sum("not an Ed25519 key" in w for w in want) == 5, want


# ------------------------------------------------------------------------------ artifacts
@pytest.fixture
def keys(tmp_path):
    return (generate_keys(tmp_path / "producer", "ed25519"),
            generate_keys(tmp_path / "other", "ed25519"))


@pytest.fixture
def signed(mlp_artifact, tmp_path, keys) -> Path:
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    sign_artifact(art, keys[0][0])
    return art


def py_outcome(art: Path, trusted=(), **kw) -> str:
    try:
        m = aotc.load(art, trusted_keys=list(trusted) or None, **kw)
        return f"signer {m.signer or ''}"
    except AotcError as e:
        return f"{type(e).__name__}: {e}"


def cpp_outcome(tool: Path, art: Path, trusted=(), no_verify=False) -> str:
    done = subprocess.run([str(tool), "load", *(["-n"] if no_verify else []), str(art),
                           *map(str, trusted)], capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return done.stdout.rstrip("\n")
    out = done.stderr.rstrip("\n")
    kind = out.split(":")[0]
    assert done.returncode == getattr(errors, kind).exit_code, out
    return out


def same(tool: Path, art: Path, trusted=()) -> str:
    """The outcome of loading `art`, the same from C++ and Python (returned)."""
    want = py_outcome(art, trusted)
    assert cpp_outcome(tool, art, trusted) == want
    return want


def test_signed_artifact_loads_with_its_key_and_only_with_it(tool, mlp_artifact, signed, keys):
    (_, pub), (_, other) = keys
    kid = key_id(public_key_bytes(pub))
    raw = public_key_bytes(pub)
    for key in (pub, pub.read_text(), base64.b64encode(raw).decode()):
        assert same(tool, signed, [key]) == f"signer {kid}"
    assert same(tool, signed, [other, pub]) == f"signer {kid}"
    assert same(tool, signed) == "signer "                     # nothing trusted: not required
    refused = same(tool, signed, [other])
    assert refused.startswith("ArtifactError: the artifact is not signed by a trusted key")
    assert f"found: signatures by ['{kid}']" in refused
    unsigned = same(tool, mlp_artifact, [pub])
    assert "found: no signature" in unsigned
    for outcome in (py_outcome(signed, ["not a key"]), cpp_outcome(tool, signed, ["not a key"])):
        assert outcome.startswith("UsageError: a trusted key is not")   # C++ does not echo it


def test_trusted_keys_from_the_environment(tool, signed, keys, tmp_path, monkeypatch):
    (_, pub), (_, other) = keys
    kid = key_id(public_key_bytes(pub))
    for value, want in ((str(pub.parent), f"signer {kid}"),          # a directory of *.pub
                        (f"::{other}:{pub}:", f"signer {kid}"),
                        (str(other), "ArtifactError: the artifact is not signed"),
                        (str(tmp_path / "missing.pub"), "UsageError: AOTC_TRUSTED_KEYS names")):
        monkeypatch.setenv("AOTC_TRUSTED_KEYS", value)
        if want.startswith("UsageError"):   # the path quoted as JSON in C++ (Python: repr)
            assert py_outcome(signed).startswith(want) and cpp_outcome(tool, signed).startswith(
                f'{want} "{value}", which is no key file or directory'), value
            continue
        assert same(tool, signed).startswith(want), value
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(other))
    assert same(tool, signed, [pub]) == f"signer {kid}"     # the argument's keys and the env's
    # a folder with no key in it: both front ends fail closed, with one message
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(tmp_path / "empty"))
    assert same(tool, signed).startswith("ArtifactError: the trust policy names no usable key")


def test_an_artifact_signed_only_with_model_sig_loads_with_its_ec_key(
        tool, mlp_artifact, keys, tmp_path):
    """An artifact whose only signature is model.sig, directory or package: refused with an
    Ed25519 key trusted (no signature of that kind), loaded with its EC key by both front ends
    (tests/test_cpp_oms.py has the rest), and loaded without trusted keys."""
    from aotc.artifact.package import pack
    (_, pub), _ = keys
    art = copy_artifact(mlp_artifact, tmp_path / "o.aotc")
    ec_private, ec_public = generate_keys(tmp_path / "ec")
    sign_artifact(art, ec_private)
    pkg = pack(art, tmp_path / "o.aotcpkg")
    for path in (art, pkg):
        assert "found: no signature" in same(tool, path, [pub])
        assert same(tool, path, [ec_public]).startswith("signer OMS key ")
        assert same(tool, path) == "signer "


def test_signed_package_loads_with_its_key_and_only_with_it(tool, mlp_artifact, signed, keys,
                                                            tmp_path):
    """A package holds signatures.json as a member (artifact/package.py): C++ reads it from the
    package in place and gives Python's outcome, its errors naming PKG:signatures.json."""
    from aotc.artifact.reader import Artifact
    from aotc.artifact.package import pack, write_package
    (_, pub), (_, other) = keys
    kid = key_id(public_key_bytes(pub))
    pkg = pack(signed, tmp_path / "signed.aotcpkg")
    assert same(tool, pkg, [pub]) == f"signer {kid}"
    assert same(tool, pkg, [other, pub]) == f"signer {kid}"
    assert same(tool, pkg) == "signer "
    refused = same(tool, pkg, [other])
    assert refused.startswith("ArtifactError: the artifact is not signed by a trusted key")
    assert f"{pkg}:{fmt.SIGNATURES}" in refused
    unsigned = pack(mlp_artifact, tmp_path / "unsigned.aotcpkg")
    assert "found: no signature" in same(tool, unsigned, [pub])
    sign_artifact(unsigned, keys[0][0])                      # signing a package adds the member
    assert same(tool, unsigned, [pub]) == f"signer {kid}"
    doc = json.loads((signed / fmt.SIGNATURES).read_bytes())
    sig = bytearray(base64.b64decode(doc["signatures"][0]["signature"]))
    sig[0] ^= 1
    doc["signatures"][0]["signature"] = base64.b64encode(bytes(sig)).decode()
    art = Artifact(signed, signature_policy=False)
    try:
        bad = write_package(art, tmp_path / "bad.aotcpkg",
                            replace={fmt.SIGNATURES: json.dumps(doc).encode()})
    finally:
        art.close()
    assert same(tool, bad, [pub]).startswith("ArtifactError: the artifact is not signed")


def _resign(art: Path, edit) -> None:
    doc = json.loads((art / fmt.SIGNATURES).read_bytes())
    edit(doc["signatures"][0])
    (art / fmt.SIGNATURES).write_text(json.dumps(doc))


def _b64_edit(field: str, fn):
    def edit(entry):
        entry[field] = base64.b64encode(fn(base64.b64decode(entry[field]))).decode()
    return edit


TAMPERING = {
    "manifest": lambda a, o: edit_json(a, fmt.MANIFEST, lambda m: m["model"].update(name="x")),
    "plan": lambda a, o: edit_json(a, fmt.plan_file("forward"),
                                   lambda p: p["stats"].update(evil=True)),
    "forged": lambda a, o: _resign(a, _b64_edit("signature", lambda s: flip(s, 77))),
    "truncated": lambda a, o: _resign(a, _b64_edit("signature", lambda s: s[:63])),
    "non-canonical S": lambda a, o: _resign(a, _b64_edit("signature", plus_l)),
    "other public key": lambda a, o: _resign(a, _b64_edit("public_key",
                                                         lambda _: public_key_bytes(o))),
    "claimed key id": lambda a, o: _resign(a, lambda e: e.update(key_id="0" * 16)),
    "not base64": lambda a, o: _resign(a, lambda e: e.update(signature="!" + e["signature"])),
}


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_tampered_signed_artifacts_are_refused_as_python_refuses_them(tool, signed, keys, kind):
    (_, pub), (_, other) = keys
    TAMPERING[kind](signed, other)
    out = same(tool, signed, [pub])
    assert out.startswith("ArtifactError: the artifact is not signed by a trusted key"), out
    assert "(some do not verify)" in out


def _entry(**over) -> dict:
    e = {"algorithm": "ed25519", "key_id": "0" * 16, "public_key": "AAAA", "signature": "AAAA"}
    return {k: v for k, v in {**e, **over}.items() if v is not None}


MALFORMED = {   # signatures.json: Python's field errors, word for word
    "entry without key_id": '{"format": 1, "signatures": [{"algorithm": "rsa"}]}',
    "algorithm": {"format": 1, "signatures": [_entry(algorithm="rsa")]},
    "algorithm not a string": {"format": 1, "signatures": [_entry(algorithm=[1, 2.5, None])]},
    "format 2": '{"format": 2, "signatures": []}',
    "format true": '{"format": true, "signatures": []}',
    "format float": '{"format": 1.0, "signatures": []}',
    "format string": '{"format": "1", "signatures": []}',
    "no format": '{"signatures": []}',
    "extra field": '{"format": 1, "signatures": [], "by": "me", "at": 0}',
    "entry extra field": {"format": 1, "signatures": [_entry(comment="it's")]},
    "a list": "[]",
    "a string": '"x"',
    "signatures an object": '{"format": 1, "signatures": {"a": 1.5e300, "b": -0.0001}}',
    "65 signatures": {"format": 1, "signatures": [_entry()] * 65},
    "entry a list": {"format": 1, "signatures": [["ed25519"]]},
    "key id too long": {"format": 1, "signatures": [_entry(key_id="k" * 129)]},
    "signature a number": {"format": 1, "signatures": [_entry(signature=12)]},
    "non-ASCII key id": {"format": 1, "signatures": [_entry(key_id="\u00e9\u4e2d" * 60)]},
    "long strings": {"format": 1, "signatures": [_entry(algorithm="x" * 5000)]},
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_signatures_file_is_pythons_artifact_error(tool, signed, keys, kind):
    _, pub = keys[0]
    doc = MALFORMED[kind]
    (signed / fmt.SIGNATURES).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    out = same(tool, signed, [pub])
    assert out.startswith("ArtifactError: "), out


@pytest.mark.parametrize("junk", [b"not json", b"[" * 100000, b"{", b'{"format": 1,}',
                                  b'{"format": 1, "format": 1, "signatures": []}',
                                  b'{"format": 1, "signatures": ["\xff"]}'])
def test_signatures_file_that_is_no_json_is_refused(tool, signed, keys, junk):
    """Python's message quotes its own JSON parser: the class and the file are the same."""
    _, pub = keys[0]
    (signed / fmt.SIGNATURES).write_bytes(junk)
    want, got = py_outcome(signed, [pub]), cpp_outcome(tool, signed, [pub])
    assert want.startswith("ArtifactError: signatures.json is ")
    assert got.startswith("ArtifactError: signatures.json is not valid JSON"), got


def test_signatures_file_encodings(tool, signed, keys):
    """A UTF-8 byte-order mark is skipped, as Python skips it; UTF-16, which Python's json
    also reads (and `aotc sign` never writes), is refused by the C++ reader (signing.h)."""
    _, pub = keys[0]
    sigs = signed / fmt.SIGNATURES
    doc = sigs.read_bytes()
    sigs.write_bytes(b"\xef\xbb\xbf" + doc)
    assert same(tool, signed, [pub]).startswith("signer ")
    sigs.write_bytes(doc.decode().encode("utf-16"))
    assert py_outcome(signed, [pub]).startswith("signer ")
    assert cpp_outcome(tool, signed, [pub]).startswith("ArtifactError: signatures.json is not "
                                                       "valid JSON")


def test_signatures_file_that_is_no_regular_file(tool, signed, keys, tmp_path):
    _, pub = keys[0]
    sigs = signed / fmt.SIGNATURES
    outside = tmp_path / "outside.json"
    sigs.rename(outside)
    sigs.write_bytes(b" " * ((1 << 20) + 1))
    assert "signatures.json is larger than aotc reads" in same(tool, signed, [pub])
    sigs.unlink()
    sigs.symlink_to(outside)   # the valid signature, outside the artifact
    assert py_outcome(signed, [pub]).startswith("ArtifactError: artifact file signatures.json")
    assert cpp_outcome(tool, signed, [pub]).startswith("ArtifactError: artifact file "
                                                       "signatures.json cannot be opened")
    sigs.unlink()
    sigs.mkdir()
    assert py_outcome(signed, [pub]).startswith("ArtifactError: ")
    assert cpp_outcome(tool, signed, [pub]).startswith("ArtifactError: artifact file "
                                                       "signatures.json is not a regular file")


def test_the_signature_is_checked_before_the_other_files(tool, signed, mlp_artifact, keys,
                                                         tmp_path):
    (_, pub), (_, other) = keys
    (signed / fmt.WEIGHTS).write_bytes(b"damaged")
    assert "not signed by a trusted key" in same(tool, signed, [other])
    assert "wrong size" in cpp_outcome(tool, signed, [pub])   # only then the files


def test_a_required_signature_needs_the_hash_checks(tool, signed, keys):
    _, pub = keys[0]
    want = py_outcome(signed, [pub], verify_hashes=False)
    got = cpp_outcome(tool, signed, [pub], no_verify=True)
    assert want.splitlines()[0] == got.splitlines()[0] == (
        "UsageError: a required signature means nothing without the hash checks")
    assert cpp_outcome(tool, signed, no_verify=True) == "signer "
