"""Export options, declared once.

`ExportOptions` is the single source of truth: the Python API (`aotc.export(..., **options)`)
validates keyword arguments against it and the CLI derives its `export` flags from its fields, so
the two cannot drift. Every option used is recorded in the artifact's manifest.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from aotc.errors import UsageError


def _opt(default, help: str, kind: type | None = None, recorded: bool = True):
    """An option: its default, help text, and the type of its CLI flag's value (default: the
    default's type; given for options whose default is None). `recorded=False`: an option
    that changes nothing in the artifact (a debugging aid) and is left out of the manifest."""
    return field(default=default, metadata={"help": help, "kind": kind or type(default),
                                            "recorded": recorded})


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportOptions:
    target: str = _opt("cpu", "Device to compile for: 'cpu' or 'cuda[:sm_90[,sm_80...]]'.")
    strict: bool = _opt(True, "Capture with Dynamo bytecode analysis (fullgraph). "
                              "--no-strict traces with Python instead.")
    record_samples: bool = _opt(True, "Store the example inputs and eager outputs in the artifact "
                                      "for `aotc verify`.")
    prove: bool = _opt(True, "Before the artifact replaces the output path, load it and run it "
                             "on the recorded samples against eager's outputs (CPU targets; "
                             "other targets record that they were not run). --no-prove skips.")
    codegen: bool = _opt(True, "Generate fused kernels (C++ for cpu, Triton for cuda) for the "
                               "ops aotc lowers; --no-codegen calls ATen for every op "
                               "(portable to any device).")
    isa: str = _opt("auto", "CPU levels the kernels are built for: auto (one library per level "
                            "from the x86-64-v2 baseline up to this host's; the loader runs "
                            "the best its CPU has), native (this host's level only), or one "
                            "level such as x86-64-v3 (exactly that one; armv8-a cross-builds "
                            "with aarch64-linux-gnu-g++).")
    autotune: bool = _opt(False, "CUDA: time a few block sizes and warp counts of each generated "
                                 "kernel on this machine's GPU and keep the fastest (recorded in "
                                 "the manifest). Without a GPU of a target arch, the heuristic "
                                 "sizes are kept and the reason recorded.")
    dtype: str | None = _opt(None, "Cast the model's floating parameters and buffers and the "
                                   "floating example inputs to bf16 or fp16 before capture "
                                   "(default: keep their dtypes).")
    train: bool = _opt(False, "Export a training artifact: forward and precomputed backward, "
                              "loaded as an nn.Module whose parameters train with any optimizer.")
    name: str | None = _opt(None, "Model name recorded in the manifest (default: the class name).")
    decode: bool = _opt(False, "Export a generator: a decoder with a static KV cache, as a "
                               "prefill entry (the prompt, of dynamic length) and a decode entry "
                               "(one token a step) sharing weights and the cache (aotc/nn.py); "
                               "the example input is a prompt of token ids [batch, T].")
    max_cache_len: int = _opt(2048, "Generators: the KV cache's length (the prompt and the "
                                    "tokens generated after it, together).")
    max_batch: int = _opt(0, "Generators: export N cache slots, each at its own position, for "
                             "continuous batching (aotc.serve): a decode entry stepping every "
                             "slot at once and a prefill entry writing one prompt (or a chunk "
                             "of one) into a chosen slot. 0: one batch in lockstep, the batch "
                             "of the example input.")
    slot_buckets: str = _opt("auto", "Generators with slots: smaller decode entries that step "
                                     "only the first K slots (a comma list of K < "
                                     "--max-batch), each its own CUDA graph, run while the "
                                     "slots in use fit them. auto: powers of two for cuda "
                                     "targets, none for cpu; none: the full decode alone.")
    tensor_parallel: int = _opt(1, "Split the model over N ranks, Megatron-style (column-"
                                   "parallel q/k/v and gate/up projections, row-parallel output "
                                   "and down projections followed by an all-reduce, the LM head "
                                   "split by vocabulary; embeddings and norms replicated): one "
                                   "plan, each rank's own weights shards, run under "
                                   "torch.distributed (exporter/parallel.py).")
    shard_size: str = _opt("2GB", "Largest weights file: weights above this are split into "
                                  "several safetensors shards (2GB, 500MB, 1GiB, or bytes).")
    quantize: str | None = _opt(None, "Weight-only quantization of every nn.Linear weight: "
                                      "int8 (symmetric, one float32 scale per output "
                                      "channel) or int4 (symmetric, one float32 scale per "
                                      "group of --group-size weights of a row, two values a "
                                      "byte) or fp8 (e4m3, one scale per output channel; "
                                      "CUDA sm_89+) (docs/quantization.md).", kind=str)
    group_size: int | None = _opt(None, "With --quantize int4: weights of a row sharing one "
                                        "scale, 32, 64 or 128 (default 64); layers whose rows "
                                        "it does not divide stay in full precision.", kind=int)
    quantize_skip: str | None = _opt(None, "With --quantize: comma-separated fnmatch patterns "
                                           "of weight names kept in full precision, e.g. "
                                           "'*.down_proj.weight,model.layers.0.*'.", kind=str)
    quantize_embeddings: bool = _opt(False, "With --quantize: quantize nn.Embedding tables "
                                            "too (one scale per row).")
    quantize_lm_head: bool = _opt(False, "With --quantize: quantize the LM head too (the "
                                         "output embeddings; kept in full precision by "
                                         "default).")
    max_quant_error: float | None = _opt(None, "With --quantize: refuse the export when the "
                                               "quantized model's outputs are further than "
                                               "this relative L2 error from the unquantized "
                                               "model's on the example inputs.", kind=float)
    dump_passes: str | None = _opt(None, "Write each codegen pass's output, readable, into "
                                         "this folder (DIR/passes.txt, DIR/<entry>/NN-<pass>"
                                         ".txt: graph, loop IR, kernels, plan; "
                                         "docs/development.md). The artifact is the same "
                                         "with or without it.", kind=str, recorded=False)

    def __post_init__(self):
        if self.decode and self.train:
            raise UsageError("--decode and --train cannot be combined", where="--decode",
                             expected="one of them", found="both",
                             fix="export the generator and the training step separately")
        if not 2 <= self.max_cache_len <= 1 << 20:
            raise UsageError(f"--max-cache-len {self.max_cache_len} is out of range",
                             where="--max-cache-len", expected="2..1048576",
                             found=self.max_cache_len, fix="choose a cache length in range")
        if not 0 <= self.max_batch <= 4096 or (self.max_batch and self.train):
            raise UsageError(f"--max-batch {self.max_batch} is not a number of cache slots",
                             where="--max-batch", expected="1..4096, for a generator",
                             found=f"train={self.train}, max_batch={self.max_batch}",
                             fix="choose a number of slots in range; export generators "
                                 "(--decode) with it")
        self.bucket_rows()
        if self.autotune and self.target.strip().lower().partition(":")[0] == "cpu":
            raise UsageError("--autotune times Triton kernels on a GPU; target cpu has none",
                             where="--autotune", expected="a cuda target, e.g. --target cuda",
                             found=f"--target {self.target}",
                             fix="drop --autotune, or export for --target cuda[:sm_XX]")
        if not 1 <= self.tensor_parallel <= 64:
            raise UsageError(f"--tensor-parallel {self.tensor_parallel} is out of range",
                             where="--tensor-parallel", expected="1..64",
                             found=self.tensor_parallel, fix="choose a number of ranks")
        if self.tensor_parallel > 1 and self.train:
            raise UsageError("--tensor-parallel exports inference artifacts", where="--train",
                             expected="no --train with --tensor-parallel", found="both",
                             fix="export the training step without --tensor-parallel")
        self.shard_bytes()
        self._check_quantize()
        self._check_dump_passes()
        if self.codegen and self.target.strip().lower().partition(":")[0] == "cpu":
            from aotc.codegen.cpp.build import resolve_isa
            resolve_isa(self.isa)      # an unknown level or a missing cross compiler, now

    def _check_dump_passes(self) -> None:
        import os
        if self.dump_passes is not None and (not str(self.dump_passes).strip() or (
                os.path.exists(self.dump_passes) and not os.path.isdir(self.dump_passes))):
            raise UsageError(f"--dump-passes {self.dump_passes!r} is not a folder",
                             where="--dump-passes", expected="a folder (created if missing)",
                             found=repr(self.dump_passes),
                             fix="name a folder for the pass dumps, e.g. --dump-passes passes")

    def _check_quantize(self) -> None:
        from aotc.artifact.quant import SCHEMES
        if self.quantize is None:
            unset = {"quantize_skip": None, "max_quant_error": None, "group_size": None,
                     "quantize_embeddings": False, "quantize_lm_head": False}
            given = [f for f, off in unset.items() if getattr(self, f) is not off]
            if given:
                flag = "--" + given[0].replace("_", "-")
                raise UsageError(f"{flag} applies to quantized exports", where=flag,
                                 expected="--quantize int8", found="no --quantize",
                                 fix=f"add --quantize int8, or drop {flag}")
            return
        if self.quantize not in SCHEMES:
            raise UsageError(f"unknown quantization {self.quantize!r}", where="--quantize",
                             expected=" or ".join(SCHEMES), found=self.quantize,
                             fix="use --quantize int8, int4 or fp8")
        self._check_group_size()
        if self.quantize == "fp8":
            self._check_fp8()
        for flag, bad in (("--train", self.train), ("--tensor-parallel", self.tensor_parallel > 1)):
            if bad:
                raise UsageError(f"--quantize does not combine with {flag} yet", where=flag,
                                 expected="an inference export on one device",
                                 found=f"--quantize with {flag}",
                                 fix=f"drop {flag} or --quantize")
        if self.max_quant_error is not None and not self.max_quant_error >= 0:
            raise UsageError(f"--max-quant-error {self.max_quant_error} is negative",
                             where="--max-quant-error", expected="a relative error >= 0",
                             found=self.max_quant_error, fix="pass e.g. --max-quant-error 0.05")

    def _check_fp8(self) -> None:
        """fp8 needs CUDA archs that convert e4m3 in hardware (sm_89+): a TargetError naming
        the target or the first older arch (an unnamed arch is this machine's GPU's)."""
        import torch
        from aotc.artifact.quant import FP8_MIN_ARCH
        from aotc.codegen.target import Target
        from aotc.errors import TargetError
        target = Target.parse(self.target)
        archs = list(target.archs)
        if target.device == "cuda" and not archs and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            archs = [f"sm_{major}{minor}"]
        old = [a for a in archs if int("".join(c for c in a if c.isdigit())) < FP8_MIN_ARCH]
        if target.device == "cpu" or old:
            found = f"--target {self.target}" + (f" ({old[0]})" if old else "")
            raise TargetError(f"--quantize fp8 needs a CUDA GPU of sm_{FP8_MIN_ARCH} or later; "
                              f"{old[0] if old else 'cpu'} has no e4m3 conversions",
                              where="--quantize fp8",
                              expected=f"--target cuda:sm_{FP8_MIN_ARCH} or later (H100: sm_90)",
                              found=found, fix="use --quantize int8 or int4 for this target, "
                                               "or export for --target cuda:sm_90")

    def _check_group_size(self) -> None:
        from aotc.artifact.quant import GROUP_SIZES
        if self.group_size is not None and self.quantize != "int4":
            raise UsageError("--group-size applies to --quantize int4", where="--group-size",
                             expected="--quantize int4", found=f"--quantize {self.quantize}",
                             fix="drop --group-size (int8 has one scale per output channel)")
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise UsageError(f"--group-size {self.group_size} is not supported",
                             where="--group-size", expected=" or ".join(map(str, GROUP_SIZES)),
                             found=self.group_size, fix="pass --group-size 64")

    @classmethod
    def from_kwargs(cls, **kwargs) -> "ExportOptions":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UsageError(f"unknown export option {unknown[0]!r}", expected=sorted(known),
                             found=unknown, fix="remove the option or correct its spelling")
        return cls(**kwargs)

    def cast_dtype(self):
        """The torch dtype of `dtype` (None: keep), or a UsageError naming the choices."""
        import torch
        if self.dtype is None:
            return None
        named = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                 "float16": torch.float16, "half": torch.float16}
        if self.dtype.lower() not in named:
            raise UsageError(f"unknown export dtype {self.dtype!r}", where="--dtype",
                             expected="bf16 or fp16", found=self.dtype,
                             fix="use --dtype bf16 or --dtype fp16, or leave it out to keep fp32")
        return named[self.dtype.lower()]

    def bucket_rows(self) -> tuple[int, ...]:
        """The row counts of the smaller decode entries `slot_buckets` asks for."""
        text = str(self.slot_buckets).strip().lower()
        if not self.max_batch or text == "none":
            return ()
        if text == "auto":
            cuda = self.target.strip().lower().startswith("cuda")
            return tuple(1 << i for i in range(12) if (1 << i) < self.max_batch) if cuda else ()
        try:
            rows = tuple(sorted({int(x) for x in text.split(",")}))
        except ValueError:
            rows = (0,)
        if not all(1 <= r < self.max_batch for r in rows):
            raise UsageError(f"--slot-buckets {self.slot_buckets!r} is not a list of slot "
                             "counts", where="--slot-buckets", expected=f"auto, none, or "
                             f"counts in 1..{self.max_batch - 1} such as 1,2,4",
                             found=self.slot_buckets, fix="pass --slot-buckets auto")
        return rows

    def shard_bytes(self) -> int:
        """`shard_size` in bytes, or a UsageError naming the accepted forms."""
        import re
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(I?)(B?)\s*", str(self.shard_size),
                         re.IGNORECASE)
        if m is not None and (m.group(3) and not m.group(2)):
            m = None
        value = 0
        if m is not None:
            scale = 1 << 10 if m.group(3) else 1000
            value = int(float(m.group(1)) * scale ** " KMGT".index((m.group(2) or " ").upper()))
        if value < 1:
            raise UsageError(f"{self.shard_size!r} is not a shard size", where="--shard-size",
                             expected="a size such as 2GB, 500MB, 1GiB or a number of bytes",
                             found=repr(self.shard_size),
                             fix="pass --shard-size 2GB (the default)")
        return value

    def to_json(self) -> dict:
        """The options the manifest records (every option but debugging aids)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["recorded"]}


