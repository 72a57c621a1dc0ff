"""The Python-free C++ front end (runtime/cpp/frontend, `aotc::Module`), end to end: the sample
program (samples/cpp) built with CMake against the installed runtime, run on exported samples
and compared with `aotc.load`; and what it refuses (tampered, malformed or escaping files, old
formats, other targets), with the error class and message Python gives; signatures:
tests/test_cpp_signing.py.

The CMake build of the sample is the slow part (about a minute on 2 cores): done once per
session (conftest.py), skipped where CMake or the runtime library is missing. Packages:
tests/test_cpp_package.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import aotc
from aotc.errors import GuardError
from aotc.artifact import format as fmt
from conftest import (AOTC_ROOT, flip_byte, read_raw_manifest, replace_file, run_cpp,
                      run_generate, write_manifest)

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def test_concurrent_calls(cpp_tests, exported):
    done = subprocess.run([str(cpp_tests / "concurrent"), str(exported("transformer").path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


@pytest.mark.parametrize("attention", [{}, {"window": 6, "softcap": 3.0, "sinks": True}],
                         ids=["plain", "window-softcap-sinks"])
def test_generation_from_cpp(cpp_tests, tmp_path, attention):
    """A generator's prefill and decode entries, their KV cache the module's state (zeros at
    load, updated in place by aotc::decode_attention_write, with a sliding window, soft-capped
    scores and attention sinks or without): the tokens Python generates, from the artifact
    directory and from its package."""
    from conftest import llama_sample
    from aotc.artifact.package import pack
    model = llama_sample(**attention)
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    art = aotc.export(model, (ids,), tmp_path / "llama.aotc", decode=True, max_cache_len=64)
    pkg = pack(art, tmp_path / "llama.aotcpkg")
    save_file({"0": ids}, tmp_path / "ids.safetensors")
    want = aotc.load(pkg).generate(ids, 12)[:, 9:]
    assert torch.equal(want, aotc.load(art).generate(ids, 12)[:, 9:])
    for path in (art, pkg):
        done, got = run_generate(cpp_tests, path, tmp_path / "ids.safetensors", 12)
        assert done.returncode == 0, done.stderr
        assert torch.equal(got, want), path


@pytest.mark.parametrize("family", ["deepseek_v3", "llama4_chunked"])
def test_generation_from_cpp_of_transformers_decoders(cpp_tests, tmp_path, family):
    """Keys and values of different head sizes (DeepSeek-V3's latent attention) and ring
    caches of chunks (Llama 4): the C++ front end generates transformers' tokens."""
    pytest.importorskip("transformers")
    from benchmarks.generate_families import build, reference
    model = build(family)
    ids = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(2))
    want = reference(model, ids, 16)[:, 7:]
    art = aotc.export(model, (ids,), tmp_path / "m.aotc", decode=True, max_cache_len=64)
    save_file({"0": ids}, tmp_path / "ids.safetensors")
    done, got = run_generate(cpp_tests, art, tmp_path / "ids.safetensors", 16)
    assert done.returncode == 0, done.stderr
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_sample_matches_python(aotc_run, exported, tmp_path, name):
    e = exported(name)
    m = aotc.load(e.path)
    done, outs = run_cpp(aotc_run, e.path, e.inputs, tmp_path)
    assert done.returncode == 0, done.stderr
    want = m.run_flat("forward", e.inputs)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert "call_us" in done.stdout and "load_ms" in done.stdout
    assert "graph off" in done.stdout   # CUDA graphs are for CUDA artifacts


def test_cuda_graphs_insisted_on_a_cpu_artifact(aotc_run, exported):
    """LoadOptions.cuda_graph = On off a GPU is a UsageError, as aotc.load(cuda_graph=True)."""
    done, _ = run_cpp(aotc_run, exported("mlp").path, flags=["--cuda-graph=on"])
    assert done.returncode == 2, done.stderr
    assert "UsageError" in done.stderr and "LoadOptions.cuda_graph" in done.stderr
    assert "CUDA graphs need a CUDA device" in done.stderr


@pytest.mark.parametrize("version,kind", [(10, "tiny"), (13, "tiny"), (13, "kernels"),
                                          (16, "kernels_select"), (17, "kernels"),
                                          (20, "kernels"),    # 20: entries name their parameters
                                          (24, "kernels_int8"), (26, "kernels_int4")])
