"""`aotc` commands. Flags of `export` are derived from `ExportOptions`, so the CLI and the Python
API cannot drift. Errors print as `error: ...` with the class's exit code and no traceback
unless `--debug` is given; malformed arguments exit 2 before anything is written.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from aotc.errors import AotcError, UsageError
from aotc.options import ExportOptions, FolderOptions, option_fields


class _Progress:
    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self, msg: str) -> None:
        click.echo(f"[{time.perf_counter() - self.start:6.1f}s] {msg}", err=True)


def _run_guarded(ctx: click.Context, fn, *args, **kwargs):
    """Run a command body, mapping aotc errors to their exit codes."""
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        if ctx.obj.get("debug"):
            raise
        click.echo("interrupted (Ctrl-C)", err=True)
        ctx.exit(130)
    except AotcError as e:
        if ctx.obj.get("debug"):
            raise
        click.echo(f"error ({type(e).__name__}): {e}", err=True)
        ctx.exit(e.exit_code)
    except Exception as e:   # a bug in aotc or torch: say so, keep the trace behind --debug
        if ctx.obj.get("debug"):
            raise
        click.echo(f"internal error: {type(e).__name__}: {e}\n  rerun with --debug for the "
                   "traceback and report it", err=True)
        ctx.exit(1)


def _terminate_cleanly() -> None:
    """SIGTERM (a killed CLI export) unwinds like Ctrl-C, so staging directories are removed
    and compiler processes stopped; SIGKILL leaves them to the next export (artifact/staging.py,
    codegen/cpp/build.py)."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _option_flags(fn):
    """One click option per ExportOptions and FolderOptions field."""
    for name, default, help_text, kind in reversed(option_fields(ExportOptions)
                                                   + option_fields(FolderOptions)):
        flag = name.replace("_", "-")
        if kind is bool:
            fn = click.option(f"--{flag}/--no-{flag}", name, default=default, show_default=True,
                              help=help_text)(fn)
        else:
            fn = click.option(f"--{flag}", name, default=default, show_default=True,
                              type=kind if kind in (int, float) else str, help=help_text)(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")
@click.version_option(package_name="aotc")
@click.pass_context
def main(ctx, debug):
    """aotc: compile PyTorch models ahead of time into self-contained artifacts."""
    ctx.ensure_object(dict)["debug"] = debug
    if debug:   # torch's own output during capture too (exporter/capture.py `quiet`)
        import logging
        log = logging.getLogger("aotc")
        level = log.level
        log.setLevel(logging.DEBUG)
        handler = logging.StreamHandler()   # aotc's own debug lines: codegen's pass times
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        log.addHandler(handler)
        ctx.call_on_close(lambda: (log.setLevel(level), log.removeHandler(handler)))


@main.command()
@click.argument("model")
@click.option("--example-input", "-i", "example_inputs", multiple=True,
              help="Example input as SHAPE[:DTYPE[:LO..HI]], e.g. 8x3x224x224, 8x128:int64, "
                   "or with a dynamic dim batch=8[1..64]x128; repeat for several inputs "
                   "(required for FILE.py:Name; model folders make their own from --task).")
@click.option("--output", "-o", help="Artifact directory to write, in an existing folder "
                                    "(default: ./<file stem or folder>.aotc).")
@click.option("--init-args", default=None, help="JSON object or array passed to the model's "
                                                "constructor or factory.")
@_option_flags
@click.pass_context
def export(ctx, model, example_inputs, output, init_args, **options):
    """Capture MODEL and compile it into an artifact directory. MODEL is a Hugging Face model
    folder (config.json, safetensors weights, tokenizer files: exported for --task with its
    tokenizer), FILE.py:Name or package.module:factory (a class or a function returning the
    model, built with --init-args, on the --example-input tensors)."""
    from aotc.exporter.hf_folder import is_model_folder
    folder = {k: options.pop(k) for k, *_ in option_fields(FolderOptions)}
    try:
        if is_model_folder(model):
            out, call = _folder_usage(model, example_inputs, output, init_args,
                                       folder, options)
        else:
            out, call = _file_usage(model, example_inputs, output, init_args, folder,
                                    options)
    except AotcError as e:
        raise click.UsageError(str(e)) from None

    def body():
        from aotc.artifact.publish import check_destination
        check_destination(out)      # before any slow work: exit 5 for a non-artifact there
        _terminate_cleanly()
        progress = _Progress()
        path = call(progress)
        progress(f"wrote {path}")
        click.echo(str(path))

    _run_guarded(ctx, body)


def _checked_output(output, default: str) -> Path:
    from aotc.artifact.publish import check_destination, check_output_dir
    if output is not None and not output.strip():
        check_destination(output)     # an empty -o: a usage error
    if output is not None:
        check_output_dir(output)      # an existing file, or a folder that does not exist
    return Path(output) if output is not None else Path(default)


def _checked_options(options) -> None:
    from aotc.codegen.target import Target
    Target.parse(options["target"])
    ExportOptions.from_kwargs(**options).cast_dtype()


def _folder_usage(model, example_inputs, output, init_args, folder, options):
    """`aotc export DIR`: its arguments checked; (the output, the export to run)."""
    from aotc.errors import UsageError
    if example_inputs or init_args is not None:
        raise UsageError("a model folder makes its own example inputs and model",
                         where="--example-input/--init-args", expected="neither, for a folder",
                         found="given", fix="leave them out; use --task, --batch, --seq-len "
                                            "or --image-size to shape the example inputs")
    FolderOptions(**folder)
    _checked_options(options)
    out = _checked_output(output, f"{Path(model).resolve().name}.aotc")

    def call(progress):
        from aotc.api import export_folder
        return export_folder(model, out, progress=progress, **folder, **options)
    return out, call


def _file_usage(model, example_inputs, output, init_args, folder, options):
    """`aotc export FILE.py:Name` (or package.module:factory): its arguments checked."""
    from aotc.errors import UsageError
    from aotc.exporter.loader import parse_init_args, split_ref
    from aotc.exporter.specs import parse_input_specs
    if Path(model).is_dir():
        raise UsageError(f"{model} is a folder without config.json", where="MODEL argument",
                         expected="a model folder written by save_pretrained (config.json, "
                         "safetensors weights, tokenizer files)", found="no config.json",
                         fix="save the model with model.save_pretrained(DIR) and "
                             "tokenizer.save_pretrained(DIR)")
    given = [k for k, v in folder.items() if v is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(f"{flag} applies to model folders", where=flag,
                         expected="a folder written by save_pretrained as MODEL",
                         found=model, fix=f"leave {flag} out, or pass the model folder")
    if not example_inputs:
        raise UsageError("FILE.py:Name needs its example inputs", where="--example-input",
                         expected="one -i SHAPE[:DTYPE] per input", found="none",
                         fix="pass e.g. -i 8x3x224x224 (a model folder needs none)")
    specs = parse_input_specs(example_inputs)
    path, _ = split_ref(model)
    parse_init_args(init_args)
    _checked_options(options)
    stem = path.stem if isinstance(path, Path) else path.rpartition(".")[2]
    out = _checked_output(output, f"{stem}.aotc")

    def call(progress):
        from aotc.api import export_file
        return export_file(model, specs, out, init_args=init_args, progress=progress, **options)
    return out, call


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--code", is_flag=True, help="Also print the Python each plan compiles to.")
@click.option("--fusion", is_flag=True, help="Show each kernel, the ops it fuses and why, and "
                                             "the fusions declined.")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
              help="Check model.sig against this public key or CA certificate (repeatable).")
@click.pass_context
def inspect(ctx, artifact, as_json, code, fusion, trusted_keys):
    """Show an artifact's inputs, outputs, guards, steps, ops, weights and versions."""
    from aotc.cli.report import inspect_text

    def body():
        from aotc.artifact.reader import Artifact
        from aotc.runtime.module import plan_sources
        art = Artifact(artifact)
        try:
            art.verify_all()     # inspect vouches for every byte, weights shards included
            if as_json:
                click.echo(art.manifest_bytes.decode(), nl=False)
                return
            click.echo(inspect_text(art, fusion=fusion, trusted=trusted_keys))
            if code:   # the plans' Python, built without loading any kernel
                click.echo("\n" + plan_sources(art))
        finally:
            art.close()

    _run_guarded(ctx, body)


def _trust_option(fn):
    return click.option("--trusted-key", "trusted_keys", multiple=True,
                        type=click.Path(dir_okay=False),
                        callback=lambda _ctx, _param, keys: list(keys) or None,
                        help="Require a signature by this public key or CA certificate "
                             "(repeatable; AOTC_TRUSTED_KEYS adds more).")(fn)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--runs", default=20, show_default=True, type=click.IntRange(1),
              help="Timed runs.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(0),
              help="Untimed runs first.")
