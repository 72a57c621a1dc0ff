"""manifest.json, typed: producers, target, entry points with guards, weights, files.

`parse_manifest(doc)` checks every field (types, ranges, names, paths, expressions over the
declared symbols) and returns a frozen `Manifest`; `Manifest.to_json` is what codegen writes.
The file table is the artifact's boundary: a file is read only if it is listed here, under a
path of the safe form (relative, no `..`, no hidden or odd names), and only through the
artifact reader (artifact/reader.py), which checks its size and hash as it reads it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from aotc.artifact.isa import ORDER as ISA_ORDER
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.fields import At, short
from aotc.artifact.schema.files import FileEntry, Weights, parse_files, parse_weights
from aotc.artifact.schema.generation import Generation, parse_generation
from aotc.artifact.schema.parallel import TensorParallel, parse_parallel
from aotc.artifact.schema.params import parse_parameters
from aotc.artifact.schema.quant import Quantization, parse_quantization
from aotc.artifact.schema.rules import MAX_DIM, MAX_STATE_BYTES
from aotc.artifact.schema.trees import parse_tree
from aotc.artifact.schema.types import DTYPE_SET, ITEMSIZE, WEIGHT_NAME, Device, size_json

PATH = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}/){0,3}[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
ENTRY = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
ARCH = re.compile(r"sm_[0-9]{2,3}a?\Z")
# an entry's fields (required, then the others allowed; "parameters" from format 20), a
# symbol's and an input's (scripts/gen_cpp_rules.py writes them for the C++ front end)
MANIFEST_KEYS = (("format_version", "producer", "model", "target", "options", "entries",
                  "weights", "files", "manifest_sha256"),
                 ("training", "state", "generation", "export_check", "tensor_parallel",
                  "quantization"))
PRODUCER_KEYS = (("aotc", "torch", "python", "platform"), ("triton", "compiler"))
MODEL_KEYS = (("name", "source"), ())
TARGET_KEYS = (("device", "archs", "portable", "native"), ())
TRITON_NATIVE_KEYS = (("kind", "triton", "archs", "kernels"), ("autotune",))
CPP_NATIVE_KEYS = (("libraries", "compiler", "source"), ("table",))
CPP_SOURCE = "kernels/kernels.cpp"
MAX_ENTRIES = 16
ENTRY_KEYS = (("plan", "inputs", "symbols", "relations", "outputs", "output_tree"), ("stats",))
PARAMETERS_SINCE = 20
SYMBOL_KEYS = (("min", "max"), ("example",))
INPUT_KEYS = (("name", "dtype", "shape"), ("values",))
META_KEYS = (("dtype", "shape", "stride"), ())
ISAS = frozenset(ISA_ORDER)
LIBRARY = re.compile(r"kernels/kernels(?:-[a-z0-9-]+)?\.so\Z")
__all__ = ["FileEntry", "Weights", "Manifest", "parse_manifest"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Symbol:
    name: str
    min: int
    max: int
    example: int

    def to_json(self) -> dict:
        return {"example": self.example, "max": self.max, "min": self.min}


@dataclass(frozen=True, slots=True, kw_only=True)
class Input:
    name: str
    dtype: str
    shape: tuple                     # int | expr node per dim
    values: tuple | None = None      # (lo, hi) an integer input's recorded range

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "name": self.name, "shape": size_json(self.shape),
                "values": list(self.values) if self.values is not None else None}


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorMeta:
    dtype: str
    shape: tuple
    stride: tuple

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": size_json(self.shape),
                "stride": size_json(self.stride)}


@dataclass(frozen=True, slots=True, kw_only=True)
class EntrySpec:
    name: str
    plan: str
    inputs: tuple
    symbols: dict                    # name -> Symbol
    relations: tuple                 # expr nodes (boolean)
    outputs: tuple                   # TensorMeta | None per flat output
    output_tree: dict
    stats: dict = field(default_factory=dict)
    parameters: tuple | None = None  # Parameter, ... (schema/params.py; format 20)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return {n: (s.min, s.max) for n, s in self.symbols.items()}

    def to_json(self) -> dict:
        return {"plan": self.plan, "inputs": [i.to_json() for i in self.inputs],
                "symbols": {n: s.to_json() for n, s in self.symbols.items()},
                "relations": [ex.text(r) for r in self.relations],
                "outputs": [o.to_json() if o is not None else None for o in self.outputs],
                "output_tree": self.output_tree, "stats": self.stats,
                **({"parameters": [p.to_json() for p in self.parameters]}
                   if self.parameters is not None else {})}


@dataclass(frozen=True, slots=True, kw_only=True)
class CppNative:
    libraries: tuple                 # (level, library file), lowest level first (format >= 9)
    compiler: str
    source: str
    table: bool = False              # the library exports aotc_kernel_table (format >= 5)

    @property
    def levels(self) -> tuple:
        return tuple(level for level, _ in self.libraries)

    @property
    def isa(self) -> str:
        """The lowest level: what a host needs at least to run these kernels."""
        return self.libraries[0][0]

    def library(self, level: str) -> str:
        return dict(self.libraries)[level]

    def to_json(self) -> dict:
        return {"compiler": self.compiler, "libraries": dict(self.libraries),
                "source": self.source, "table": self.table}


@dataclass(frozen=True, slots=True, kw_only=True)
class TritonNative:
    triton: str
    archs: tuple
    kernels: tuple
    autotune: dict | None = None

    def to_json(self) -> dict:
        out = {"archs": list(self.archs), "kernels": list(self.kernels), "kind": "triton",
               "triton": self.triton}
        if self.autotune is not None:
            out["autotune"] = self.autotune
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    device: Device
    archs: tuple = ()
    portable: bool = False
    native: CppNative | TritonNative | None = None

    def to_json(self) -> dict:
        return {"archs": list(self.archs), "device": self.device.value,
                "native": self.native.to_json() if self.native is not None else None,
                "portable": self.portable}


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    params: tuple
    buffers: tuple
    mutated: tuple
    num_outputs: int
    needs_grad: tuple
    num_fwd_outputs: int

    def to_json(self) -> dict:
        return {"buffers": list(self.buffers), "mutated": list(self.mutated),
                "needs_grad": list(self.needs_grad), "num_fwd_outputs": self.num_fwd_outputs,
                "num_outputs": self.num_outputs, "params": list(self.params)}


@dataclass(frozen=True, slots=True, kw_only=True)
class StateSpec:
    """A persistent tensor of a generator (a KV cache, the position), allocated at load with
    zeros and updated in place by its entries' plans."""
    name: str
    dtype: str
    shape: tuple

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "name": self.name, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    format_version: int
    producer: dict
    model: dict
    target: Target
    options: dict
    entries: dict                    # name -> EntrySpec
    weights: Weights
    training: Training | None = None
    state: tuple = ()                            # StateSpec, ...
    generation: Generation | None = None
    export_check: dict | None = None             # display: whether export ran the artifact
    tensor_parallel: TensorParallel | None = None   # format 8: split over ranks
    quantization: Quantization | None = None     # format 24: weights stored quantized
    files: dict = field(default_factory=dict)   # path -> FileEntry

    def to_json(self) -> dict:
        """Everything but the self-hash (artifact/format.py adds it when writing)."""
        out = {"format_version": self.format_version, "producer": self.producer,
               "model": self.model, "target": self.target.to_json(), "options": self.options,
               "entries": {n: e.to_json() for n, e in self.entries.items()},
               "weights": self.weights.to_json(),
               "files": {p: f.to_json() for p, f in sorted(self.files.items())}}
        if self.training is not None:
            out["training"] = self.training.to_json()
        if self.state:
            out["state"] = [st.to_json() for st in self.state]
        if self.generation is not None:
            out["generation"] = self.generation.to_json()
        if self.export_check is not None:
            out["export_check"] = self.export_check
        if self.tensor_parallel is not None:
            out["tensor_parallel"] = self.tensor_parallel.to_json()
        if self.quantization is not None:
            out["quantization"] = self.quantization.to_json()
        return out


