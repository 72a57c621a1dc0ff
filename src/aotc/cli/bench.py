"""`aotc bench ARTIFACT`: time one artifact on random inputs that satisfy its guards.

Measured: load time (`aotc.load`: manifest and hash checks, weights, plan compilation), first-call
latency, then after `--warmup` untimed calls, `--runs` timed calls (device synchronized after
each): median, p90 and min. No baseline: comparisons with eager and torch.compile are the job
of the benchmark suite (`python -m benchmarks.run`).
"""
from __future__ import annotations

import time

import click


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--runs", default=50, show_default=True, type=click.IntRange(1), help="Timed runs.")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(0),
              help="Untimed runs after the first call.")
@click.option("--device", default=None, help="Device to run on (default: the target's).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for the inputs.")
@click.pass_context
def bench(ctx, artifact, runs, warmup, device, seed):
    """Time ARTIFACT: load time, first-call latency, median and p90 latency."""
    from aotc.cli.main import _run_guarded   # here, not above: main imports this module
    from aotc.cli.report import time_calls

    def body():
        import aotc
        t0 = time.perf_counter()
        m = aotc.load(artifact, device=device)
        load_s = time.perf_counter() - t0
        inputs = m.random_inputs(seed=seed)
        first_s = time_calls(lambda: m(*inputs), 1, 0, m.device)["median"]
        times = time_calls(lambda: m(*inputs), runs, warmup, m.device)
        click.echo(m.signature())
        click.echo(f"device      {m.device}")
        click.echo(f"load        {load_s * 1e3:10.3f} ms")
        click.echo(f"first call  {first_s * 1e3:10.3f} ms")
        click.echo(f"median      {times['median'] * 1e3:10.3f} ms")
        click.echo(f"p90         {times['p90'] * 1e3:10.3f} ms")
        click.echo(f"min         {times['min'] * 1e3:10.3f} ms")
        click.echo(f"over {runs} runs after {warmup} warm-up runs")

    _run_guarded(ctx, body)
