"""Shared fixtures and helpers for the aotc test suite.

Exports are the slow part (seconds each), so every sample is exported at most once per session
(`exported`); tests that damage an artifact work on a copy (`artifact_copy`). The C++ front
end's programs (samples/cpp, tests/cpp) are built with CMake once per session (`aotc_run`,
`cpp_tests`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

import aotc
from aotc.artifact import format as fmt

AOTC_ROOT = Path(__file__).resolve().parents[1]   # the source tree (tests run against the installed aotc)
SAMPLES_DIR = AOTC_ROOT / "samples"
MODELS_DIR = Path(__file__).resolve().parent / "models"

RTOL = ATOL = 1e-5
# the kernel library an artifact exported here (`--isa auto`) loads on this host: its best level
from aotc.artifact.isa import best_level  # noqa: E402
LIBRARY = fmt.kernel_library(best_level())


# --------------------------------------------------------------------------------- importing

def import_file(path: Path, name: str | None = None):
    """Import a Python file as a module registered in sys.modules (so inspect can find it)."""
    path = Path(path).resolve()
    name = name or "aotc_test_" + path.stem + "_" + hashlib.sha256(
        str(path).encode()).hexdigest()[:10]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def llama_sample(**overrides):
    """samples/llama.py at the tests' size (2 layers, width 64, 4 query and 2 KV heads, vocab
    500), its weights drawn after seeding torch with 0, in eval mode."""
    torch.manual_seed(0)
    size = dict(layers=2, dim=64, heads=4, kv_heads=2, hidden=128, vocab=500)
    return import_file(SAMPLES_DIR / "llama.py").Net(**{**size, **overrides}).eval()


# ------------------------------------------------------------------------------------ samples

@dataclass(frozen=True)
class Sample:
    file: str
    attr: str
    cli_specs: tuple[str, ...]
    make_inputs: Callable[[torch.Generator], tuple]
    hf: bool = False

    @property
    def ref(self) -> str:
        return f"{SAMPLES_DIR / self.file}:{self.attr}"

    def build(self) -> torch.nn.Module:
        """The model as `aotc export FILE:Name` builds it: seeded with 0, no init args."""
        if self.hf:
            pytest.importorskip("transformers")
        module = import_file(SAMPLES_DIR / self.file)
        torch.manual_seed(0)
        return getattr(module, self.attr)().eval()

    def inputs(self, seed: int) -> tuple:
        return self.make_inputs(torch.Generator().manual_seed(seed))


def _ids(g):
    return (torch.randint(0, 1000, (2, 32), generator=g, dtype=torch.int64),)


SAMPLES = {
    "mlp": Sample("mlp.py", "Net", ("32x64",), lambda g: (torch.randn(32, 64, generator=g),)),
    "cnn": Sample("cnn.py", "Net", ("8x3x32x32",),
                  lambda g: (torch.randn(8, 3, 32, 32, generator=g),)),
    "transformer": Sample("transformer.py", "Net", ("2x64x128",),
                          lambda g: (torch.randn(2, 64, 128, generator=g),)),
    "gpt2": Sample("hf_models.py", "gpt2", ("2x32:int64:0..999",), _ids, hf=True),
    "bert": Sample("hf_models.py", "bert", ("2x32:int64:0..999",), _ids, hf=True),
}


@dataclass
class Exported:
    name: str
    model: torch.nn.Module
    inputs: tuple
    path: Path


@pytest.fixture(scope="session", autouse=True)
def one_cpu_level():
    """Exports in this process build their C++ kernels for this host's CPU level only, not for
    each level from the x86-64-v2 baseline up as `--isa auto` does: a third of the compiles on
    a 2-core machine, for tests that do not care which levels an artifact carries. Yields the
    real `auto_levels`; tests of the levels (test_levels.py) put it back, and exports in
    subprocesses (the CLI tests, `cli_mlp_artifact`) build every level."""
    from aotc.codegen.cpp import build
    patch = pytest.MonkeyPatch()
    real = build.auto_levels
    patch.setattr(build, "auto_levels", lambda: (best_level(),))
    yield real
    patch.undo()


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(name) -> Exported: the sample exported once per session through the Python API.

    Tests must not modify `path`; copy it first (`artifact_copy`)."""
    cache: dict[str, Exported] = {}

    def get(name: str) -> Exported:
        if name not in cache:
            sample = SAMPLES[name]
            model = sample.build()
            inputs = sample.inputs(seed=0)
            dest = tmp_path_factory.mktemp(f"export_{name}") / f"{name}.aotc"
            path = aotc.export(model, inputs, dest)
            assert Path(path) == dest.absolute()
            cache[name] = Exported(name, model, inputs, Path(path))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def mlp_artifact(exported) -> Path:
    return exported("mlp").path


