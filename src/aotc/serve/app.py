"""The OpenAI-compatible HTTP server over a generator with slots (serve stage; ASGI).

    app = create_app(aotc.load("llm.aotc"))          # FastAPI; uvicorn serves it
    POST /v1/completions, /v1/chat/completions      (stream: true -> server-sent events)
    POST /v1/embeddings                              (a feature-extraction artifact)
    GET  /v1/models, /health, /metrics

One engine (serve/engine.py) batches every request continuously over the artifact's cache
slots, driven by one thread (serve/loop.py); handlers wait for their request's events on the
asyncio loop. Requests beyond the free slots wait in a bounded queue: when it is full the
answer is 429 with Retry-After. A malformed request is a 400 with OpenAI's error object, and
the server goes on. A client that goes away (a closed stream, or a dropped connection while
it waits) cancels its request, which frees its slot at the engine's next step. With
`api_key`, /v1/ routes want `Authorization: Bearer KEY` (401 otherwise); /health and
/metrics stay open. Shutting down (uvicorn's SIGTERM) lets in-flight requests finish, then
stops the engine's thread. An encoder exported with `--task feature-extraction` serves
`/v1/embeddings` instead (serve/embeddings.py: mean-pooled, unit-length vectors; floats or
base64); each route answers 400 on the other kind of artifact.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from aotc.errors import AotcError, UsageError
from aotc.serve import protocol as api
from aotc.serve.embeddings import Embedder, checked_inputs
from aotc.serve.embeddings import response as embedding_response
from aotc.serve.engine import Engine, QueueFull
from aotc.serve.loop import EngineLoop
from aotc.serve.metrics import CONTENT_TYPE, Metrics
from aotc.serve.text import TextStream

_DEFAULT = object()


def create_app(module, *, tokenizer=_DEFAULT, model_name: str | None = None,
               api_key: str | None = None, max_active: int | None = None,
               max_queue: int = 64, prefill_chunk: int = 64) -> FastAPI:
    """The server's ASGI app over a loaded generator with slots. `tokenizer`: text in and out
    (default: the module's own, `module.tokenizer`, None where it has none); `max_active`:
    slots in use at most (default: all); `max_queue`: requests waiting at most."""
    tokenizer = getattr(module, "tokenizer", None) if tokenizer is _DEFAULT else tokenizer
    name = model_name or str(module.manifest.model.get("name") or "model")
    if getattr(module, "generation", None) is None:
        server = Server(None, tokenizer, name, api_key, Embedder(module, tokenizer))
    else:
        engine = Engine(module, prefill_chunk=prefill_chunk, max_waiting=max_queue,
                        max_active=max_active)
        server = Server(engine, tokenizer, name, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if server.loop is None:
            yield
            return
        server.loop.post = asyncio.get_running_loop().call_soon_threadsafe
        server.loop.start()
        try:
            yield
        finally:
            server.loop.stop()

    app = FastAPI(title="aotc", lifespan=lifespan)
    app.state.server = server
    _routes(app, server)
    return app


class Server:
    """What the routes share: the engine's loop, the tokenizer, the metrics."""

    def __init__(self, engine: Engine | None, tokenizer, name: str, api_key: str | None,
                 embedder: Embedder | None = None):
        self.engine, self.tokenizer, self.name, self.api_key = engine, tokenizer, name, api_key
        self.embedder = embedder
        self.metrics = Metrics(name)
        self.loop = EngineLoop(engine, self.metrics) if engine is not None else None
        self.max_len = engine.module.max_cache_len if engine is not None else None

    @property
    def alive(self) -> bool:
        return self.loop.alive if self.loop is not None else True

    def authorized(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        got = request.headers.get("authorization", "")
        return secrets.compare_digest(got.encode(), f"Bearer {self.api_key}".encode())

    async def tokens(self, job: api.Job, request: Request):
        """The request's (token, finish reason) events as they come; cancelled on exit."""
        events: asyncio.Queue = asyncio.Queue()      # filled on this loop (EngineLoop.post)
        arrived = time.perf_counter()
        try:
            r = self.loop.submit(job.prompt, job.params, events.put_nowait)
        except QueueFull as e:
            raise api.BadRequest(f"the server is busy: {e.what}", None, 429,
                                 "rate_limit_exceeded") from None
        except UsageError as e:
            raise api.BadRequest(f"{e.what}: expected {e.expected}, got {e.found}",
                                 e.where) from None
        self.metrics.prompt_tokens.inc(len(job.prompt))
        last = None
        try:
            while True:
                ev = await events.get()
                now = time.perf_counter()
                if ev.token is not None:
                    hist = self.metrics.ttft if last is None else self.metrics.itl
                    hist.observe(now - (arrived if last is None else last))
                    last = now
                yield ev.token, ev.finish_reason
                if ev.finish_reason is not None:
                    return
        finally:
            if not r.finished:
                self.loop.cancel(r.id)


def _routes(app: FastAPI, server: Server) -> None:
    @app.exception_handler(api.BadRequest)
    async def bad_request(request: Request, e: api.BadRequest):
        server.metrics.answered(request.url.path, e.status)
        headers = {"Retry-After": "1"} if e.status == 429 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        server.metrics.answered(request.url.path, 400)
        return JSONResponse(api.error_body(f"{first.get('msg', 'invalid request')}"
                                           f"{f' ({where})' if where else ''}",
                                           "invalid_request_error", where), status_code=400)

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if request.url.path.startswith("/v1/") and not server.authorized(request):
            server.metrics.answered(request.url.path, 401)
            return JSONResponse(api.error_body("a valid API key is required (Authorization: "
                                               "Bearer KEY)", "authentication_error"),
                                status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        ok = server.alive
        return JSONResponse({"status": "ok" if ok else "engine stopped"},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.name, "object": "model",
                                            "created": 0, "owned_by": "aotc",
                                            "max_model_len": server.max_len}]}

    @app.post("/v1/completions")
    async def completions(body: api.CompletionRequest, request: Request):
        _generator(server)
        job = api.completion_job(body, server.tokenizer, server.max_len)
        return await _answer(server, job, request)

    @app.post("/v1/chat/completions")
    async def chat(body: api.ChatRequest, request: Request):
        _generator(server)
        job = api.chat_job(body, server.tokenizer, server.max_len)
        return await _answer(server, job, request)


    _embedding_route(app, server)


def _embedding_route(app: FastAPI, server: Server) -> None:
    @app.post("/v1/embeddings")
    async def embeddings(body: api.EmbeddingRequest, request: Request):
        if server.embedder is None:
            raise api.BadRequest("this artifact generates text: use /v1/completions or "
                                 "/v1/chat/completions (embeddings need a feature-extraction "
                                 "artifact)", "model")
        try:
            inputs = checked_inputs(server.embedder, body.input)
            vectors = await asyncio.to_thread(server.embedder.embed, inputs)
        except AotcError as e:        # a bad input, or one longer than the model takes
            raise api.BadRequest(f"{e.what}: expected {e.expected}, got {e.found}",
                                 "input") from None
        server.metrics.prompt_tokens.inc(sum(map(len, inputs)))
        server.metrics.answered(request.url.path, 200)
        return embedding_response(vectors, sum(map(len, inputs)), server.name,
                                  body.encoding_format)


def _generator(server: Server) -> None:
    if server.engine is None:
        raise api.BadRequest("this artifact serves embeddings (/v1/embeddings), not text "
                             "generation", "model")


async def _answer(server: Server, job: api.Job, request: Request):
    if not server.alive:
        raise api.BadRequest("the server is shutting down", None, 503, "server_error")
    if job.stream:
        events = server.tokens(job, request)
        first = await anext(events)        # queue errors (429) before the stream starts
        server.metrics.answered(request.url.path, 200)
        return StreamingResponse(_sse(server, job, first, events),
                                 media_type="text/event-stream")
    waiter = _watch_disconnect(request)
    try:
        choices = await asyncio.gather(*(_collect(server, c, request) for c in job.choices()))
    finally:
        waiter.cancel()
    server.metrics.answered(request.url.path, 200)
    return api.response(job, server.name, choices)


async def _collect(server: Server, job: api.Job, request: Request) -> tuple:
    """One choice's (text, token ids, finish reason), once it is done."""
    text = TextStream(server.tokenizer, job.stops)
    ids, finish = [], None
    events = server.tokens(job, request)
    try:
        async for token, finish in events:
            if token is not None:
                ids.append(token)
                if text.add(token) is not None:
                    finish = "stop"
                    break
    finally:
        await events.aclose()
    return text.finish(), ids, finish or "stop"


def _watch_disconnect(request: Request) -> asyncio.Task:
    """A task that cancels the handler's wait when its client goes away."""
    handler = asyncio.current_task()

    async def watch():
        while not await request.is_disconnected():
            await asyncio.sleep(0.25)
        handler.cancel()
    return asyncio.create_task(watch())


async def _sse(server: Server, job: api.Job, first, events):
    """The server-sent events of a streamed answer."""
    text = TextStream(server.tokenizer, job.stops)
    count = 0
    model = server.name
    if job.chat:
        yield _event(api.chunk(job, model, None, [], None, first=True))
    pending = [first]
    try:
        while True:
            token, finish = pending.pop() if pending else await anext(events)
            delta = ""
            if token is not None:
                count += 1
                stopped = text.add(token)
                delta = text.take()
                if stopped is not None:
                    finish = "stop"
            if delta or token is not None:
                yield _event(api.chunk(job, model, delta, [token] if token is not None
                                       else [], None))
            if finish is not None:
                rest = text.finish_delta()
                yield _event(api.chunk(job, model, rest, [], finish))
                if job.include_usage:
                    yield _event(api.usage_chunk(job, model, count))
                yield "data: [DONE]\n\n"
                return
    finally:
        await events.aclose()


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