def test_format_fixtures_run(aotc_run, tmp_path, version, kind):
    """Tied weights over three shards, a non-persistent buffer; extern-only and with kernels."""
    art = FIXTURES / f"format_v{version}_{kind}.aotc"
    inputs = load_file(art / fmt.SAMPLE_INPUTS)
    x = tuple(inputs[str(i)].clone() for i in range(len(inputs)))   # aligned as aotc_run's
    done, outs = run_cpp(aotc_run, art, x, tmp_path)
    assert done.returncode == 0, done.stderr
    for got, want in zip(outs, aotc.load(art).run_flat("forward", x), strict=True):
        assert torch.equal(got, want)


def test_dynamic_shapes(aotc_run, tmp_path):
    """Symbolic dims: sizes bound from the inputs, sizes of buffers evaluated from them, and a
    size outside its range refused with Python's message."""
    from aotc.api import export_file
    from aotc.exporter.specs import parse_input_specs
    art = export_file(f"{AOTC_ROOT}/samples/transformer.py:Net",
                      parse_input_specs(["batch=2[1..8]xseq=16[2..128]x128"]), tmp_path / "d.aotc")
    m = aotc.load(art)
    for b, seq in ((1, 2), (3, 97)):
        x = (torch.randn(b, seq, 128),)
        done, outs = run_cpp(aotc_run, art, x, tmp_path)
        assert done.returncode == 0, done.stderr
        torch.testing.assert_close(outs[0], m.run_flat("forward", x)[0], rtol=1e-5, atol=1e-5)
    bad = (torch.randn(9, 16, 128),)
    with pytest.raises(GuardError) as python:
        m(*bad)
    done, _ = run_cpp(aotc_run, art, bad, tmp_path)
    assert done.returncode == GuardError.exit_code
    assert done.stderr.strip() == f"GuardError: {python.value}"


def test_random_inputs_run(aotc_run, mlp_artifact):
    done, _ = run_cpp(aotc_run, mlp_artifact)
    assert done.returncode == 0, done.stderr
    assert "output 0: [32, 10]" in done.stdout


def test_wrong_shape_is_pythons_guard_error(aotc_run, mlp_artifact, tmp_path):
    bad = (torch.randn(16, 64),)
    with pytest.raises(GuardError) as python:
        aotc.load(mlp_artifact)(*bad)
    done, _ = run_cpp(aotc_run, mlp_artifact, bad, tmp_path)
    assert done.returncode == GuardError.exit_code
    assert done.stderr.strip() == f"GuardError: {python.value}"


def test_tampered_weights_refused(aotc_run, artifact_copy):
    flip_byte(artifact_copy / fmt.WEIGHTS, -3, 0x01)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "artifact file weights.safetensors is damaged (sha256 of chunk 0 of 1" in done.stderr


def _edit_runner(art: Path, edit) -> None:
    rel = fmt.runner_file("forward")
    doc = json.loads((art / rel).read_bytes())
    edit(doc)
    replace_file(art, rel, fmt.dumps(doc))