@click.option("--device", default=None, help="Device to run on (default: the target's).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for the inputs.")
@click.option("--size", "sizes", multiple=True, metavar="NAME=INT",
              help="Size of a dynamic dim for the random inputs, e.g. --size batch=4 "
                   "(default: the size it was exported with).")
@click.option("--runner", type=click.Choice(["cpp", "python"]), default=None,
              help="Plan runner (default: the C++ one where installed).")
@click.pass_context
@_trust_option
def run(ctx, artifact, runs, warmup, device, seed, sizes, runner, trusted_keys):
    """Run an artifact on random inputs that satisfy its guards; print outputs and latency."""
    from aotc.cli.report import describe_outputs, time_calls
    parsed = _parse_sizes(sizes)

    def body(echo):
        import aotc
        t0 = time.perf_counter()
        m = aotc.load(artifact, device=device, trusted_keys=trusted_keys, runner=runner)
        load_s = time.perf_counter() - t0
        inputs = m.random_inputs(seed=seed, sizes=parsed)    # the same on every rank
        t0 = time.perf_counter()
        out = m(*inputs)
        first_s = time.perf_counter() - t0
        times = time_calls(lambda: m(*inputs), runs, warmup, m.device)
        echo(m.signature())
        echo(f"runner: {m.runtime}")
        echo(describe_outputs(out))
        echo(f"load {load_s * 1e3:.1f} ms, first call {first_s * 1e3:.2f} ms, "
             f"median {times['median'] * 1e3:.3f} ms, p90 {times['p90'] * 1e3:.3f} ms "
             f"over {runs} runs")

    _run_guarded(ctx, _on_ranks, artifact, "run", body)


