"""The artifact format: the one module that names every file of an artifact directory.

Codegen writes artifacts through `write_artifact` (the manifest, plans and launch specs as
typed documents of artifact/schema); the runtime reads them through artifact/reader.py, which
refuses anything damaged, tampered with, malformed or of an unknown version before a single
weight is read.

    NAME.aotc/
      manifest.json              format version, producers, target, entry points, guards, the
                                 weights index, and the size and digests of every other file
      weights.safetensors        parameters, buffers and constants (never pickle), or several
      weights-0000K-of-0000N.safetensors   shards of them (artifact/shards.py)
      plans/<entry>.json         the launch plan of each entry point
      runner/<entry>.json        CPU artifacts: the C++ runner's spec of that plan (format >= 10)
      samples/inputs.safetensors example inputs recorded at export (for `aotc verify`)
      samples/outputs.safetensors eager outputs for those inputs
      samples/reference.safetensors  optional: float64 outputs for them (by output position)
      kernels/kernels.cpp        generated C++ kernels (readable source)
      kernels/kernels-<level>.so the same, compiled for each CPU level the manifest names
                                 (x86-64-v2, -v3, -v4; before format 9 one kernels/kernels.so)
      kernels/<name>.py          CUDA artifacts: one Triton kernel (readable, self-contained)
      kernels/<name>.<arch>.cubin  the same, compiled for each GPU arch the manifest names
      kernels/<name>.json        its launch spec: parameters, block sizes, grid, per-arch metadata
      signatures.json            optional: Ed25519 signatures over manifest.json (aotc sign)
      tokenizer/                 optional: a Hugging Face model folder's tokenizer files
                                 (TOKENIZER_FILES: tokenizer.json, its configs, the generation
                                 config, the chat template), listed and hashed like every file

    NAME.aotcpkg                 the same files as one uncompressed file, read in place
                                 (aotc pack; layout in artifact/package.py)
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from aotc.errors import ArtifactError
from aotc.artifact import publish
from aotc.artifact.schema.manifest import FileEntry

FORMAT_VERSION = 26
# Dated changelog: one line per version. Artifacts of every version listed here must load or be
# refused with a clear error; tests/fixtures keeps a small artifact of each. This aotc writes
# FORMAT_VERSION and reads every earlier version listed (their plans are valid plans of it).
CHANGELOG = {
    1: ("2026-11-30", "first format: manifest.json, weights.safetensors, plans/<entry>.json "
                      "with kernel/extern/view/free steps, kernels/ (C++ source and library, or Triton "
                      "sources, cubins per arch and launch metadata), samples/"),
    2: ("2026-11-30", "plans: a kernel output may have a permuted dense layout (slot "
                      "'contiguous': false, allocated with its 'stride': channels-last "
                      "activations), and a weight slot may say 'memory_format': 'channels_last' "
                      "(converted at load); a reader of version 1 would misread both"),
    3: ("2026-11-30", "Triton kernels may take their dim sizes as 'i32' parameters (32-bit "
                      "index arithmetic where the declared maxima allow it); a reader of "
                      "version 2 refuses them"),
    4: ("2026-11-30", "weights.safetensors may store a 2-d matmul weight as its [K, N] "
                      "transpose: its plan slot says 'layout': 'transposed' (logical shape "
                      "[N, K], strides [1, N]) and manifest weights.transposed lists it; a "
                      "reader of version 3 would bind it with the wrong shape"),
    5: ("2026-12-01", "one typed schema (runtime/schema): every field required where it was "
                      "implied (slot 'contiguous'), unknown fields refused, sizes in the "
                      "expression grammar; slots lose the informational 'local'; a C++ library "
                      "exports aotc_kernel_table (name, address, argument and size counts, "
                      "pointer dtypes per kernel; manifest target.native.table) and kernels are "
                      "found only there; kernel steps may list index 'checks' (the argument "
                      "holding an index, the size it indexes, whether negatives wrap); the "
                      "optional signatures.json beside the manifest (Ed25519 over its bytes). "
                      "Versions 1-4 are migrated when read (artifact/schema/migrate.py)"),
    6: ("2026-12-01", "generators: plans may hold slots of kind 'state' (a persistent tensor of "
                      "the module, named in the manifest's 'state': name, dtype, shape, "
                      "allocated with zeros at load and updated in place by the plans) and call "
                      "aotc's own op aotc::decode_attention; the manifest's 'generation' names "
                      "the prefill and decode entries, the position state, the cache length, "
                      "batch and vocab; a reader of version 5 refuses them"),
    7: ("2026-12-01", "weights may be several safetensors shards (weights-0000K-of-0000N."
                      "safetensors; manifest weights.shards, and weights.map: tensor -> shard); "
                      "a file entry may carry chunk digests instead of one sha256 (chunks: "
                      "size, sha256 per chunk, optionally blake3 per chunk), checked in "
                      "parallel and as the chunks stream to a GPU; weights.state_dict lists "
                      "the model's state_dict keys (parameters and persistent buffers, tied "
                      "names included); the other stored tensors are non-persistent buffers "
                      "and constants; plans' call steps may name the model's source line "
                      "('source') and the manifest may say whether export ran the artifact "
                      "('export_check'), both for display; the C++ plan runner runs the same "
                      "plans. Versions 5-6 are migrated when read (one shard, no index)"),
    8: ("2026-12-01", "tensor-parallel artifacts: the manifest's 'tensor_parallel' (world "
                      "size; 'sharding': weight -> the dim split over the ranks; 'ranks': each "
                      "rank's shards and index, weights-rank<R>[-0000K-of-0000N].safetensors, "
                      "rank 0's being the 'weights' section's) and plans calling aotc's own "
                      "collectives aotc::all_reduce and aotc::all_gather (over "
                      "torch.distributed's default group); "
                      "loading needs a process group of that world size. Versions 5-7 load "
                      "as they are"),
    9: ("2026-12-01", "a CPU artifact may carry its C++ kernels built for several CPU levels: "
                      "target.native.libraries (level -> kernels/kernels-<level>.so, one arch, "
                      "lowest first) replaces target.native.isa and .library; the loader runs "
                      "the best level this CPU supports. An artifact may also travel as one "
                      "file, a package (artifact/package.py; the same manifest and files, "
                      "aligned, with an index). Versions 1-8 are migrated when read (their one "
                      "library, kernels/kernels.so, at their one level)"),
    10: ("2026-12-01", "CPU artifacts carry a runner file per entry, runner/<entry>.json "
                       "(runtime/runner_file.py): the C++ runner's spec of the entry's plan "
                       "and guards as data (kernels by name and signature, weights by name "
                       "with their load-time transform, the texts guard errors quote), listed "
                       "and hashed like every file, for the Python-free C++ front end "
                       "(aotc::Module). Versions 1-9 load as they are, in Python; the C++ "
                       "front end refuses them (no runner file)"),
    11: ("2026-12-02", "a CUDA kernel's build for sm_90 or newer may say 'pdl': true (launch "
                       "specs, kernels/<name>.json): its cubin begins by waiting for the "
                       "kernel before it (griddepcontrol.wait) and is launched with "
                       "programmatic stream serialization; every Triton source takes the "
                       "constexpr AOTC_PDL (False: the interpreter, older GPUs). A reader of "
                       "version 10 refuses the field; versions 1-10 load as they are"),
    12: ("2026-12-04", "aotc::decode_attention and aotc::decode_attention_write may take up "
                       "to three more arguments after the scale: a sliding window (int: only "
                       "the last `window` positions are attended, 0 for none), a score "
                       "soft-cap (float: scores become softcap * tanh(score / softcap), 0 for "
                       "none) and attention sinks (a tensor slot [heads]: one more logit per "
                       "head in each softmax, its weight dropped), written only where a model "
                       "has them (Gemma 2 and 3, Mistral, GPT-OSS); a reader of version 11 "
                       "would refuse their argument count. Versions 1-11 load as they are"),
    13: ("2026-12-05", "runner files: a kernel step's arguments are [slot, lay out, "
                       "contiguous, strides, shape, dtype] (shape and dtype of the slot where "
                       "the argument is laid out, dtype '' elsewhere): the C++ front end checks "
                       "a value no kernel wrote (an ATen result, a view) against them before a "
                       "kernel indexes it, and refuses runner files of formats 10-12 that have "
                       "kernel steps (re-export, or load from Python, which checks every format "
                       "from its plans). Versions 1-12 load in Python as they are"),
    14: ("2026-12-05", "CUDA artifacts carry runner files too: a Triton kernel step ends with "
                       "[grid, error code] (its grid's three dims as sizes of the runner file, "
                       "the code it flags an index out of range with, 0 for none), so the C++ "
                       "front end runs CUDA artifacts (their cubins through the driver API). "
                       "A reader of version 13 would refuse the longer kernel step; versions "
                       "1-13 load in Python as they are (the C++ front end refuses CUDA "
                       "artifacts before 14)"),
    15: ("2026-12-05", "plans may call aotc::fft.default(x, dims, mode[, size]): torch.fft "
                       "over the dims set in the bitmask `dims`, of x real or complex as pairs "
                       "(fftn, ifftn, rfftn: pairs out; irfftn: real out, `size` long along its "
                       "one-sided dim; runtime/fourier.py: mode's bits say which, pairs, the "
                       "norm and the one-sided dim); exports before it wrote Fourier transforms "
                       "as matrix products. A reader of version 14 refuses the op; versions "
                       "1-14 load as they are"),
    16: ("2026-12-05", "value-dependent sizes: a call step may say \"binds\": {symbol: "
                       "[result, dim or null]}, a size its result defines (x[mask]'s rows, "
                       "nonzero's count, .item()), declared with its range in the entry's "
                       "symbols; later steps size buffers with it, and both runners check it "
                       "against its range before they run. Runner files: such a call step "
                       "ends with [[symbol, result, dim or -1, lo, hi], ...] and `symbols` "
                       "lists the inputs' symbols first. A reader of version 15 refuses "
                       "\"binds\"; versions 1-15 load as they are"),
    17: ("2026-12-06", "C++ kernels check the room of their buffers: each takes, after its "
                       "pointers, an int64 array of the elements each pointer has up to the end "
                       "of its storage (then as many free entries) and returns -1 - i, the "
                       "extent it needed stored at entry n + i, when pointer i has less room "
                       "than the layout it was compiled for spans (codegen/cpp/room.py); such "
                       "a kernel's table entry ends its pointer dtypes with \";room\", and a "
                       "library with a table is read through it whatever the manifest's "
                       "native.table says. A reader of version 16 calls such kernels without "
                       "the array; versions 1-16 load as they are (their kernels unchecked)"),
    18: ("2026-12-06", "a generator's prefill and decode entries may compute the greedy token "
                       "too: the manifest's generation.token is the index of both entries' "
                       "flat output holding the argmax of the logits, int64 [batch, 1], which "
                       "their output trees leave out; greedy generation feeds it back instead "
                       "of taking an argmax after the plan. A reader of version 17 refuses "
                       "the field; versions 1-17 load as they are (the runtime takes the "
                       "argmax)"),
    19: ("2026-12-07", "a CUDA artifact's launch specs (kernels/<name>.json) say how many "
                       "elements each kernel indexes past each buffer's pointer ('extents', "
                       "one size expression per input, then output), and both runners refuse "
                       "a call whose tensors have less room (a plan slot smaller than its "
                       "kernel's buffer) before the kernel runs. A reader of version 18 "
                       "refuses the field; versions 1-18 load as they are, their Triton "
                       "kernels unchecked"),
    20: ("2026-12-07", "an entry may record its call signature ('parameters': the model's "
                       "forward parameter names, one per input in order, then those the export "
                       "left at a scalar default, with it; artifact/schema/params.py), so "
                       "`m(input_ids=..., attention_mask=...)` binds by name. A reader of "
                       "version 19 refuses the field; versions 1-19 load as they are and take "
                       "positional arguments only"),
    22: ("2026-12-07", "generators may hold slots (continuous batching, --max-batch N): the "
                       "manifest's generation.slots = N (equal to its batch), the position "
                       "state int64 [N] (each slot's own), prefill taking (input_ids [1, T], "
                       "slot [1], start [1]) and writing that slot alone, decode taking "
                       "input_ids [N, 1]; the prefill's greedy token is [1, 1]; optional "
                       "generation.buckets [{rows: K, entry}] name decode entries stepping "
                       "slots 0..K-1 only, whose kernels are named decode_K_kernelN. A reader of "
                       "version 21 or older refuses the field; versions 1-21 load as they are "
                       "(one batch in lockstep)"),
    23: ("2026-12-07", "an artifact may carry model.sig at its root (a package: as a member): "
                       "an OpenSSF Model Signing bundle (Sigstore bundle, DSSE envelope, in-toto "
                       "statement, method 'files', sha256) whose resources are manifest.json and "
                       "every file the manifest lists, with model.sig and signatures.json "
                       "ignored; like signatures.json it is not listed in the manifest. A "
                       "reader of version 22 or older refuses a package holding it; versions "
                       "1-22 load as they are"),
    24: ("2026-12-07", "weight-only quantized artifacts: the manifest's optional "
                       "'quantization' (scheme; layers: each full-precision weight's state_dict "
                       "key -> kind, scheme, dtype, shape [N, K], and the stored names of its "
                       "int8 values [N, K] and float32 scales [N], one per output channel; an "
                       "optional 'accuracy' measured at export, for display), checked against "
                       "every plan slot that reads them (artifact/schema/quant.py). A reader of "
                       "version 23 refuses the field; versions 1-23 load as they are (no "
                       "quantized weights)"),
    26: ("2026-12-07", "int4 weight-only layers in the manifest's 'quantization': a layer "
                       "with scheme 'int4' says its 'group_size' (32, 64 or 128, dividing K) "
                       "and stores packed uint8 values [N, K/2] (two a byte, the even weight in "
                       "the low nibble, value = nibble - 8) under '<key>_int4' and float32 "
                       "scales [N, K/G], one per group (artifact/quant.py); 'group_size' on "
                       "any other scheme is refused. A reader of version 24 or 25 refuses "
                       "int4 layers; versions 1-25 load as they are"),
}
# Optional additions within a version (readers of that version ignore them; no new version):
#   2026-11-30  target.native.autotune (a summary of --autotune, or why it was skipped) and
#               kernels/<name>.json "autotune" (each kernel's timed candidates and choice)
#   2026-11-30  kernels/<name>.json archs.<arch>.div16: a second cubin of a kernel with size
#               parameters, compiled for sizes divisible by 16 (launched when they are; the
#               plain cubin, valid for every size, otherwise)
#   2026-12-06  kernels of one shape (the same code but for names, codegen/shapes.py) share:
#               a cubin (each kernel's file holds the same bytes, its "symbol" the first
#               kernel's name), an error code (a flagged code names every step storing it),
#               a C++ function (several table entries at one address). Nothing a reader of
#               version 17 checks changes; one that maps a code to its first step alone may
#               name another kernel of the shape in an index error's message
#   2026-12-07  samples/reference.safetensors: the model's float64 outputs for the recorded
#               inputs (float outputs only, named by flat output position; float64, each the
#               shape of its output), so `aotc verify` tells rounding from a wrong result
#   2026-12-07  tokenizer/<name>: a Hugging Face folder's tokenizer files (TOKENIZER_FILES),
#               listed and hashed in the file table like every file (signatures cover them);
#               read by runtime/tokenizer.py. A reader that ignores them loads the artifact
#               as before (token ids in, token ids out)

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
SAMPLE_INPUTS = "samples/inputs.safetensors"
SAMPLE_OUTPUTS = "samples/outputs.safetensors"
SAMPLE_REFERENCE = "samples/reference.safetensors"   # optional: float64 runs of float outputs
KERNELS_DIR = "kernels"
RUNNER_DIR = "runner"
KERNEL_SOURCE = "kernels/kernels.cpp"
LEGACY_KERNEL_LIBRARY = "kernels/kernels.so"     # formats 1-7: the one library
TOKENIZER_DIR = "tokenizer"
TOKENIZER_JSON = "tokenizer.json"
# The tokenizer files an artifact may carry under TOKENIZER_DIR, with the most bytes read of each
TOKENIZER_FILES = {TOKENIZER_JSON: 64 << 20, "tokenizer_config.json": 16 << 20,
                   "special_tokens_map.json": 1 << 20, "generation_config.json": 1 << 20,
                   "chat_template.jinja": 1 << 20, "chat_template.json": 1 << 20}


# after a kernel's pointer dtypes in the library's table: it takes the room of its pointers
ROOM_MARKER = ";room"


def kernel_library(level: str) -> str:
    """The C++ kernel library built for CPU level `level` (format >= 9)."""
    return f"{KERNELS_DIR}/kernels-{level}.so"

SELF_HASH_KEY = "manifest_sha256"
SIGNATURES = "signatures.json"     # beside the manifest, never listed in it (it signs it)
OMS_SIGNATURE = "model.sig"        # an OMS bundle over the files (format 23; artifact/oms.py)
UNLISTED = (MANIFEST, SIGNATURES, OMS_SIGNATURE)    # the files a manifest never lists


def tokenizer_file(name: str) -> str:
    return f"{TOKENIZER_DIR}/{name}"


def plan_file(entry: str) -> str:
    return f"plans/{entry}.json"


def runner_file(entry: str) -> str:
    """The C++ runner's spec of an entry (format >= 10, CPU artifacts; runtime/runner_file.py)."""
    return f"{RUNNER_DIR}/{entry}.json"


