"""`aotc serve ARTIFACT`: the OpenAI-compatible server (aotc.serve) under uvicorn.

Parses, loads, hands over to uvicorn; the server's behaviour is aotc/serve/app.py's. uvicorn
handles SIGTERM and Ctrl-C: it stops accepting connections, lets the requests in flight finish
within --drain-timeout seconds, then stops the engine.
"""
from __future__ import annotations

import signal
import sys

import click


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (0.0.0.0: every interface; mind --api-key).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--max-batch", type=click.IntRange(1), default=None,
              help="Cache slots in use at once, at most (default: all the artifact's; their "
                   "number is set at export with --max-batch N).")
@click.option("--max-queue", type=click.IntRange(1), default=64, show_default=True,
              help="Requests waiting for a slot, at most; more are answered 429.")
@click.option("--api-key", default=None,
              help="Require `Authorization: Bearer KEY` on /v1/ routes (401 otherwise).")
@click.option("--name", default=None, help="Model name in /v1/models and answers (default: "
                                             "the artifact's).")
@click.option("--device", default=None, help="Device to run on (default: the target's).")
@click.option("--prefill-chunk", type=click.IntRange(1), default=64, show_default=True,
              help="Prompt tokens prefilled per engine step, over all new requests (long "
                   "prompts, and many at once, in chunks between decode steps).")
@click.option("--drain-timeout", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Seconds in-flight requests get to finish after SIGTERM.")
@click.pass_context
def serve(ctx, artifact, host, port, max_batch, max_queue, api_key, name, device,
          prefill_chunk, drain_timeout):
    """Serve a generator ARTIFACT (exported with --decode --max-batch N) over HTTP with
    OpenAI's API: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics; or
    an encoder exported with --task feature-extraction: /v1/embeddings."""
    from aotc.cli.main import _run_guarded

    def body():
        try:
            import uvicorn

            from aotc.serve.app import create_app
        except ImportError as e:
            from aotc.errors import UsageError
            raise UsageError("aotc serve needs the serve extra", where="import",
                             expected="fastapi, uvicorn and prometheus_client",
                             found=f"{type(e).__name__}: {e}",
                             fix="pip install 'aotc[serve]'") from None
        import aotc
        m = aotc.load(artifact, device=device)
        app = create_app(m, model_name=name, api_key=api_key, max_active=max_batch,
                         max_queue=max_queue, prefill_chunk=prefill_chunk)
        what = "embeddings" if app.state.server.engine is None else \
            f"{max_batch or m.slots} slots, {m.max_cache_len} tokens each"
        click.echo(f"serving {app.state.server.name} on http://{host}:{port} ({what})",
                   err=True)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                timeout_graceful_shutdown=drain_timeout)
        # uvicorn drains, then raises the signal again with the handler it found: a drained
        # SIGTERM ends the process with status 0
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        uvicorn.Server(config).run()

    _run_guarded(ctx, body)