def _on_ranks(artifact, command: str, body) -> None:
    """`body(echo)`; for a tensor-parallel artifact, in a process group made from torchrun's
    environment (runtime/parallel.py), each rank's lines prefixed with its rank."""
    from aotc.runtime.parallel import launched_group
    with launched_group(artifact, command) as (rank, world):
        prefix = "" if rank is None else f"[rank {rank}/{world}] "
        body(lambda text: click.echo("\n".join(prefix + line for line in str(text).splitlines())))


def _parse_sizes(pairs) -> dict:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier() or not value.strip().isdigit():
            raise click.UsageError(f"--size expects NAME=INT, got {pair!r} (e.g. --size batch=4)")
        out[name] = int(value)
    return out


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--rtol", type=click.FloatRange(min=0), default=None,
              help="Relative tolerance (default by dtype).")
@click.option("--atol", type=click.FloatRange(min=0), default=None,
              help="Absolute tolerance (default by dtype).")
@click.option("--device", default=None, help="Device to run on (default: the target's).")
@_trust_option
@click.pass_context
def verify(ctx, artifact, rtol, atol, device, trusted_keys):
    """Rerun the inputs recorded at export and compare with the recorded outputs."""
    from aotc.cli.report import verify_artifact

    def body(echo):
        import aotc
        m = aotc.load(artifact, device=device, trusted_keys=trusted_keys)
        echo(verify_artifact(m, rtol=rtol, atol=atol))

    _run_guarded(ctx, _on_ranks, artifact, "verify", body)


@main.command("swap-weights")
@click.argument("artifact", type=click.Path())
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--output", "-o", required=True, type=click.Path(),
              help="Artifact directory to write (may be ARTIFACT itself), or a package "
                   "(OUT.aotcpkg).")
@_trust_option
@click.pass_context
def swap_weights(ctx, artifact, weights, output, trusted_keys):
    """Write ARTIFACT with the state dict in WEIGHTS (safetensors) instead of its own weights,
    sharing its compiled kernels and plans."""
    def body():
        from aotc.runtime.swap import swap_weights as swap
        path, dropped = swap(artifact, weights, output, trusted_keys=trusted_keys)
        if dropped:
            click.echo(f"left out {', '.join(dropped)} (recorded with the old weights; "
                       "`aotc verify` has nothing to compare with)", err=True)
        click.echo(str(path))

    _run_guarded(ctx, body)


@main.command()
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Private key file to write; the public key goes to OUTPUT.pub.")
@click.option("--kind", type=click.Choice(["p256", "ed25519"]), default="p256",
              show_default=True, help="p256: an EC P-256 key, signing OpenSSF Model Signing "
                                      "bundles (model.sig); ed25519: the older signatures.json.")
@click.pass_context
def keygen(ctx, output, kind):
    """Write a new key pair for signing artifacts."""
    def body():
        from aotc.artifact.signing import generate_keys
        from aotc.artifact.trust import anchors_of
        private, public = generate_keys(output, kind)
        click.echo(f"wrote {private} (private: keep it secret) and {public} (key id "
                   f"{anchors_of(public)[0].key_id}: give it to the hosts that load)")

    _run_guarded(ctx, body)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--key", required=True, type=click.Path(dir_okay=False),
              help="Private key: EC (P-256/384/521) writes model.sig, an OpenSSF Model Signing "
                   "bundle; Ed25519 adds to signatures.json.")
