"""Sharded weights and chunked verification: shards written tensor by tensor and indexed, read
by any safetensors reader; every chunk checked, in parallel on the CPU and one by one as it
streams (runtime/transfer.py, run here on the CPU); damaged, mixed or re-indexed shards
refused; blake3 preferred where installed, sha256 otherwise."""
from __future__ import annotations

import shutil
import weakref

import pytest
import torch

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from aotc.artifact import hashing, shards
from aotc.artifact.reader import Artifact
from aotc.runtime.transfer import stream_weights
from conftest import eager, flip_byte, read_raw_manifest, snapshot
from hostile import assert_refused, edit_json, rehash


class Net(torch.nn.Module):
    """Tied weights, a non-persistent buffer, an int buffer and mixed dtypes: shards must keep
    every tensor aligned and indexed."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 64)
        self.head.weight = self.a.weight
        self.register_buffer("steps", torch.arange(64, dtype=torch.int64))
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 64), persistent=False)

    def forward(self, x):
        h = torch.relu(self.a(x)) * self.scale
        return self.head(torch.relu(self.b(h))) + self.steps.to(x.dtype)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(artifact, model, input) exported in 1 KiB chunks and 10 KB shards."""
    mp = pytest.MonkeyPatch()
    mp.setattr(hashing, "CHUNK", 1024)
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 64)
    path = aotc.export(model, (x,), tmp_path_factory.mktemp("sh") / "s.aotc", shard_size="10KB")
    mp.undo()
    return path, model, x