# ----------------------------------------------------------------------------------- parse
def parse_manifest(doc: At, *, complete: bool = True) -> Manifest:
    """`complete`: the file table is filled in, and must list every file the artifact needs
    (False while codegen builds the manifest, before the files are written)."""
    doc.obj(*MANIFEST_KEYS)
    version = doc.get("format_version").int(1, 1 << 16)
    entries = {name: _entry(a, name, version) for name, a in doc.get("entries").items(MAX_ENTRIES)}
    doc.get("entries").check(bool(entries), "at least one entry point", "is empty")
    training = _training(doc.get("training")) if doc.has("training") else None
    doc.get("producer").obj(*PRODUCER_KEYS)
    m = Manifest(format_version=version,
                 producer=_strings(doc.get("producer")), model=_model(doc.get("model")),
                 target=_target(doc.get("target")), options=_scalars(doc.get("options")),
                 entries=entries, weights=parse_weights(doc.get("weights")), training=training,
                 state=_states(doc.get("state", [])), files=parse_files(doc.get("files"), PATH),
                 export_check=display(doc.get("export_check")) if doc.has("export_check")
                 else None)
    if training is not None:
        _check_training(m, doc)
    if doc.has("generation"):
        m = dataclasses.replace(m, generation=parse_generation(doc.get("generation"), m))
    if doc.has("tensor_parallel"):
        doc.get("tensor_parallel").check(m.format_version >= 8, "format version 8 or later",
                                         "appears in an earlier format")
        m = dataclasses.replace(m, tensor_parallel=parse_parallel(
            doc.get("tensor_parallel"), m.weights, complete=complete))
    if doc.has("quantization"):
        m = dataclasses.replace(m, quantization=parse_quantization(
            doc.get("quantization"), m.weights, m.format_version))
    if complete:
        _check_listed(m, doc.get("files"))
    return m