@click.option("--certificate", type=click.Path(dir_okay=False), default=None,
              help="The key's signing certificate (PEM): OMS's certificate method.")
@click.option("--certificate-chain", "chain", multiple=True, type=click.Path(dir_okay=False),
              help="Certificates from the signing certificate up to its root (repeatable).")
@click.pass_context
def sign(ctx, artifact, key, certificate, chain):
    """Sign ARTIFACT: every file with its sha256 (OMS), or its manifest (Ed25519)."""
    def body():
        from aotc.artifact.signing import sign_artifact
        if chain and certificate is None:
            raise UsageError("--certificate-chain needs --certificate", where="aotc sign",
                             expected="--certificate CERT.pem", found="a chain alone",
                             fix="add --certificate, the signing key's own certificate")
        who = sign_artifact(artifact, key, certificate=certificate, chain=chain)
        click.echo(f"signed {artifact} with {who}")

    _run_guarded(ctx, body)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(1),
              help="Tokens in the random prompt.")
@click.option("--new-tokens", default=128, show_default=True, type=click.IntRange(2),
              help="Tokens to generate after it.")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1),
              help="Timed runs after a first, cold one.")
@click.option("--device", default=None, help="Device to run on (default: the target's).")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed for the prompt (and the draws, when sampling).")
@click.option("--temperature", type=float, default=None,
              help="Sample instead of greedy: divide the logits by this.")
@click.option("--top-k", type=int, default=None,
              help="Sample from the k most likely tokens only.")
@click.option("--top-p", type=float, default=None,
              help="Sample from the smallest set of tokens whose probability reaches p.")
@click.option("--min-p", type=float, default=None,
              help="Sample from the tokens at least p times as likely as the most likely.")
@click.option("--prompt", default=None,
              help="Generate from this text with the artifact's tokenizer and print the text "
                   "generated (an artifact exported from a model folder); --new-tokens at most.")
@_trust_option
@click.pass_context
def generate(ctx, artifact, prompt_len, new_tokens, runs, device, seed, temperature, top_k,
             top_p, min_p, prompt, trusted_keys):
    """Generation with a generator artifact (--decode) on random token ids, greedy or (with
    --temperature, --top-k, --top-p or --min-p) sampled: prints tokens/s, prefill latency, load
    time. With --prompt: prints the text generated after the prompt."""
    def body(echo):
        import aotc
        from aotc.cli.generate import generate_report
        from aotc.errors import UsageError
        m = aotc.load
        from aotc.artifact import format as fmt
        if fmt.read_manifest(artifact).generation is None:
            raise UsageError(f"{artifact} is not a generator", where=str(artifact),
                             expected="an artifact exported with --decode",
                             found="no prefill/decode entries", fix="use `aotc run`")
        sampled = {k: v for k, v in dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                         min_p=min_p).items() if v is not None}
        if prompt is not None:
            from aotc.cli.generate import prompt_text
            echo(prompt_text(m(artifact, device=device, trusted_keys=trusted_keys),
                             prompt, new_tokens, seed, sampled))
            return
        from aotc.runtime.sampling import Choice
        sampling = Choice(True, **sampled) if sampled else None
        echo(generate_report(m, artifact, prompt_len=prompt_len, new_tokens=new_tokens,
                             runs=runs, seed=seed, device=device, trusted_keys=trusted_keys,
                             sampling=sampling))

    _run_guarded(ctx, _on_ranks, artifact, "generate", body)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Package file to write, e.g. model.aotcpkg.")
@click.pass_context
def pack(ctx, artifact, output):
    """Write ARTIFACT as one uncompressed package file that aotc.load reads in place
    (members aligned, weights memory-mapped; the same manifest, hashes and signatures)."""
    def body():
        from aotc.artifact.package import pack as write
        click.echo(str(write(artifact, output)))

    _run_guarded(ctx, body)


@main.command()
@click.argument("package", type=click.Path(dir_okay=False))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=True, file_okay=False),
              help="Artifact directory to write.")
@click.pass_context
def unpack(ctx, package, output):
    """Write PACKAGE as an artifact directory, byte-identical to the one it was packed from."""
    def body():
        from aotc.artifact.package import unpack as write
        click.echo(str(write(package, output)))

    _run_guarded(ctx, body)


from aotc.cli.bench import bench  # noqa: E402
from aotc.cli.config import config  # noqa: E402
from aotc.cli.serve import serve  # noqa: E402
main.add_command(bench)
main.add_command(config)
main.add_command(serve)


if __name__ == "__main__":
    sys.exit(main())
