"""Hostile artifacts, part 1: injection into every field of the manifest and the plans.

A hostile producer rewrites a file and recomputes the manifest's (unkeyed) hashes. Loading such
an artifact must raise the typed error, naming the file and the field, before anything of it
runs; no payload may ever create its marker file.
"""
from __future__ import annotations

import pytest

from aotc.errors import AotcError, ArtifactError
from aotc.artifact import format as fmt
from hostile import assert_refused, copy_artifact, edit_json, payloads

PLAN = fmt.plan_file("forward")


def _first(plan, kind):
    return next(s for s in plan["steps"] if s["kind"] == kind)


# (case, file, edit(doc, payload)): every place a string of the artifact could reach code
INJECTIONS = [
    ("plan entry", PLAN, lambda p, x: p.update(entry=x)),
    ("slot dtype", PLAN, lambda p, x: p["slots"][8].update(dtype=x)),
    ("slot shape", PLAN, lambda p, x: p["slots"][10]["shape"].__setitem__(0, x)),
    ("slot stride", PLAN, lambda p, x: p["slots"][10]["stride"].__setitem__(0, x)),
    ("slot kind", PLAN, lambda p, x: p["slots"][10].update(kind=x)),
    ("weight name", PLAN, lambda p, x: p["slots"][0].update(weight=x)),
    ("kernel sizes", PLAN, lambda p, x: _first(p, "kernel").update(sizes=[x])),
    ("kernel name", PLAN, lambda p, x: _first(p, "kernel").update(name=x)),
    ("extern op", PLAN, lambda p, x: _first(p, "extern").update(op=x)),
    ("kwarg name", PLAN, lambda p, x: _first(p, "extern").update(kwargs={x: 1})),
    ("arg tag", PLAN, lambda p, x: _first(p, "extern")["args"].append({x: "os"})),
    ("sym arg", PLAN, lambda p, x: _first(p, "extern")["args"].append({"sym": x})),
    ("dtype arg", PLAN, lambda p, x: _first(p, "extern")["args"].append({"dtype": x})),
    ("string arg", PLAN, lambda p, x: _first(p, "extern")["args"].__setitem__(1, x)),
    ("output const", PLAN, lambda p, x: p["outputs"].append({"const": x, "slot": 3})),
    ("step kind", PLAN, lambda p, x: _first(p, "extern").update(kind=x)),
    ("symbol name", fmt.MANIFEST, lambda m, x: m["entries"]["forward"]["symbols"].update(
        {x: {"min": 1, "max": 8, "example": 2}})),
    ("input shape", fmt.MANIFEST, lambda m, x: m["entries"]["forward"]["inputs"][0]["shape"]
     .__setitem__(0, x)),
    ("input dtype", fmt.MANIFEST, lambda m, x: m["entries"]["forward"]["inputs"][0].update(
        dtype=x)),
    ("relation", fmt.MANIFEST, lambda m, x: m["entries"]["forward"]["relations"].append(x)),
    ("plan path", fmt.MANIFEST, lambda m, x: m["entries"]["forward"].update(plan=x)),
    ("entry name", fmt.MANIFEST, lambda m, x: m["entries"].update({x: m["entries"]["forward"]})),
    ("isa", fmt.MANIFEST, lambda m, x: m["target"]["native"]["libraries"].update(
        {x: "kernels/kernels.so"})),
    ("library path", fmt.MANIFEST, lambda m, x: m["target"]["native"]["libraries"].update(
        {k: x for k in m["target"]["native"]["libraries"]})),
    ("device", fmt.MANIFEST, lambda m, x: m["target"].update(device=x)),
    ("tree kind", fmt.MANIFEST, lambda m, x: m["entries"]["forward"]["output_tree"].update(
        kind=x)),
    ("file path", fmt.MANIFEST, lambda m, x: m["files"].update(
        {x: m["files"]["weights.safetensors"]})),
]


