"""Single-file packages (`aotc pack`): read in place by aotc.load and every command, unpacked
byte-identical, refused when damaged (each refusal a typed ArtifactError naming the member),
loadable where the current directory and TMPDIR are not writable, signed like directories."""
from __future__ import annotations

import json
import os

import pytest

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from aotc.artifact.package import HEADER, unpack
from conftest import package_index, run_aotc, run_python, snapshot


def _rewrite(src, dst, edit) -> bytes:
    """`src`'s bytes with its index rows edited by `edit(rows)` (padded to the same length)."""
    data = bytearray(src.read_bytes())
    length, rows = package_index(data)
    edit(rows)
    index = json.dumps({"members": rows}).encode()
    assert len(index) <= length
    data[HEADER.size:HEADER.size + length] = index.ljust(length)
    dst.write_bytes(bytes(data))
    return bytes(data)


def test_pack_loads_in_place_and_unpacks_byte_identical(mlp_artifact, packed, tmp_path):
    m, d = aotc.load(packed), aotc.load(mlp_artifact)
    x = d.random_inputs()
    assert (m(*x) == d(*x)).all()
    out = unpack(packed, tmp_path / "back.aotc")
    assert snapshot(out) == snapshot(mlp_artifact)
    _, rows = package_index(packed.read_bytes())
    for name, offset, size in rows:
        if size >= 4096 or name.startswith("weights"):
            assert offset % 4096 == 0, name


def test_every_command_takes_a_package(packed, tmp_path):
    for args in (("inspect", packed), ("verify", packed), ("run", packed, "--runs", "1")):
        proc = run_aotc(*args)
        assert proc.returncode == 0, proc.stderr
    proc = run_aotc("unpack", packed, "-o", tmp_path / "u.aotc")
    assert proc.returncode == 0, proc.stderr
    proc = run_aotc("pack", tmp_path / "u.aotc", "-o", tmp_path / "again.aotcpkg")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "again.aotcpkg").read_bytes() == packed.read_bytes()


def _flip_weight(rows, data):
    name, offset, size = next(r for r in rows if r[0] == fmt.WEIGHTS)
    data[offset + size - 1] ^= 1
    return name


@pytest.mark.parametrize("case", ["weight byte", "truncated", "dotdot", "overlap", "duplicate",
                                  "trailing", "unlisted", "bad padding"])
def test_a_damaged_package_is_refused(packed, tmp_path, case):
    bad = tmp_path / "bad.aotcpkg"
    data = bytearray(packed.read_bytes())
    length, rows = package_index(data)
    if case == "weight byte":
        member = _flip_weight(rows, data)
        bad.write_bytes(bytes(data))
    elif case == "truncated":
        bad.write_bytes(bytes(data[:-10]))
        member = rows[-1][0]
    elif case == "dotdot":
        member = "../x"
        _rewrite(packed, bad, lambda r: r[1].__setitem__(0, "../x"))
    elif case == "overlap":
        member = rows[2][0]
        _rewrite(packed, bad, lambda r: r[2].__setitem__(1, r[1][1]))
    elif case == "duplicate":
        member = rows[1][0]
        _rewrite(packed, bad, lambda r: r[2].__setitem__(0, r[1][0]))
    elif case == "trailing":
        member = "end"
        bad.write_bytes(bytes(data) + b"\0junk")
    elif case == "unlisted":
        member = "extra.bin"
        _rewrite(packed, bad, lambda r: r[-1].__setitem__(0, "extra.bin"))
    else:
        member = rows[1][0]
        data[rows[1][1] - 1] = 7
        bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as e:
        m = aotc.load(bad)
        m(*m.random_inputs())
    assert member in e.value.where or member in e.value.what, (case, e.value)
    assert e.value.expected is not None and e.value.found is not None and e.value.fix


def test_a_package_loads_where_cwd_and_tmpdir_are_read_only(packed, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    not_a_dir = tmp_path / "tmp-is-a-file"
    not_a_dir.write_bytes(b"")
    ro.chmod(0o555)
    script = ("import os, sys, aotc; os.environ['TMPDIR'] = sys.argv[2]\n"
              "m = aotc.load(sys.argv[1]); m(*m.random_inputs()); print(m.library.level)")
    try:
        proc = run_python(script, packed, not_a_dir, cwd=ro)
        assert proc.returncode == 0, proc.stderr
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o755)


def test_a_signed_package_verifies_and_a_tampered_one_does_not(packed, tmp_path):
    pytest.importorskip("cryptography")
    from aotc.artifact.signing import generate_keys, sign_artifact
    priv, pub = generate_keys(tmp_path / "k", "ed25519")
    pkg = tmp_path / "s.aotcpkg"
    pkg.write_bytes(packed.read_bytes())
    sign_artifact(pkg, priv)
    assert aotc.load(pkg, trusted_keys=[pub]).signer is not None
    proc = run_aotc("verify", pkg, "--trusted-key", pub)
    assert proc.returncode == 0, proc.stderr
    signed = tmp_path / "unpacked.aotc"
    unpack(pkg, signed)
    assert aotc.load(signed, trusted_keys=[pub]).signer is not None
    data = bytearray(pkg.read_bytes())
    _, rows = package_index(data)
    _flip_weight(rows, data)
    pkg.write_bytes(bytes(data))
    with pytest.raises(ArtifactError):
        m = aotc.load(pkg, trusted_keys=[pub])
        m(*m.random_inputs())


def test_swap_weights_reads_and_writes_packages(exported, packed, tmp_path):
    import copy

    import torch
    from safetensors.torch import save_file
    ex = exported("mlp")
    sd = {k: v.detach().clone() * 0.5 for k, v in ex.model.state_dict().items()}
    save_file(sd, tmp_path / "ft.safetensors")
    out = tmp_path / "ft.aotcpkg"
    proc = run_aotc("swap-weights", packed, tmp_path / "ft.safetensors", "-o", out)
    assert proc.returncode == 0, proc.stderr
    model = copy.deepcopy(ex.model)
    model.load_state_dict(sd)
    with torch.no_grad():
        torch.testing.assert_close(aotc.load(out)(*ex.inputs), model(*ex.inputs),
                                   rtol=1e-4, atol=1e-4)