def _check_listed(m: Manifest, files: At) -> None:
    """The files the format requires of this artifact are in its file table."""
    need = [e.plan for e in m.entries.values()]
    native = m.target.native
    if isinstance(native, CppNative):
        need += [path for _, path in native.libraries] + [native.source]
        named = {path for _, path in native.libraries}
        for rel in m.files:     # every library in the file table is one of the levels
            files.check(not LIBRARY.match(rel) or rel in named, f"{rel} named in "
                        "target.native.libraries", f"lists {rel}, a library of no level")
    elif isinstance(native, TritonNative):
        need += [f"kernels/{k}.{ext}" for k in native.kernels for ext in ("json", "py")]
    need += m.weights.shards
    if m.tensor_parallel is not None:
        need += m.tensor_parallel.shards()
    for rel in need:
        files.check(rel in m.files, f"{rel} listed (the artifact needs it)",
                    f"does not list {rel}")


def display(a: At) -> dict:
    """An object shown by `aotc inspect` only (statistics, autotuning records)."""
    a.check(isinstance(a.value, dict), "an object", "is not an object")
    return a.value


def _strings(a: At) -> dict:
    return {k: v.text(256) for k, v in a.items(32)}


def _scalars(a: At) -> dict:
    out = {}
    for k, v in a.items(64):
        v.check(bool(ex.NAME_RE.match(k)), "option names", "is not a name")
        v.check(v.value is None or isinstance(v.value, (bool, int, float, str)),
                "a scalar option value")
        out[k] = v.text(256) if isinstance(v.value, str) else v.value
    return out