@pytest.mark.parametrize("case,rel,edit", INJECTIONS, ids=[c[0] for c in INJECTIONS])
def test_injection_in_every_field_is_refused(mlp_artifact, tmp_path, case, rel, edit):
    marker = tmp_path / "PWNED"
    for i, payload in enumerate(payloads(marker)):
        art = copy_artifact(mlp_artifact, tmp_path / f"a{i}.aotc")
        edit_json(art, rel, lambda doc: edit(doc, payload))
        err = assert_refused(art, marker)
        assert isinstance(err, (ArtifactError, AotcError))


@pytest.mark.parametrize("op", ["aten::__class__.__base__", "aten::load_library.default",
                                "aten::from_file.default", "aten::_unsafe_index.Tensor",
                                "aten::fbgemm_linear_fp16_weight.default",
                                "torch::exec.default", "aten::mm"])
def test_extern_ops_come_from_the_table(mlp_artifact, tmp_path, op):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: _first(p, "extern").update(op=op))
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "op" in err.where and "steps[" in err.where


@pytest.mark.parametrize("name", ["system", "kernel0; rm", "aotc_set_num_threads", "kernel99"])
def test_kernel_names_resolve_only_in_the_kernel_table(mlp_artifact, tmp_path, name):
    """A name of libc (found by dlsym through the library's dependencies), a non-kernel symbol
    of the library itself, and a well-formed name the table lacks are all refused."""
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: _first(p, "kernel").update(name=name))
    assert_refused(art, tmp_path / "PWNED", ArtifactError)


def test_a_kernel_called_with_other_dtypes_than_it_takes_is_refused(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")

    def edit(p):
        k = _first(p, "kernel")
        p["slots"][k["out"][0]]["dtype"] = "float16"
    edit_json(art, PLAN, edit)
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "float16" in str(err.found)


@pytest.mark.parametrize("size", [10**15, -32, 32.5, True, "9**9**9", "2**62*2**62"])
def test_slot_sizes_are_bounded_integers_or_grammar_expressions(mlp_artifact, tmp_path, size):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: p["slots"][10]["shape"].__setitem__(0, size))
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "slots[10].shape[0]" in err.where


@pytest.mark.parametrize("relation", ["9**9**9 > batch", "batch ** 2 > 0", "batch > 0 if 1 else 0",
                                      "[x for x in ()]", "batch.__class__"])
def test_guard_relations_outside_the_grammar_are_refused(mlp_artifact, tmp_path, relation):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST,
              lambda m: m["entries"]["forward"]["relations"].append(relation))
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "relations[0]" in err.where


