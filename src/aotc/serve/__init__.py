"""Serving stage: many requests over one generator artifact's cache slots.

`aotc.serve.engine` batches requests continuously over a loaded generator with slots (runtime
only: it imports aotc.runtime and aotc.errors); `aotc.serve.app` is the OpenAI-compatible HTTP
server over it (FastAPI, uvicorn, prometheus_client: the `serve` extra).
"""