def test_slot_out_of_range_refused(aotc_run, artifact_copy):
    def edit(doc):
        step = next(s for s in doc["steps"] if s[0] == "call")
        step[4][0] = ["slot", 99999]
    _edit_runner(artifact_copy, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "ArtifactError: runner/forward.json is malformed at steps[0]" in done.stderr
    assert "slot 99999 (out of range)" in done.stderr


def test_expression_index_out_of_range_refused(aotc_run, artifact_copy):
    """What the runner itself checks again (runtime/cpp/program.cpp), past the reader."""
    def edit(doc):
        next(s for s in doc["steps"] if s[0] == "kernel")[5][0][2][0] = [9999]
    _edit_runner(artifact_copy, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "ArtifactError: the C++ runner refuses plan forward" in done.stderr
    assert "an expression index" in done.stderr


def test_read_before_write_refused(aotc_run, artifact_copy):
    """A slot read before any step binds it (here: the plan's output slot, by its first call)."""
    def edit(doc):
        next(s for s in doc["steps"] if s[0] == "call")[4][0] = ["slot", doc["outputs"][0][0]]
    _edit_runner(artifact_copy, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "field steps[0]" in done.stderr and "unbound or freed" in done.stderr


def test_op_outside_the_table_refused(aotc_run, artifact_copy):
    def edit(doc):   # a real ATen op, but not one a plan may call
        next(s for s in doc["steps"] if s[0] == "call")[2] = "aten::from_file"
    _edit_runner(artifact_copy, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5 and "an op of aotc's fixed table" in done.stderr, done.stderr


def test_kernel_signature_checked_against_table(aotc_run, artifact_copy):
    def edit(doc):
        next(s for s in doc["steps"] if s[0] == "kernel")[3][0] += 1
    _edit_runner(artifact_copy, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "with arguments its library does not take" in done.stderr


def test_symlink_escaping_the_artifact_refused(aotc_run, artifact_copy, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.copy(artifact_copy / fmt.WEIGHTS, outside)   # the same bytes: the hash would pass
    (artifact_copy / fmt.WEIGHTS).unlink()
    (artifact_copy / fmt.WEIGHTS).symlink_to(outside)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "cannot be opened" in done.stderr and "no symlinks" in done.stderr


def _refused_after(aotc_run, art: Path, edit, code: int) -> str:
    """aotc_run's error output on `art` once `edit(manifest)` was written (self-hash valid)."""
    m = read_raw_manifest(art)
    edit(m)
    write_manifest(art, m)
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == code, done.stderr
    return done.stderr


def test_path_escaping_the_artifact_refused(aotc_run, artifact_copy):
    def edit(m):
        m["files"]["../outside.json"] = m["files"].pop(fmt.runner_file("forward"))
    assert "a relative path inside the artifact" in _refused_after(aotc_run, artifact_copy, edit, 5)


def test_edited_manifest_refused(aotc_run, artifact_copy):
    raw = (artifact_copy / fmt.MANIFEST).read_bytes().replace(b'"float32"', b'"float64"', 1)
    (artifact_copy / fmt.MANIFEST).write_bytes(raw)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5 and "modified after export" in done.stderr, done.stderr


def test_runner_files_with_kernels_before_format_13_are_refused(aotc_run):
    # their kernel arguments lack the shapes the C++ front end checks ATen results against
    done, _ = run_cpp(aotc_run, FIXTURES / "format_v10_kernels.aotc")
    assert done.returncode == 5, done.stderr
    assert "runner files of format 13" in done.stderr and "re-export" in done.stderr


def test_old_format_refused(aotc_run):
    done, _ = run_cpp(aotc_run, FIXTURES / "format_v9_kernels.aotc")
    assert done.returncode == 5, done.stderr
    assert "format 9 has no runner files" in done.stderr and "re-export" in done.stderr


@pytest.mark.parametrize("version", [7, 9])
def test_swapping_weights_into_an_old_artifact_writes_its_runner_files(aotc_run, tmp_path,
                                                                     version):
    """swap-weights writes the current format, so an artifact from before runner files gets
    them: the C++ front end runs the swapped artifact with the new weights, as Python does."""
    from safetensors.torch import save_file as save
    from aotc.runtime.swap import swap_weights
    src = FIXTURES / f"format_v{version}_kernels.aotc"
    m = aotc.load(src)
    torch.manual_seed(0)
    new = {k: torch.randn_like(v) for k, v in m.state_dict().items()}
    save({k: v.contiguous() for k, v in new.items()}, tmp_path / "w.safetensors")
    dest, _ = swap_weights(src, tmp_path / "w.safetensors", tmp_path / "s.aotc")
    assert fmt.read_manifest(dest).format_version == fmt.FORMAT_VERSION
    assert (dest / fmt.runner_file("forward")).is_file()
    inputs = load_file(src / fmt.SAMPLE_INPUTS)
    # aligned as aotc_run's own copies of its inputs are: BLAS products of the same values
    # can differ in a last bit with the operands' alignment (load_file's are 8-byte aligned)
    x = tuple(inputs[str(i)].clone() for i in range(len(inputs)))
    done, outs = run_cpp(aotc_run, dest, x, tmp_path)
    assert done.returncode == 0, done.stderr
    want = aotc.load(dest).run_flat("forward", x)
    assert not torch.equal(want[0], m.run_flat("forward", x)[0])    # the new weights
    for got, w in zip(outs, want, strict=True):
        assert torch.equal(got, w)


def test_cuda_artifacts_before_format_14_are_refused(aotc_run):
    done, _ = run_cpp(aotc_run, FIXTURES / "format_v11_cuda.aotc")   # no runner files
    assert done.returncode == 7, done.stderr
    assert "CUDA artifacts of format 14 and newer; this one is format 11" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU host runs it (test_cpp_cuda.py)")
def test_cuda_artifacts_need_a_gpu(aotc_run):
    """Everything but the cubins is checked first; then the driver is needed."""
    done, _ = run_cpp(aotc_run, FIXTURES / "format_v14_cuda.aotc")
    assert done.returncode == 7, done.stderr
    assert "TargetError" in done.stderr and "libcuda.so.1" in done.stderr


def test_python_checks_the_runner_file(artifact_copy):
    rel = fmt.runner_file("forward")
    assert rel in read_raw_manifest(artifact_copy)["files"]
    flip_byte(artifact_copy / rel, 10, 0x01)
    with pytest.raises(aotc.ArtifactError, match="runner/forward.json is damaged"):
        aotc.load(artifact_copy)


@pytest.mark.parametrize("arg,value,message", [
    (7, ["f", 4.0], "argument 7: an int"), (9, ["f", 1.0], "argument 9: a tensor slot")])
def test_decode_attention_arguments_checked(aotc_run, tmp_path, arg, value, message):
    """The runner file's call of aotc's own op: each argument of the kind the op takes (the
    plan edited alike: a runner file that contradicts its plan is refused before)."""
    art = tmp_path / "g.aotc"
    shutil.copytree(FIXTURES / "format_v12_generator.aotc", art)
    rel, plan = fmt.runner_file("decode"), fmt.plan_file("decode")
    doc = json.loads((art / rel).read_bytes())
    step = next(s for s in doc["steps"] if s[0] == "call" and s[2].startswith("aotc::"))
    step[4][arg] = value
    replace_file(art, rel, fmt.dumps(doc))
    doc = json.loads((art / plan).read_bytes())
    doc["steps"][step[1]]["args"][arg] = value[1]
    replace_file(art, plan, fmt.dumps(doc))
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == 5 and message in done.stderr, done.stderr


def test_an_aten_result_smaller_than_its_slot_never_reaches_a_kernel(aotc_run, artifact_copy):
    # the hostile runner file of tests/test_hostile_plans.py: the first product multiplies by
    # a view of a smaller weight; the kernel after it would read past the result's end
    from hostile import edit_json
    rel = fmt.runner_file("forward")
    doc = json.loads((artifact_copy / rel).read_bytes())
    weights = {w[0]: w for w in doc["weights"]}
    view = next(s for s in doc["steps"] if s[0] == "call" and s[2] == "aten::permute")
    base = weights[view[4][0][1]]
    small = next(i for i, w in weights.items() if len(w[3]) == 2
                 and w[3][0] * w[3][1] < base[3][0] * base[3][1])

    def edit(d):
        next(s for s in d["steps"] if s[0] == "call" and s[1] == view[1])[4][0][1] = small
    edit_json(artifact_copy, fmt.plan_file("forward"),   # the plan too (runner_match.cpp)
              lambda p: p["steps"][view[1]]["args"][0].update(slot=small))
    edit_json(artifact_copy, rel, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "a kernel's argument is not what the plan declares" in done.stderr


def test_a_runner_file_reading_another_weight_than_its_plan_is_refused(aotc_run, artifact_copy):
    """Issue 45's runner file that reads fc2.weight where its plan reads fc1.weight: the C++
    front end holds the runner file against its plan (runner_match.cpp), as Python does."""
    def edit(doc):
        first, other = doc["weights"][0], next(w for w in doc["weights"][1:]
                                               if w[2] == doc["weights"][0][2])
        first[1] = other[1]
    _edit_runner(artifact_copy, edit)
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert "runner/forward.json does not match its plan" in done.stderr
    assert "weights[0]" in done.stderr
    with pytest.raises(aotc.ArtifactError, match="does not match its plan"):
        aotc.load(artifact_copy)


def test_the_cpp_front_end_checks_the_plan(aotc_run, artifact_copy):
    """A plan Python refuses (an op outside the table) is refused by the C++ front end too,
    though its runner file is the one export wrote (plan_check.cpp)."""
    from hostile import edit_json
    edit_json(artifact_copy, fmt.plan_file("forward"), lambda p: next(
        s for s in p["steps"] if s["kind"] == "extern").update(op="aten::from_file.default"))
    done, _ = run_cpp(aotc_run, artifact_copy)
    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith("ArtifactError: plans/forward.json is malformed at steps[")
    assert ".op" in done.stderr