def test_deep_json_is_refused(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    deep = b"[" * 200000 + b"]" * 200000
    (art / PLAN).write_bytes(deep)
    from hostile import rehash
    rehash(art)
    assert_refused(art, tmp_path / "PWNED", ArtifactError)


def _paths(doc, prefix=()):
    """Every (path of keys) of a JSON document's objects, down to `depth` levels."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            if len(prefix) < 3:
                out += _paths(v, (*prefix, k))
    elif isinstance(doc, list) and doc and len(prefix) < 3:
        out += _paths(doc[0], (*prefix, 0))
    return out


def _delete(doc, path):
    for k in path[:-1]:
        doc = doc[k]
    del doc[path[-1]]


def _sweep(src, tmp_path, rel, skip) -> tuple[int, list]:
    """Delete each key (three levels down) of document `rel`, one artifact each: (how many
    were refused with an ArtifactError, the keys whose deletion was not)."""
    import json
    doc = json.loads((src / rel).read_bytes())
    untyped, checked = [], 0
    for i, path in enumerate(_paths(doc)):
        if skip(path):
            continue
        art = copy_artifact(src, tmp_path / f"d{i}.aotc")
        edit_json(art, rel, lambda d: _delete(d, path))
        try:
            assert_refused(art, tmp_path / "PWNED", ArtifactError)
            checked += 1
        except AssertionError as e:
            untyped.append((path, str(e)[:120]))
    return checked, untyped


def test_deleting_any_manifest_key_gives_a_typed_error(mlp_artifact, tmp_path):
    optional = {("target", "native", "table"), ("weights", "transposed"),
                ("files", fmt.SAMPLE_INPUTS), ("files", fmt.SAMPLE_OUTPUTS),
                ("files", fmt.SAMPLE_REFERENCE),
                # a single shard needs no index; blake3 digests and state keys are optional
                ("weights", "map"), ("weights", "state_dict"),
                ("files", fmt.WEIGHTS, "chunks", "blake3"),
                # read by the C++ front end only, which refuses an entry without it
                ("files", fmt.runner_file("forward"))}
    checked, untyped = _sweep(mlp_artifact, tmp_path, fmt.MANIFEST, lambda p: (
        # export_check is a display-only record of what export ran: any part may be absent
        p[0] in ("manifest_sha256", "options", "export_check") or p in optional
        # an entry's stats, and its call signature (format 20: without it, positional only)
        or p[:3] in (("entries", "forward", "stats"), ("entries", "forward", "parameters"))))
    assert not untyped, untyped
    assert checked > 30


def test_deleting_any_plan_key_gives_a_typed_error(mlp_artifact, tmp_path):
    optional = {"stats", "producer", "base", "layout", "reuse", "donate", "fused", "reasons",
                "single", "sizes", "checks", "memory_format", "source"}
    checked, untyped = _sweep(mlp_artifact, tmp_path, PLAN,
                              lambda p: p[-1] in optional or p[0] == "stats")
    assert not untyped, untyped
    assert checked > 15


def test_plan_that_reads_a_freed_slot_is_refused_at_load(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")

    def edit(p):   # move the first free step to the front: later steps read what it freed
        free = _first(p, "free")
        p["steps"].remove(free)
        p["steps"].insert(0, free)
    edit_json(art, PLAN, edit)
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "not bound" in err.what or "frees" in err.what


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_an_extern_result_smaller_than_its_slot_never_reaches_a_kernel(mlp_artifact, tmp_path,
                                                                      runner):
    # a hostile plan that passes every check at load: the first product multiplies by a view
    # of a smaller weight, so ATen returns fewer elements than the slot the next kernel indexes
    # (an out-of-bounds read, unchecked); the runners check a value no kernel wrote before a
    # kernel reads it
    import json
    import torch
    import aotc
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    plan = json.loads((art / PLAN).read_bytes())
    view = _first(plan, "view")
    base = plan["slots"][view["args"][0]["slot"]]
    size = lambda s: __import__("math").prod(s["shape"])   # noqa: E731
    small = next(s["id"] for s in plan["slots"] if s.get("kind") == "weight"
                 and len(s["shape"]) == 2 and size(s) < size(base))
    edit_json(art, PLAN, lambda p: _first(p, "view")["args"][0].update(slot=small))
    m = aotc.load(art, runner=runner)
    x = torch.randn(*m.manifest.entries["forward"].inputs[0].shape)
    with pytest.raises(ArtifactError, match="not what the plan declares") as e:
        m(x)
    assert e.value.where.startswith("slot ") and e.value.expected != e.value.found


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_an_extern_call_ATen_refuses_is_an_artifact_error(mlp_artifact, tmp_path, runner):
    # the first product multiplies the input by itself: ATen's own shape check fails at run
    import torch
    import aotc
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: _first(p, "extern")["args"].__setitem__(
        1, _first(p, "extern")["args"][0]))
    m = aotc.load(art, runner=runner)
    x = torch.randn(*m.manifest.entries["forward"].inputs[0].shape)
    with pytest.raises(ArtifactError, match="failed inside its plan") as e:
        m(x)
    assert e.value.where == PLAN and "RuntimeError" in e.value.found and e.value.fix