@pytest.fixture
def artifact_copy(mlp_artifact, tmp_path) -> Path:
    """A private copy of the mlp artifact, free to damage."""
    dest = tmp_path / "copy.aotc"
    shutil.copytree(mlp_artifact, dest)
    return dest


# ------------------------------------------------------------------------------ comparisons

def eager(model, inputs):
    with torch.no_grad():
        return model(*inputs)


def assert_matches(got, want, *, rtol=RTOL, atol=ATOL, path="output"):
    """`got` (from a CompiledModule) equals `want` (eager) in value and structure.

    Dicts and ModelOutputs must come back as plain dicts with the same keys in the same order.
    """
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: expected a tensor, got {type(got)}"
        assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.device == want.device, f"{path}: device {got.device} != {want.device}"
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{path}: {m}")
    elif isinstance(want, dict):   # includes transformers' ModelOutput
        assert type(got) is dict, f"{path}: expected a plain dict, got {type(got)}"
        assert list(got) == list(want.keys()), f"{path}: keys {list(got)} != {list(want.keys())}"
        for k in want.keys():
            assert_matches(got[k], want[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_matches(g, w, rtol=rtol, atol=atol, path=f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def flat_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in value.keys() for t in flat_tensors(value[k])]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat_tensors(v)]
    return []


# -------------------------------------------------------------------------------- artifacts

@pytest.fixture(scope="module")
def packed(mlp_artifact, tmp_path_factory) -> Path:
    """The exported MLP as a single-file package (`aotc pack`)."""
    from aotc.artifact.package import pack
    return pack(mlp_artifact, tmp_path_factory.mktemp("pkg") / "mlp.aotcpkg")


def package_index(data: bytes) -> tuple[int, list]:
    """(the index's length, its [name, offset, size] rows) of a package's bytes."""
    from aotc.artifact.package import HEADER
    length = HEADER.unpack(data[:HEADER.size])[3]
    return length, json.loads(data[HEADER.size:HEADER.size + length])["members"]


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under an artifact directory: relative path -> bytes."""
    path = Path(path)
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def read_raw_manifest(path: Path) -> dict:
    return json.loads((Path(path) / fmt.MANIFEST).read_bytes())


def write_manifest(path: Path, manifest: dict) -> None:
    """Write `manifest` with a valid self-hash, exactly as `write_artifact` computes it."""
    manifest = {k: v for k, v in manifest.items() if k != fmt.SELF_HASH_KEY}
    manifest[fmt.SELF_HASH_KEY] = hashlib.sha256(fmt.dumps(manifest)).hexdigest()
    (Path(path) / fmt.MANIFEST).write_bytes(fmt.dumps(manifest))


def replace_file(path: Path, rel: str, data: bytes) -> None:
    """Replace one file of an artifact and re-sign the manifest, so the artifact stays valid."""
    path = Path(path)
    (path / rel).write_bytes(data)
    manifest = read_raw_manifest(path)
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    write_manifest(path, manifest)


def flip_byte(file: Path, offset: int, mask: int = 0xFF) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= mask
    file.write_bytes(bytes(data))


# ------------------------------------------------------------------------------- processes

def aotc_exe() -> list[str]:
    exe = shutil.which("aotc")
    assert exe, "the `aotc` console script is not on PATH (pip install -e .)"
    return [exe]


def run_aotc(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run the installed `aotc` console script."""
    return subprocess.run(aotc_exe() + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=subprocess_env())


def run_python(script: str, *args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env=subprocess_env())


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@pytest.fixture(scope="session")
def cli_mlp_artifact(tmp_path_factory) -> Path:
    """samples/mlp.py:Net exported by the installed `aotc` console script, in a subprocess."""
    out = tmp_path_factory.mktemp("cli_mlp") / "mlp.aotc"
    proc = run_aotc("export", SAMPLES["mlp"].ref, "-i", "32x64", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out.absolute()), proc.stdout
    return out


# ------------------------------------------------------------------ the C++ front end's programs

def cmake_build(source: Path, build: Path) -> None:
    """A CMake project built as a user builds one against aotc (docs/packages.md, "The C++ front end")."""
    prefix = run_aotc("config", "--cmake-prefix-path")
    if prefix.returncode != 0:
        pytest.skip(f"aotc was installed without its C++ runtime: {prefix.stderr.strip()}")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", source, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_PREFIX_PATH={prefix.stdout.strip()}"], ["cmake", "--build", build]):
        done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="session")