def _model(a: At) -> dict:
    a.obj(*MODEL_KEYS)
    return {k: None if a.get(k).is_null() else a.get(k).str(pattern=WEIGHT_NAME, max_len=4096)
            for k in ("name", "source")}


def _target(a: At) -> Target:
    a.obj(*TARGET_KEYS)
    device = a.get("device").enum(Device)
    archs = tuple(x.str(pattern=ARCH) for x in a.get("archs").list(16))
    n = a.get("native")
    native = None
    if not n.is_null():
        if n.has("kind"):
            n.obj(*TRITON_NATIVE_KEYS)
            n.get("kind").str(choices={"triton"})
            at = n.get("autotune", None)
            native = TritonNative(triton=n.get("triton").text(64),
                                  archs=tuple(x.str(pattern=ARCH) for x in n.get("archs").list(16)),
                                  kernels=tuple(k.ident() for k in n.get("kernels").list(1 << 16)),
                                  autotune=None if at.is_null() else display(at))
        else:
            n.obj(*CPP_NATIVE_KEYS)
            native = CppNative(libraries=_libraries(n.get("libraries")),
                               compiler=n.get("compiler").text(512),
                               source=n.get("source").str(choices={CPP_SOURCE}),
                               table=n.get("table", False).bool())
    return Target(device=device, archs=archs, portable=a.get("portable").bool(), native=native)


def _libraries(a: At) -> tuple:
    """level -> library file: known levels of one architecture, each in its own file
    (kernels/kernels-<level>.so; the one kernels/kernels.so of a migrated format <= 7)."""
    out = []
    for level, path in a.items(len(ISAS)):
        path.check(level in ISAS, f"a CPU level ({', '.join(sorted(ISAS))})",
                   f"names the level {short(level, 40)}")
        legacy = len(a.value) == 1 and path.value == "kernels/kernels.so"
        out.append((level, path.str(choices={f"kernels/kernels-{level}.so"} |
                                    ({"kernels/kernels.so"} if legacy else set()))))
    a.check(bool(out), "at least one library", "is empty")
    arches = {level.startswith("arm") for level, _ in out}
    a.check(len(arches) == 1, "levels of one architecture", "mixes x86-64 and aarch64")
    return tuple(sorted(out, key=lambda e: ISA_ORDER.index(e[0])))



def _states(a: At) -> tuple:
    out, names, total = [], set(), 0
    for st in a.list(1 << 16):
        st.obj(required=("name", "dtype", "shape"))
        spec = StateSpec(name=st.get("name").str(pattern=WEIGHT_NAME, max_len=1024),
                         dtype=st.get("dtype").str(choices=DTYPE_SET),
                         shape=tuple(d.int(0, MAX_DIM) for d in st.get("shape").list(16)))
        st.check(spec.name not in names, "state names listed once", "repeats a name")
        names.add(spec.name)
        total += spec.nbytes
        st.check(total <= MAX_STATE_BYTES, f"state of at most {MAX_STATE_BYTES} bytes in all",
                 "is larger")
        out.append(spec)
    return tuple(out)


def _training(a: At) -> Training:
    a.obj(required=("params", "buffers", "mutated", "num_outputs", "needs_grad"),
          optional=("num_fwd_outputs",))
    names = lambda k: tuple(x.str(pattern=WEIGHT_NAME, max_len=1024)   # noqa: E731
                            for x in a.get(k).list(1 << 20))
    return Training(params=names("params"), buffers=names("buffers"), mutated=names("mutated"),
                    num_outputs=a.get("num_outputs").int(0, 1 << 20),
                    needs_grad=tuple(x.bool() for x in a.get("needs_grad").list(1 << 20)),
                    num_fwd_outputs=a.get("num_fwd_outputs", 0).int(0, 1 << 20))