@dataclass(frozen=True, kw_only=True, slots=True)
class FolderOptions:
    """Options of exports from a Hugging Face model folder (exporter/hf_folder.py)."""
    task: str | None = _opt(None, "Model folders: what to export (text-generation, "
                                  "feature-extraction, fill-mask, text-classification, "
                                  "token-classification, image-classification; default: the "
                                  "task config.json's architectures name).", kind=str)
    batch: int | None = _opt(None, "Model folders: example batch (default 2, dynamic 1..256; "
                                   "text-generation: the generator's fixed batch, default 1).",
                             kind=int)
    seq_len: int | None = _opt(None, "Model folders: example sequence length (default 16; "
                                     "dynamic from 1 to the model's positions).", kind=int)
    image_size: int | None = _opt(None, "Model folders, image tasks: the image side in pixels "
                                        "(default: the config's image_size).", kind=int)

    def __post_init__(self):
        for name, lo in (("batch", 1), ("seq_len", 2), ("image_size", 1)):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not lo <= value <= 1 << 20):
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} {value!r} is out of range", where=flag,
                                 expected=f"an int in {lo}..{1 << 20}", found=value,
                                 fix=f"pass {flag} with a positive size")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def option_fields(cls=ExportOptions):
    """(name, default, help, type) for each option of `cls`, in declaration order: what the CLI
    turns into flags."""
    return [(f.name, f.default, f.metadata["help"], f.metadata["kind"])
            for f in dataclasses.fields(cls)]
