"""The OpenAI API's request and response shapes (serve stage): what `/v1/completions` and
`/v1/chat/completions` accept, checked into a `Job` (prompt token ids, sampling, text stop
sequences), and the JSON they answer. Errors are `BadRequest` (400, OpenAI's error object).

Accepted: `prompt` as a string or a list of token ids (or a list holding one of them: one
prompt per request); chat `messages` with string content (or a list of text parts);
`max_tokens` (chat: or `max_completion_tokens`), `temperature` (0: greedy), `top_p`, `seed`,
`stop` (strings), `stream`, `stream_options.include_usage`, `n` (choices, 1..16; 1 when
streaming); and vLLM's extensions
`top_k`, `stop_token_ids`, `ignore_eos`. Text goes through the artifact's tokenizer; without
one, completions take token ids and answer `text` "" with the ids in `token_ids` (which every
choice carries).
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from aotc.errors import UsageError
from aotc.serve.engine import SamplingParams


MAX_CHOICES = 16     # n, choices per request


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param)


def error_body(message: str, kind: str, param: str | None = None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logprobs: object = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatRequest(_Common):
    messages: list[dict]
    max_completion_tokens: int | None = None


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"


@dataclass
class Job:
    """A checked request: what the engine runs and how its answer is shaped."""
    prompt: list[int]
    params: SamplingParams
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    chat: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    n: int = 1

    def choices(self) -> list["Job"]:
        """The request's n choices as jobs of one choice each (a seed s gives choice i the
        seed s + i: distinct, reproducible draws)."""
        if self.n == 1:
            return [self]
        seed = self.params.seed
        return [dataclasses.replace(self, n=1, params=dataclasses.replace(
            self.params, seed=None if seed is None else seed + i)) for i in range(self.n)]


def completion_job(req: CompletionRequest, tokenizer, max_len: int) -> Job:
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and not all(isinstance(t, int) for t in prompt):
        raise BadRequest("one prompt per request: a string or a list of token ids", "prompt")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise BadRequest("this artifact has no tokenizer: send the prompt as a list of "
                             "token ids", "prompt")
        prompt = tokenizer.encode(prompt)
    return _job(req, prompt, tokenizer, max_len, chat=False)


def chat_job(req: ChatRequest, tokenizer, max_len: int) -> Job:
    if tokenizer is None:
        raise BadRequest("this artifact has no tokenizer, so it cannot take chat messages: use "
                         "/v1/completions with a list of token ids", "messages")
    messages = []
    for i, m in enumerate(req.messages):
        content = m.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            content = "".join(p for p in parts if isinstance(p, str)) \
                if all(isinstance(p, dict) and p.get("type") == "text" for p in content) \
                else None
        if not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise BadRequest(f"message {i} needs a role and text content", f"messages[{i}]")
        messages.append({"role": m["role"], "content": content})
    if not messages:
        raise BadRequest("messages is empty", "messages")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if req.max_completion_tokens is not None and req.max_tokens is None:
        req = req.model_copy(update={"max_tokens": req.max_completion_tokens})
    return _job(req, ids, tokenizer, max_len, chat=True)


def _job(req: _Common, prompt: list[int], tokenizer, max_len: int, chat: bool) -> Job:
    if not 1 <= req.n <= MAX_CHOICES:
        raise BadRequest(f"n must be in 1..{MAX_CHOICES}", "n")
    if req.logprobs not in (None, False, 0):
        raise BadRequest("logprobs are not supported", "logprobs")
    if not prompt:
        raise BadRequest("the prompt is empty", "prompt")
    if len(prompt) >= max_len:
        raise BadRequest(f"the prompt has {len(prompt)} tokens; the model's cache holds "
                         f"{max_len} (prompt and completion together)", "prompt")
    max_tokens = req.max_tokens if req.max_tokens is not None else \
        (max_len - len(prompt) if chat else 16)
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    stop_ids = set(req.stop_token_ids or ())
    if tokenizer is not None and not req.ignore_eos:
        stop_ids |= set(tokenizer.eos_token_ids)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if req.temperature is None
            else req.temperature, top_k=req.top_k or 0,
            top_p=1.0 if req.top_p is None else req.top_p, seed=req.seed,
            stop_token_ids=tuple(sorted(stop_ids)))
    except UsageError as e:
        raise BadRequest(f"{e.what}: expected {e.expected}, got {e.found}", e.where) from None
    if len(prompt) + max_tokens > max_len:
        raise BadRequest(f"{len(prompt)} prompt tokens and max_tokens {max_tokens} exceed the "
                         f"model's cache of {max_len} tokens", "max_tokens")
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 8:
        raise BadRequest("stop must be up to 8 non-empty strings", "stop")
    include = bool(req.stream_options and req.stream_options.include_usage)
    return Job(prompt, params, stops, req.stream, include, chat, n=req.n)


def usage(job: Job, completion_tokens: int) -> dict:
    return {"prompt_tokens": len(job.prompt), "completion_tokens": completion_tokens,
            "total_tokens": len(job.prompt) + completion_tokens}


def response(job: Job, model: str, choices: list[tuple[str, list[int], str]]) -> dict:
    """The whole answer of a request that does not stream: its choices' (text, token ids,
    finish reason)."""
    out = []
    for i, (text, token_ids, finish) in enumerate(choices):
        out.append({"index": i, "message": {"role": "assistant", "content": text},
                    "finish_reason": finish, "token_ids": token_ids} if job.chat else
                   {"index": i, "text": text, "finish_reason": finish, "logprobs": None,
                    "token_ids": token_ids})
    u = usage(job, sum(len(ids) for _, ids, _ in choices))
    return {"id": _id(job), "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created, "model": model, "choices": out, "usage": u}


def chunk(job: Job, model: str, text: str | None, token_ids: list[int], finish: str | None,
          first: bool = False, index: int = 0) -> dict:
    """One server-sent event of a streamed answer (of choice `index`)."""
    if job.chat:
        delta = {"role": "assistant", "content": ""} if first else \
            ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "finish_reason": finish,
                  "token_ids": token_ids}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None,
                  "token_ids": token_ids}
    return {"id": _id(job), "object": "chat.completion.chunk" if job.chat else
            "text_completion", "created": job.created, "model": model, "choices": [choice]}


def usage_chunk(job: Job, model: str, completion_tokens: int) -> dict:
    return {"id": _id(job), "object": "chat.completion.chunk" if job.chat else
            "text_completion", "created": job.created, "model": model, "choices": [],
            "usage": usage(job, completion_tokens)}


def _id(job: Job) -> str:
    return ("chatcmpl-" if job.chat else "cmpl-") + job.id