def test_shards_are_indexed_capped_and_plain_safetensors(sharded):
    from safetensors.torch import load_file
    path, model, x = sharded
    w = read_raw_manifest(path)["weights"]
    assert len(w["shards"]) > 2 and w["shards"][0] == "weights-00001-of-%05d.safetensors" % len(
        w["shards"])
    seen = {}
    for rel in w["shards"]:
        entry = read_raw_manifest(path)["files"][rel]
        assert entry["size"] <= 10_000 + 1024 or len(load_file(path / rel)) == 1
        assert len(entry["chunks"]["sha256"]) == -(-entry["size"] // 1024)
        seen.update({k: rel for k in load_file(path / rel)})   # any safetensors reader
    assert seen == w["map"]
    assert w["aliases"] == {"head.weight": "a.weight"}
    assert w["state_dict"] == list(model.state_dict())
    torch.testing.assert_close(aotc.load(path)(x), model(x), rtol=1e-5, atol=1e-5)


def test_inspect_shows_shards_and_hash_scheme(sharded):
    from aotc.cli.report import inspect_text
    text = inspect_text(sharded[0])
    assert "shards (at most 10KB each)" in text
    assert "chunks of 1.0 KiB" in text
    assert "state_dict: 7 keys" in text and "1 other stored tensor (non-persistent" in text


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_a_damaged_shard_is_refused_naming_the_chunk(sharded, tmp_path, monkeypatch, algorithm):
    if algorithm == "sha256":
        monkeypatch.setattr(hashing, "blake3_module", lambda: None)
    art = tmp_path / "a.aotc"
    shutil.copytree(sharded[0], art)
    rel = read_raw_manifest(art)["weights"]["shards"][1]
    flip_byte(art / rel, 3000, 0x01)
    for load in (lambda: aotc.load(art), lambda: _streamed(art)):
        with pytest.raises(ArtifactError) as info:
            load()
        assert rel in info.value.what and f"{algorithm} of chunk 2 of" in info.value.what


def _streamed(path, **kwargs):
    art = Artifact(path, **kwargs)
    try:
        return stream_weights(art, torch.device("cpu"), max_workers=3)
    finally:
        art.close()


def test_streaming_gives_the_mapped_tensors(sharded, tmp_path):
    path = sharded[0]
    mapped = shards.stored_tensors(Artifact(path))
    got = _streamed(path)
    assert got.keys() == mapped.keys()
    for k in mapped:
        assert torch.equal(got[k], mapped[k]) and got[k].dtype == mapped[k].dtype, k
    art = shutil.copytree(path, tmp_path / "a.aotc")   # verify_hashes=False: nothing checked
    rel = read_raw_manifest(art)["weights"]["shards"][0]
    flip_byte(art / rel, (art / rel).stat().st_size - 1, 0x01)
    damaged = _streamed(art, verify_hashes=False)
    assert set(damaged) == set(mapped)
    assert any(not torch.equal(damaged[k], mapped[k]) for k in mapped)


def test_files_hashed_whole_still_stream(sharded, tmp_path):
    """A file entry with one sha256 (re-hashed, or of format 5) is checked whole, then copied."""
    art = shutil.copytree(sharded[0], tmp_path / "a.aotc")
    rehash(art)
    assert "chunks" not in read_raw_manifest(art)["files"][fmt.plan_file("forward")]
    assert all("chunks" not in e for e in read_raw_manifest(art)["files"].values())
    got = _streamed(art)
    want = shards.stored_tensors(Artifact(sharded[0]))
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("case", ["moved in the index", "shards swapped", "shard unlisted"])
def test_shards_that_disagree_with_the_index_are_refused(sharded, tmp_path, case):
    art = shutil.copytree(sharded[0], tmp_path / "a.aotc")
    w = read_raw_manifest(art)["weights"]
    first, second = w["shards"][0], w["shards"][1]
    if case == "moved in the index":
        name = next(k for k, v in w["map"].items() if v == first)
        edit_json(art, fmt.MANIFEST, lambda m: m["weights"]["map"].update({name: second}))
    elif case == "shards swapped":
        tmp = art / "tmp"
        (art / first).rename(tmp)
        (art / second).rename(art / first)
        tmp.rename(art / second)
        rehash(art)
    else:
        edit_json(art, fmt.MANIFEST, lambda m: m["weights"]["shards"].remove(second))
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    with pytest.raises(ArtifactError):
        _streamed(art)
    assert "index" in str(err) or "map" in str(err) or "listed" in str(err), str(err)


def test_chunk_digests_are_checked_in_parallel_and_each_one_counts(tmp_path):
    data = bytes(range(256)) * 40      # 10 KiB: 10 chunks of 1 KiB
    (tmp_path / "f").write_bytes(data)
    entry = hashing.file_entry(tmp_path / "f", 1024)
    assert len(entry.chunks.sha256) == len(entry.chunks.blake3) == 10
    checker = hashing.Checker(entry, "w", "w")
    checker.check_all(data)
    for i in range(10):
        bad = bytearray(data)
        bad[i * 1024 + 7] ^= 1
        with pytest.raises(ArtifactError, match=f"chunk {i} of 10"):
            checker.check_all(bad)


def test_shards_are_written_one_tensor_at_a_time(tmp_path):
    """Lazy tensors are made when their shard is written and dropped before the next."""
    alive, peak, made = [], [0], []

    def maker(i):
        def make():
            t = torch.full((1000,), float(i))
            weakref.finalize(t, lambda: alive.remove(i))
            alive.append(i)
            peak[0] = max(peak[0], len(alive))
            made.append(i)
            return t
        return make
    stored = {f"t{i}": shards.Lazy((1000,), torch.float32, maker(i)) for i in range(6)}
    files, index = shards.write_shards(tmp_path, stored, cap=8000, chunk=4096)
    assert sorted(made) == list(range(6)) and peak[0] == 1
    assert len(files) == 3 and set(index.values()) == set(files)


def test_the_format_5_layout_is_migrated(tmp_path):
    """A v5 manifest names no shards: its one weights.safetensors is the only shard."""
    from aotc.artifact.schema.migrate import migrate_manifest
    raw = {"format_version": 5, "weights": {"count": 2, "bytes": 8, "aliases": {}}}
    assert migrate_manifest(raw)["weights"]["shards"] == [fmt.WEIGHTS]
    assert migrate_manifest(dict(raw, weights={"count": 0, "bytes": 0, "aliases": {}})
                            )["weights"]["shards"] == []


def test_every_listed_file_is_still_sized_at_open(sharded, tmp_path):
    art = shutil.copytree(sharded[0], tmp_path / "a.aotc")
    rel = read_raw_manifest(art)["weights"]["shards"][-1]
    (art / rel).unlink()
    with pytest.raises(ArtifactError, match="missing"):
        Artifact(art)
    assert set(snapshot(sharded[0])) - set(snapshot(art)) == {rel}


@pytest.mark.parametrize("runner", ["python", None])
def test_plans_built_before_the_bytes_arrive_are_refreshed(exported, tmp_path, monkeypatch,
                                                           runner):
    """As on a GPU: device tensors are allocated, the plans built (channels-last copies of the
    convolution weights among what they derive) and only then do the bytes arrive; the module
    must compute with the arrived bytes. Run here with the streaming pipeline on the CPU, its
    workers held back until the plans are built."""
    import threading
    import aotc.runtime.module as module
    import aotc.runtime.transfer as transfer
    ex = exported("cnn")
    monkeypatch.setattr(hashing, "CHUNK", 1024)
    path = aotc.export(ex.model, ex.inputs, tmp_path / "c.aotc")
    monkeypatch.undo()
    built, run = threading.Event(), transfer._Worker.run

    def held_back(self, jobs, stop):
        built.wait(30)
        return run(self, jobs, stop)
    monkeypatch.setattr(transfer._Worker, "run", held_back)
    monkeypatch.setattr(module, "start_weights",
                        lambda art, dev: transfer.start_stream(art, dev, max_workers=2))
    wait = aotc.artifact.shards.Loading.wait

    def after_plans(self):
        built.set()
        return wait(self)
    monkeypatch.setattr(aotc.artifact.shards.Loading, "wait", after_plans)
    m = aotc.load(path, runner=runner)
    assert "cpp" in m.runtime or any(
        n.startswith("w") and v.is_contiguous(memory_format=torch.channels_last)
        and not v.is_contiguous() for e in m.entries.values()
        for n, v in e.function.namespace.items() if isinstance(v, torch.Tensor))
    torch.testing.assert_close(m(*ex.inputs), eager(ex.model, ex.inputs), rtol=1e-4, atol=1e-4)