def triton_source_file(kernel: str) -> str:
    return f"{KERNELS_DIR}/{kernel}.py"


def triton_cubin_file(kernel: str, arch: str, variant: str | None = None) -> str:
    """A kernel's cubin for `arch`; `variant` "div16": built for sizes divisible by 16."""
    return f"{KERNELS_DIR}/{kernel}.{arch}{'.' + variant if variant else ''}.cubin"


def triton_launch_file(kernel: str) -> str:
    return f"{KERNELS_DIR}/{kernel}.json"


def dumps(obj) -> bytes:
    """Canonical JSON: sorted keys, fixed indentation, so equal content means equal bytes."""
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------- write

def write_artifact(dest: str | os.PathLike, files: dict[str, bytes], manifest,
                   check=None, weights: dict | None = None, shard_size: int | None = None,
                   rank_weights: list | None = None) -> Path:
    """Write `files` plus `manifest` (a schema Manifest) listing their hashes, atomically.
    `weights` (stored name -> tensor or shards.Lazy) are written as safetensors shards of at
    most `shard_size` bytes, tensor by tensor (artifact/shards.py), and indexed in the manifest.

    The directory is built beside `dest` and swapped into place in one rename, so a reader (or a
    killed export) sees either the previous artifact or the new one, never a mixture; the
    manifest is checked by the same parser that loading uses before the swap.
    `check(tmp_dir)`, if given, runs on the complete directory before the swap (raising keeps
    the previous artifact). Stale staging directories of killed exports are removed first.
    `rank_weights`: tensor-parallel artifacts, the weights of ranks 1.. (`weights` are rank
    0's), each rank's written as its own shards (`weights-rank<R>...`).
    """
    dest = publish.check_destination(dest)
    staging = publish.staging_beside(dest)
    try:
        tmp = staging.path
        entries, manifest = _write_weights(tmp, manifest, weights, shard_size, rank_weights)
        for rel, data in sorted(files.items()):
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            entries[rel] = FileEntry(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        (tmp / MANIFEST).write_bytes(_manifest_bytes(manifest, entries))
        publish.fsync_tree(tmp)
        if check is not None:
            check(tmp)
        publish.publish_mode(tmp)
        publish.swap_into_place(tmp, dest)
    finally:
        staging.remove()
    return dest


def _write_weights(tmp: Path, manifest, weights: dict | None, shard_size: int | None,
                   rank_weights: list | None = None):
    """Shards of `weights` (and of each rank's) written under `tmp`: (their file entries, the
    manifest indexing them)."""
    import dataclasses
    if weights is None:
        return {}, manifest
    from aotc.artifact.schema.parallel import RankWeights
    from aotc.artifact.shards import DEFAULT_CAP, write_shards
    if rank_weights is None:
        entries, index = write_shards(tmp, weights, shard_size or DEFAULT_CAP)
        w = dataclasses.replace(manifest.weights, shards=tuple(entries), map=index)
        return entries, dataclasses.replace(manifest, weights=w)
    entries, ranks = {}, []
    for rank, part in enumerate([weights, *rank_weights]):
        files, index = write_shards(tmp, part, shard_size or DEFAULT_CAP,
                                    prefix=f"weights-rank{rank}")
        entries.update(files)
        ranks.append(RankWeights(shards=tuple(files), map=index))
    w = dataclasses.replace(manifest.weights, shards=ranks[0].shards, map=ranks[0].map)
    tp = dataclasses.replace(manifest.tensor_parallel, ranks=tuple(ranks))
    return entries, dataclasses.replace(manifest, weights=w, tensor_parallel=tp)


def _manifest_bytes(manifest, entries: dict) -> bytes:
    """The manifest with its file table and self-hash, checked by the parser loading uses."""
    import dataclasses

    from aotc.artifact.schema import parse_manifest
    from aotc.artifact.schema.fields import At
    manifest = dataclasses.replace(manifest, format_version=FORMAT_VERSION, files=entries)
    doc = manifest.to_json()
    doc[SELF_HASH_KEY] = hashlib.sha256(dumps(doc)).hexdigest()
    parse_manifest(At.root(MANIFEST, doc))     # written through the schema it is read with
    return dumps(doc)


# ------------------------------------------------------------------------------------------ read

def read_manifest(path: str | os.PathLike, *, verify_hashes: bool = True, trusted_keys=None):
    """The typed manifest of an artifact, after checking it and the size and sha256 of every
    file it lists (artifact/reader.py). Raises ArtifactError, naming the file and the field,
    for anything missing, damaged, malformed or of another version."""
    from aotc.artifact.reader import Artifact
    art = Artifact(path, verify_hashes=verify_hashes, trusted_keys=trusted_keys)
    try:
        art.verify_all()
    finally:
        art.close()
    return art.manifest


def parse_manifest_bytes(raw: bytes, where: str) -> dict:
    """manifest.json's JSON after checking its self-hash, its canonical form and its format
    version (the typed parse follows, artifact/schema/manifest.py)."""
    from aotc.artifact.schema.fields import load_json
    damaged = dict(where=where, fix="re-export the model; do not edit artifacts by hand")
    manifest = load_json(raw, MANIFEST).value
    if not isinstance(manifest, dict) or not isinstance(manifest.get(SELF_HASH_KEY), str):
        raise ArtifactError(f"{MANIFEST} is damaged: no {SELF_HASH_KEY}",
                            expected=f"an object with {SELF_HASH_KEY}",
                            found=type(manifest).__name__, **damaged)
    recorded = manifest.pop(SELF_HASH_KEY)
    actual = hashlib.sha256(dumps(manifest)).hexdigest()
    manifest[SELF_HASH_KEY] = recorded
    if actual != recorded or dumps(manifest) != raw:
        raise ArtifactError(f"{MANIFEST} was modified after export (hash mismatch)",
                            expected=recorded, found=actual, **damaged)
    _check_version(manifest, where)
    return manifest


def _check_version(manifest: dict, where: str) -> None:
    version = manifest.get("format_version")
    if type(version) is int and version in CHANGELOG and version <= FORMAT_VERSION:
        return
    newer = type(version) is int and version > FORMAT_VERSION
    raise ArtifactError(
        f"artifact format version {version!r} is not supported by this aotc", where=where,
        expected=f"format version {FORMAT_VERSION} (known: {sorted(CHANGELOG)})",
        found=version if type(version) is int else repr(version)[:40], fix=("upgrade aotc to load artifacts of a newer format"
                                       if newer else "re-export the model with this aotc"))
