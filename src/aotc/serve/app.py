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

    async def tokens(self, job: api.Job, end: set | None = None):
        """The events of the request's n choices as they come, (choice index, token, finish
        reason), until every choice has finished; the choices are queued together (they share
        one prefill: Engine.add_choices). A choice whose index is added to `end` is cancelled
        (a stop string); every choice still running is cancelled on exit."""
        events: asyncio.Queue = asyncio.Queue()      # filled on this loop (EngineLoop.post)
        arrived = time.perf_counter()
        params = [c.params for c in job.choices()]
        watchers = [lambda ev, i=i: events.put_nowait((i, ev)) for i in range(len(params))]
        try:
            reqs = self.loop.submit_choices(job.prompt, params, watchers)
        except QueueFull as e:
            raise api.BadRequest(f"the server is busy: {e.what}", None, 429,
                                 "rate_limit_exceeded") from None
        except UsageError as e:
            raise api.BadRequest(f"{e.what}: expected {e.expected}, got {e.found}",
                                 e.where) from None
        self.metrics.prompt_tokens.inc(len(job.prompt))
        last, running, end = [None] * len(reqs), len(reqs), end if end is not None else set()
        cancelled: set = set()
        try:
            while running:
                i, ev = await events.get()
                now = time.perf_counter()
                if ev.token is not None:
                    hist = self.metrics.ttft if last[i] is None else self.metrics.itl
                    hist.observe(now - (arrived if last[i] is None else last[i]))
                    last[i] = now
                running -= ev.finish_reason is not None
                yield i, ev.token, ev.finish_reason
                for j in end - cancelled:
                    cancelled.add(j)
                    if not reqs[j].finished:
                        self.loop.cancel(reqs[j].id)
        finally:
            for r in reqs:
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
    end: set = set()
    events = server.tokens(job, end)
    first = await anext(events)        # queue errors (429) before an answer starts
    if job.stream:
        server.metrics.answered(request.url.path, 200)
        return StreamingResponse(_sse(server, job, first, events, end),
                                 media_type="text/event-stream")
    waiter = _watch_disconnect(request)
    try:
        choices = await _collect(server, job, first, events, end)
    finally:
        waiter.cancel()
    server.metrics.answered(request.url.path, 200)
    return api.response(job, server.name, choices)


async def _collect(server: Server, job: api.Job, first, events, end: set) -> list[tuple]:
    """Each choice's (text, token ids, finish reason), once all are done."""
    texts = [TextStream(server.tokenizer, job.stops) for _ in range(job.n)]
    ids, finish = [[] for _ in range(job.n)], [None] * job.n
    try:
        async for i, token, reason in _running(first, events, end):
            finish[i] = reason
            if token is not None:
                ids[i].append(token)
                if texts[i].add(token) is not None:
                    finish[i] = "stop"
                    end.add(i)
    finally:
        await events.aclose()
    return [(t.finish(), d, f or "stop") for t, d, f in zip(texts, ids, finish)]


async def _running(first, events, end: set):
    """`first`, then the rest of `events`, but for the choices in `end` (stopped by a stop
    string, their cancellation under way)."""
    if first[0] not in end:
        yield first
    async for ev in events:
        if ev[0] not in end:
            yield ev


def _watch_disconnect(request: Request) -> asyncio.Task:
    """A task that cancels the handler's wait when its client goes away."""
    handler = asyncio.current_task()

    async def watch():
        while not await request.is_disconnected():
            await asyncio.sleep(0.25)
        handler.cancel()
    return asyncio.create_task(watch())


async def _sse(server: Server, job: api.Job, first, events, end: set):
    """The server-sent events of a streamed answer: each choice's chunks carry its index."""
    texts = [TextStream(server.tokenizer, job.stops) for _ in range(job.n)]
    count, model = 0, server.name
    if job.chat:
        for i in range(job.n):
            yield _event(api.chunk(job, model, None, [], None, first=True, index=i))
    try:
        async for i, token, finish in _running(first, events, end):
            delta, text = "", texts[i]
            if token is not None:
                count += 1
                stopped = text.add(token)
                delta = text.take()
                if stopped is not None:
                    finish = "stop"
                    end.add(i)
            if delta or token is not None:
                yield _event(api.chunk(job, model, delta, [token] if token is not None
                                       else [], None, index=i))
            if finish is not None:
                yield _event(api.chunk(job, model, text.finish_delta(), [], finish, index=i))
        if job.include_usage:
            yield _event(api.usage_chunk(job, model, count))
        yield "data: [DONE]\n\n"
    finally:
        await events.aclose()


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
