"""Write the format fixtures of the current FORMAT_VERSION into tests/fixtures.

    python scripts/make_fixtures.py            # format_v<N>_tiny.aotc and format_v<N>_kernels.aotc
    python scripts/make_fixtures.py tp         # format_v<N>_tp.aotc only
    python scripts/make_fixtures.py cuda       # format_v<N>_cuda.aotc only
    python scripts/make_fixtures.py generator  # format_v<N>_generator.aotc only
    python scripts/make_fixtures.py slots      # format_v<N>_slots.aotc only
    python scripts/make_fixtures.py kernels_fft  # format_v<N>_kernels_fft.aotc only
    python scripts/make_fixtures.py kernels_select  # format_v<N>_kernels_select.aotc only
    python scripts/make_fixtures.py signed     # format_v<N>_signed.aotc and its .pub only
    python scripts/make_fixtures.py kernels_int8   # format_v<N>_kernels_int8.aotc only
    python scripts/make_fixtures.py kernels_int4   # format_v<N>_kernels_int4.aotc only

`tiny` is extern-only (it loads on any host); `kernels` holds C++ kernels built for every CPU
level from the x86-64-v2 baseline up to the writing host's (`--isa auto`, format >= 9; the
fixtures of formats 4-8 hold one library for the x86-64 baseline). The model has what the
weights index must describe: three shards (a 64-byte shard size), a tied weight and a
non-persistent buffer. `tp` is extern-only and tensor-parallel over 2 ranks (a SwiGLU MLP split
by its intermediate size, format >= 8): each rank's weights in shards of 64 bytes, one
all-reduce per call. `cuda` (format >= 11) holds Triton kernels cross-compiled for sm_80 and
sm_90 (the sm_90 cubins built for programmatic dependent launch); it runs here through Triton's
interpreter. `generator` (format >= 12) is samples/llama.py, tiny, with a sliding window,
soft-capped scores and attention sinks, exported for decoding, extern-only (its decode attention
calls aotc's op with all three extra arguments). `slots` (format >= 22) is the same sample
without a window (a ring holds no slots), soft-capped and with sinks, exported with 2 cache
slots (`--max-batch 2`: per-slot positions) and a decode bucket of one slot, extern-only. `kernels_fft` (format >= 15) holds a
spectral filter (rfft, irfft: aotc::fft) between two linear layers and C++ kernels like
`kernels`.
`kernels_select` (format >= 16) selects rows by their values (x[mask]: a call binds the row
count) through a linear layer and scatters them back. `signed` (format >= 23) is `tiny` signed
with a fresh EC P-256 key as an OpenSSF Model Signing bundle (model.sig); the public key is kept
beside it (format_v<N>_signed.pub), the private key is thrown away. `kernels_int8` (format >= 24) is the
SwiGLU MLP of `tp` exported with `--quantize int8` (the manifest's quantization: int8 weights
and float32 scales, the accuracy measured at export) and C++ kernels like `kernels`.
`kernels_int4` (format >= 26) is a two-layer MLP exported with `--quantize int4 --group-size 32`:
its second layer (32 inputs) stored as packed int4 with a float32 scale per group of 32, its
first (4 inputs, which groups of 32 do not divide) kept in full precision; C++ kernels.
Fixtures of earlier versions are never rewritten: tests/test_format_fixtures.py loads every one
of them with the current reader.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

import aotc
from aotc.artifact import format as fmt

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight                       # tied
        self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x)))) * self.scale


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = torch.nn.Linear(4, 8, bias=False), torch.nn.Linear(4, 8, bias=False)
        self.w2 = torch.nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class Int4MLP(torch.nn.Module):
    """4 -> 32 -> 4: only the second layer's rows are long enough for groups of 32."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Fourier(torch.nn.Module):
    """A spectral filter between two products: rfft, a complex product, irfft (aotc::fft,
    format >= 15)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        spectrum = torch.fft.rfft(self.a(x))
        return self.b(torch.fft.irfft(spectrum * spectrum.abs(), n=8))


class Select(torch.nn.Module):
    """Rows chosen by their values through a linear layer and scattered back: x[keep] has a
    value-dependent row count, bound by the call that selects them (format >= 16)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        keep = x.sum(-1) > 0
        rows = torch.relu(self.a(x[keep]))
        return torch.zeros_like(x).index_put((keep,), rows), rows


def tiny_generator(**overrides):
    from importlib.util import module_from_spec, spec_from_file_location
    spec = spec_from_file_location("aotc_sample_llama", FIXTURES.parent.parent / "samples" /
                                   "llama.py")
    sample = module_from_spec(spec)
    sys.modules[spec.name] = sample          # capture looks the model's module up by name
    spec.loader.exec_module(sample)
    size = dict(max_len=16, layers=1, dim=32, heads=4, kv_heads=2, hidden=64, vocab=64,
                window=4, softcap=3.0, sinks=True)
    return sample.Net(**{**size, **overrides})


KINDS = {"tiny": (Tiny, {"codegen": False}), "kernels": (Tiny, {"isa": "auto"}),
         "tp": (TinyMLP, {"codegen": False, "tensor_parallel": 2}),
         "cuda": (TinyMLP, {"target": "cuda:sm_80,sm_90"}),
         "generator": (tiny_generator, {"decode": True, "max_cache_len": 16, "codegen": False}),
         "slots": (lambda: tiny_generator(window=0),
                   {"decode": True, "max_cache_len": 16, "max_batch": 2, "slot_buckets": "1",
                    "codegen": False}),
         "kernels_fft": (Fourier, {"isa": "auto"}),
         "kernels_select": (Select, {"isa": "auto"}),
         "signed": (Tiny, {"codegen": False}),
         "kernels_int8": (TinyMLP, {"isa": "auto", "quantize": "int8"}),
         "kernels_int4": (Int4MLP, {"isa": "auto", "quantize": "int4", "group_size": 32})}


def sign_fixture(dest: Path) -> None:
    """Sign `dest` (model.sig) with a new P-256 key; keep only its public key, beside it."""
    import tempfile
    from aotc.artifact.signing import generate_keys, sign_artifact
    with tempfile.TemporaryDirectory() as tmp:
        private, public = generate_keys(Path(tmp) / "key")
        sign_artifact(dest, private)
        shutil.copy(public, dest.with_suffix(".pub"))


def main(kinds=("tiny", "kernels")) -> int:
    for kind in kinds:
        make, options = KINDS[kind]
        torch.manual_seed(0)
        model = make().eval()
        x = torch.randint(0, 64, (1, 5)) if options.get("decode") else torch.randn(2, 4)
        dest = FIXTURES / f"format_v{fmt.FORMAT_VERSION}_{kind}.aotc"
        if dest.exists():
            shutil.rmtree(dest)
        aotc.export(model, (x,), dest, shard_size="64B", **options)
        if kind == "signed":
            sign_fixture(dest)
        print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ("tiny", "kernels")))