def aotc_run(tmp_path_factory) -> Path:
    """samples/cpp's aotc_run."""
    build = tmp_path_factory.mktemp("cpp_sample")
    cmake_build(AOTC_ROOT / "samples/cpp", build)
    return build / "aotc_run"


@pytest.fixture(scope="session")
def cpp_tests(tmp_path_factory) -> Path:
    """tests/cpp's programs."""
    build = tmp_path_factory.mktemp("cpp_tests")
    cmake_build(AOTC_ROOT / "tests/cpp", build)
    return build


@pytest.fixture(scope="session")
def cpp_signing_tool(tmp_path_factory) -> Path:
    """tests/cpp/signing's `signing` (tests/test_cpp_signing.py, tests/test_cpp_trust.py)."""
    build = tmp_path_factory.mktemp("cpp_signing")
    cmake_build(AOTC_ROOT / "tests/cpp/signing", build)
    return build / "signing"


def run_generate(cpp_tests: Path, art: Path, ids_file: Path, n: int, flags=()):
    """(completed process, tokens [rows, n] or None) of tests/cpp's `generate` on `art`."""
    done = subprocess.run([str(cpp_tests / "generate"), str(art), str(ids_file), str(n), *flags],
                          capture_output=True, text=True, timeout=300)
    tokens = None
    if done.returncode == 0:
        tokens = torch.tensor([[int(t) for t in row.split()] for row in done.stdout.splitlines()])
    return done, tokens


def run_cpp(exe: Path, art: Path, inputs=None, tmp: Path | None = None, env=None, cwd=None,
            flags=()):
    """(completed process, outputs) of aotc_run on `art` with `inputs` (a tuple of tensors)."""
    from safetensors.torch import load_file, save_file
    args = [str(exe), *flags, str(art)]
    if inputs is not None:
        save_file({str(i): t.contiguous() for i, t in enumerate(inputs)}, tmp / "in.safetensors")
        args += [str(tmp / "in.safetensors"), str(tmp / "out.safetensors")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=dict(os.environ, **(env or {})))
    outs = None
    if done.returncode == 0 and inputs is not None:
        got = load_file(tmp / "out.safetensors")
        outs = [got[str(i)] for i in range(len(got))]
    return done, outs


@pytest.fixture(scope="session")
def slot_llm(tmp_path_factory) -> Path:
    """samples/llama.py, tiny (vocab 96), exported once per session as a generator with 4
    cache slots of 48 positions (`--max-batch 4`, C++ kernels) and a decode bucket of the first
    2 slots: tests of slots, the serving engine and `aotc serve`. Tests must not modify it."""
    model = llama_sample(vocab=96, dim=32, hidden=64)
    dest = tmp_path_factory.mktemp("slot_llm") / "llm.aotc"
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    return Path(aotc.export(model, (ids,), dest, decode=True, max_cache_len=48, max_batch=4,
                            slot_buckets="2"))


def slot0_logits_by_bucket(path) -> list:
    """Slot 0's decode logits with only slot 0 live, then with all 4 of the generator at
    `path` live (4 slots; each slot prefilled with its own prompt first): the same slot's
    step through two decode buckets, for tests that they agree bitwise."""
    got = []
    for live in ([0], [0, 1, 2, 3]):
        m = aotc.load(path)
        for s, p in enumerate(([4, 5, 6], [7, 8], [9], [1, 2, 3, 4])):
            m.prefill_slot(torch.tensor([p]), s)
        got.append(m.decode_slots(torch.tensor([[11], [12], [13], [14]]), live=live)[0][0])
    return got