def _check_training(m: Manifest, doc: At) -> None:
    """A training artifact's counts agree with its entries: forward returns the model's
    outputs (its output tree indexes those alone, one needs_grad flag each), then the mutated
    buffers' new values, then what backward saves."""
    t, a = m.training, doc.get("training")
    doc.get("entries").check({"forward", "backward"} <= set(m.entries),
                             "forward and backward entries", "misses one of them")
    fwd = m.entries["forward"]
    a.get("needs_grad").check(len(t.needs_grad) == t.num_outputs,
                              f"{t.num_outputs} flags (one per output)",
                              f"has {len(t.needs_grad)}")
    a.get("num_outputs").check(t.num_outputs + len(t.mutated) <= len(fwd.outputs),
                               f"at most {len(fwd.outputs) - len(t.mutated)} (forward's "
                               "outputs less the mutated buffers)", f"is {t.num_outputs}")
    a.get("mutated").check(set(t.mutated) <= set(t.buffers), "names among the buffers",
                           "names another")
    parse_tree(doc.get("entries").get("forward").get("output_tree"), t.num_outputs)


def _entry(a: At, name: str, version: int) -> EntrySpec:
    a.check(bool(ENTRY.match(name)), "an entry name (lowercase identifier)", "is not a name")
    a.obj(ENTRY_KEYS[0], ENTRY_KEYS[1] + (("parameters",) if version >= PARAMETERS_SINCE else ()))
    a.get("plan").str(choices={f"plans/{name}.json"})
    symbols = {n: _symbol(s, n) for n, s in a.get("symbols").items(256)}
    inputs = tuple(_input(i, symbols) for i in a.get("inputs").list(4096))
    outputs = tuple(None if o.is_null() else _meta(o, symbols)
                    for o in a.get("outputs").list(1 << 16))
    return EntrySpec(name=name, plan=f"plans/{name}.json", inputs=inputs, symbols=symbols,
                     relations=tuple(r.expr(symbols, boolean=True)
                                     for r in a.get("relations").list(256)),
                     outputs=outputs, output_tree=parse_tree(a.get("output_tree"), len(outputs)),
                     stats=display(a.get("stats", {})),
                     parameters=parse_parameters(a.get("parameters"), inputs)
                     if a.has("parameters") else None)


def _symbol(a: At, name: str) -> Symbol:
    a.check(bool(ex.NAME_RE.match(name)) and name not in ex.KEYWORDS,
            "a symbol name (an ASCII identifier)", "is not a name")
    a.obj(*SYMBOL_KEYS)
    lo, hi = a.get("min").int(0, MAX_DIM), a.get("max").int(0, MAX_DIM)
    a.check(lo <= hi, "min <= max", f"has min {lo} > max {hi}")
    example = a.get("example", lo).int(lo, hi)
    return Symbol(name=name, min=lo, max=hi, example=example)


def _input(a: At, symbols: dict) -> Input:
    a.obj(*INPUT_KEYS)
    values = a.get("values", None)
    if not values.is_null():
        lo, hi = (v.int(-ex.MAX_INT - 1, ex.MAX_INT) for v in values.list(2, 2))
        values.check(lo <= hi, "[lo, hi] with lo <= hi")
        values = (lo, hi)
    else:
        values = None
    return Input(name=a.get("name").str(pattern=WEIGHT_NAME, max_len=256),
                 dtype=a.get("dtype").str(choices=DTYPE_SET),
                 shape=tuple(d.size(symbols, MAX_DIM) for d in a.get("shape").list(16)),
                 values=values)


def _meta(a: At, symbols: dict) -> TensorMeta:
    a.obj(*META_KEYS)
    shape = tuple(d.size(symbols, MAX_DIM) for d in a.get("shape").list(16))
    stride = tuple(d.size(symbols, MAX_DIM) for d in a.get("stride").list(16))
    a.check(len(stride) == len(shape), "one stride per dim")
    return TensorMeta(dtype=a.get("dtype").str(choices=DTYPE_SET), shape=shape, stride=stride)
