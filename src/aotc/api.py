"""The pipeline end to end: exporter -> codegen, for the Python API and the CLI alike."""
from __future__ import annotations

from pathlib import Path

import torch

from aotc import codegen, exporter
from aotc.codegen.target import Target
from aotc.exporter.state import untouched
from aotc.options import ExportOptions


def export_module(model, example_inputs, path, *, source: str | None = None,
                  value_ranges: list | None = None, dynamic_shapes=None, progress=None,
                  attachments: dict | None = None, recorded: dict | None = None,
                  **options) -> Path:
    """`recorded`: more options to record in the manifest (a model folder's task and sizes)."""
    opts = ExportOptions.from_kwargs(**options)
    target = Target.parse(opts.target)   # validate before any slow work
    step = progress or (lambda msg: None)
    step("capturing with torch.export and decomposing"
         + (" (forward and backward)" if opts.train else ""))
    if (opts.decode or opts.train) and dynamic_shapes is not None:
        from aotc.errors import UsageError
        flag = "--decode" if opts.decode else "--train"
        what = ("a generator's dims are fixed by aotc (the prompt length is dynamic)"
                if opts.decode else "training artifacts have static shapes")
        raise UsageError(what, where=flag, expected="no dynamic_shapes", found="dynamic_shapes",
                         fix="leave dynamic_shapes out")
    if opts.max_batch and not opts.decode:
        from aotc.errors import UsageError
        raise UsageError("--max-batch gives a generator cache slots", where="--max-batch",
                         expected="--decode (or a text-generation model folder)",
                         found=f"--max-batch {opts.max_batch} without --decode",
                         fix="add --decode, or leave --max-batch out")
    with untouched(model):   # capture runs the model; the caller gets it back as it was
        captured, example_inputs = cast_floating(model, example_inputs, opts.cast_dtype())

        def capture_one(m):
            if opts.decode:
                from aotc.exporter.generate import export_generator
                return export_generator(m, example_inputs, opts, source=source,
                                        value_ranges=value_ranges)
            if opts.train:
                return exporter.export_training(m, example_inputs, opts, source=source,
                                                value_ranges=value_ranges)
            return exporter.export(m, example_inputs, opts, source=source,
                                   value_ranges=value_ranges, dynamic_shapes=dynamic_shapes)
        if opts.tensor_parallel > 1:
            from aotc.exporter.parallel import export_parallel
            step(f"splitting the model over {opts.tensor_parallel} ranks")
            program = export_parallel(captured, tuple(example_inputs) if not isinstance(
                example_inputs, torch.Tensor) else (example_inputs,), opts, capture_one)
        elif opts.quantize:
            program = export_quantized(captured, example_inputs, opts, capture_one, step)
        else:
            program = capture_one(captured)
    if recorded:
        import dataclasses
        program = dataclasses.replace(program, options={**program.options, **recorded})
    return codegen.compile(program, target, path, codegen=opts.codegen, isa=opts.isa,
                           autotune=opts.autotune, prove=opts.prove, progress=step,
                           shard_size=opts.shard_bytes(), attachments=attachments,
                           dump_passes=opts.dump_passes)


def export_folder(folder, path=None, *, task: str | None = None, batch: int | None = None,
                  seq_len: int | None = None, image_size: int | None = None, progress=None,
                  **options) -> Path:
    """`aotc export DIR`: a Hugging Face model folder exported for its task, with its real
    weights and its tokenizer (exporter/hf_folder.py). `path` defaults to ./<folder>.aotc."""
    from aotc.exporter.hf_folder import prepare
    from aotc.options import FolderOptions
    hf = FolderOptions(task=task, batch=batch, seq_len=seq_len, image_size=image_size)
    opts = ExportOptions.from_kwargs(**options)
    Target.parse(opts.target)
    step = progress or (lambda msg: None)
    step(f"loading {folder} with transformers")
    p = prepare(folder, hf.task, hf.batch, hf.seq_len, hf.image_size, opts.max_cache_len)
    for note in p.notes:
        step(note)
    if p.decode:
        if p.max_cache_len < opts.max_cache_len:
            step(f"KV cache of {p.max_cache_len} tokens (the model's positions)")
        options = dict(options, decode=True, max_cache_len=p.max_cache_len)
    if options.get("name") is None:      # the model's class, not the generator's adapter
        options = dict(options, name=type(p.model).__name__)
    out = Path(path) if path is not None else Path(f"{Path(folder).resolve().name}.aotc")
    return export_module(p.model, p.inputs, out, value_ranges=p.value_ranges,
                         dynamic_shapes=p.dynamic_shapes, progress=progress,
                         attachments=p.attachments,
                         recorded=dict(hf.to_json(), task=p.task), **options)


def export_quantized(model, example_inputs, opts, capture_one, step):
    """`--quantize`: the Program of the model with its chosen layers quantized
    (exporter/quantize.py), the accuracy against the unquantized model measured first and
    refused above --max-quant-error before any slow codegen."""
    import dataclasses
    from aotc.exporter import quant_accuracy
    from aotc.exporter.quantize import check_error, group_size, layers_json, quantized, select
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    chosen, group = select(model, opts), group_size(opts)
    step(f"quantizing {len(chosen)} layers to {opts.quantize}")
    full = quant_accuracy.run(model, args, opts)
    with quantized(model, chosen, opts.quantize, group):
        accuracy = quant_accuracy.compare(full, quant_accuracy.run(model, args, opts))
        check_error(accuracy, opts.max_quant_error)
        program = capture_one(model)
    return dataclasses.replace(program, quantization={
        "scheme": opts.quantize, "layers": layers_json(chosen, opts.quantize, group),
        "accuracy": accuracy})


def cast_floating(model, example_inputs, dtype):
    """`--dtype`: a copy of `model` with floating parameters and buffers cast to `dtype`, and
    the floating example inputs cast too (the caller's model is left as it was)."""
    if dtype is None:
        return model, example_inputs
    import copy
    single = isinstance(example_inputs, torch.Tensor)
    inputs = (example_inputs,) if single else tuple(example_inputs)
    inputs = tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inputs)
    return copy.deepcopy(model).to(dtype), inputs


def export_file(ref: str, input_specs: list, path, *, init_args: str | None = None,
                progress=None, **options) -> Path:
    """`aotc export FILE.py:Name`: build the model with a seeded RNG, then export it."""
    from aotc.exporter.loader import load_model
    from aotc.exporter.specs import dynamic_shapes, make_inputs
    opts = ExportOptions.from_kwargs(**options)
    Target.parse(opts.target)
    step = progress or (lambda msg: None)
    step(f"loading {ref}")
    torch.manual_seed(0)
    model = load_model(ref, init_args)
    inputs = make_inputs(input_specs)
    return export_module(model, inputs, path, source=ref, progress=progress,
                         value_ranges=[s.values for s in input_specs],
                         dynamic_shapes=dynamic_shapes(input_specs), **options)


def compile_function(fn, example_inputs, path, **options) -> Path:
    """Trace a plain tensor function (no Dynamo) and compile it: codegen tests op by op."""
    opts = ExportOptions.from_kwargs(**options)
    program = exporter.trace_function(fn, tuple(example_inputs))
    return codegen.compile(program, Target.parse(opts.target), path, codegen=opts.codegen,
                           isa=opts.isa, autotune=opts.autotune, shard_size=opts.shard_bytes(),
                           dump_passes=opts.dump_passes)
