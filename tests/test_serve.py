"""`aotc serve`: a real uvicorn server on 127.0.0.1 driven by the official openai client
(aotc/serve/app.py). Greedy answers must equal the same request run alone."""
import json
import random
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import aotc

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from aotc.serve.app import create_app  # noqa: E402
from aotc.serve.background import BackgroundServer as LiveServer, free_port  # noqa: E402
from conftest import aotc_exe, subprocess_env  # noqa: E402
from serve_helpers import WordTokenizer, wait_for  # noqa: E402

TOK = WordTokenizer()


@pytest.fixture(scope="module")
def alone(slot_llm):
    """expected(prompt ids, max_tokens) -> the greedy token ids of the request run alone."""
    m = aotc.load(slot_llm)

    def expected(ids: list[int], n: int) -> list[int]:
        out = m.generate(torch.tensor([ids]), n)[0, len(ids):].tolist()
        return out[:out.index(2)] if 2 in out else out       # </s> ends it, unsent
    return expected


@pytest.fixture(scope="module")
def live(slot_llm):
    with LiveServer(create_app(aotc.load(slot_llm), tokenizer=TOK, model_name="tiny")) as s:
        yield s


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


def words(rng, n) -> str:
    return " ".join(f"w{rng.randrange(93)}" for _ in range(n))


def test_completion_and_stream_equal_the_request_alone(client, alone):
    prompt = "w5 w17 w3 w9"
    want = alone(TOK.encode(prompt), 10)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
    assert r.choices[0].text == TOK.decode(want)
    assert r.choices[0].finish_reason == ("length" if len(want) == 10 else "stop")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, len(want))
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.strip() == r.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == len(want)


def test_chat_and_stream(client, alone):
    messages = [{"role": "user", "content": "w1 w2 w3"}]
    ids = TOK.encode(TOK.apply_chat_template(messages), add_special_tokens=False)
    want = TOK.decode(alone(ids, 8))
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True)]
    assert "".join(deltas).strip() == want


def test_sixteen_concurrent_clients_each_equal_alone(client, alone, live):
    rng = random.Random(1)
    asks = [(words(rng, rng.randint(1, 12)), rng.randint(1, 20)) for _ in range(16)]

    def ask(i):
        prompt, n = asks[i]
        if i % 2:
            return "".join(c.choices[0].text for c in client.completions.create(
                model="tiny", prompt=prompt, max_tokens=n, temperature=0, stream=True)).strip()
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                         temperature=0).choices[0].text
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, range(16)))
    assert got == [TOK.decode(alone(TOK.encode(p), n)) for p, n in asks]
    metrics = httpx.get(live.url + "/metrics").text
    assert "aotc_time_to_first_token_seconds_count" in metrics
    assert "aotc_generated_tokens_total" in metrics and "aotc_active_slots" in metrics


def test_stop_strings_seed_and_models(client, live, alone):
    ids = TOK.encode("w8 w9")
    want = TOK.decode(alone(ids, 12)).split()
    if len(want) >= 3:
        r = client.completions.create(model="tiny", prompt="w8 w9", max_tokens=12,
                                      temperature=0, stop=[want[2]])
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].text.strip() == " ".join(want[:2])
    draw = lambda: client.completions.create(model="tiny", prompt="w8", max_tokens=6,  # noqa
                                             temperature=1.2, top_p=0.9, seed=7).choices[0].text
    assert draw() == draw()
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}


def test_n_choices(client, alone):
    ids = TOK.encode("w3 w4")
    greedy = client.completions.create(model="tiny", prompt="w3 w4", max_tokens=6, n=3,
                                       temperature=0)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert {c.text for c in greedy.choices} == {TOK.decode(alone(ids, 6))}
    draw = lambda: [c.text for c in client.completions.create(  # noqa: E731
        model="tiny", prompt="w3 w4", max_tokens=8, n=4, temperature=1.5, seed=11,
        extra_body={"ignore_eos": True}).choices]
    first = draw()
    assert first == draw() and len(set(first)) > 1      # seeded, and seed + i per choice
    assert greedy.usage.completion_tokens == sum(len(TOK.encode(c.text, False))
                                                 for c in greedy.choices)



def test_n_choices_streamed(client):
    """stream with n > 1: each chunk carries its choice's index; the texts joined per index
    equal the same request's answer without streaming (seeded), usage counts them all."""
    kw = dict(model="tiny", prompt="w5 w6 w7", max_tokens=7, n=3, temperature=1.2, seed=4,
              extra_body={"ignore_eos": True})
    whole = [c.text for c in client.completions.create(**kw).choices]
    texts, finish, usage = ["", "", ""], [None] * 3, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True},
                                           **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
            finish[c.index] = c.finish_reason or finish[c.index]
        usage = chunk.usage or usage
    assert texts == whole and finish == ["length"] * 3 and len(set(texts)) > 1
    assert usage.completion_tokens == 21
    chat = [""] * 2
    roles = set()
    for chunk in client.chat.completions.create(
            model="tiny", stream=True, n=2, max_tokens=5, temperature=0,
            messages=[{"role": "user", "content": "w1 w2"}]):
        for c in chunk.choices:
            chat[c.index] += c.delta.content or ""
            roles |= {(c.index, c.delta.role)} if c.delta.role else set()
    assert chat[0] == chat[1] and chat[0] and roles == {(0, "assistant"), (1, "assistant")}


def test_malformed_requests_are_400_and_the_server_goes_on(client, live):
    bad = [dict(prompt="w1", temperature=-1), dict(prompt="w1", max_tokens=0),
           dict(prompt="w1 " * 60), dict(prompt="w1", max_tokens=500),
           dict(prompt="w1", n=17), dict(prompt=[1, 2, 999]), dict(prompt="w1", top_p=2)]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="tiny", **{"max_tokens": 4, **kw})
        assert info.value.status_code == 400 and info.value.body["message"]
    for raw in (b"{not json", b'{"prompt": 5}', b"{}"):
        r = httpx.post(live.url + "/v1/completions", content=raw,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.completions.create(model="tiny", prompt="w1", max_tokens=2).choices


def test_disconnect_mid_stream_frees_the_slot(live, monkeypatch):
    added, step = [], live.engine.step
    monkeypatch.setattr(live.engine, "add_choices", lambda *a, add=live.engine.add_choices:
                        added.extend(add(*a)) or added)
    monkeypatch.setattr(live.engine, "step", lambda: time.sleep(0.02) or step())  # 40 tokens
    body = {"prompt": "w4 w4", "max_tokens": 40, "temperature": 0.9, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=30) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data:"))
    wait_for(lambda: added[0].finished)
    assert added[0].finish_reason == "cancelled" and len(added[0].tokens) < 40
    wait_for(lambda: live.engine.active == 0)


def test_api_key_queue_limit_and_no_tokenizer(slot_llm):
    m = aotc.load(slot_llm)
    app = create_app(m, tokenizer=None, api_key="s3cret", max_active=1, max_queue=1)
    with LiveServer(app) as live:
        keyed = openai.OpenAI(base_url=live.url + "/v1", api_key="s3cret", max_retries=0)
        wrong = openai.OpenAI(base_url=live.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="x", prompt=[1, 2], max_tokens=2)
        assert httpx.get(live.url + "/health").status_code == 200       # open without a key
        r = keyed.completions.create(model="x", prompt=[5, 6, 7], max_tokens=3, temperature=0)
        assert r.choices[0].text == "" and r.model_extra is not None
        assert r.choices[0].model_extra["token_ids"] == \
            m.generate(torch.tensor([[5, 6, 7]]), 3)[0, 3:].tolist()
        with pytest.raises(openai.BadRequestError, match="no tokenizer"):
            keyed.completions.create(model="x", prompt="some text", max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="no tokenizer"):
            keyed.chat.completions.create(model="x", messages=[{"role": "user",
                                                                 "content": "hi"}])
        body = {"prompt": [1, 2], "max_tokens": 4}
        headers = {"authorization": "Bearer s3cret"}
        post = lambda: httpx.post(live.url + "/v1/completions", json=body,  # noqa: E731
                                  headers=headers, timeout=60)
        with m.lock:                 # the engine waits at its next step: the request queues
            waiting = ThreadPoolExecutor(1).submit(post)
            wait_for(lambda: live.engine.queued == 1)
            full = post()
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["type"] == "rate_limit_exceeded"
        assert waiting.result(60).status_code == 200


def test_sigterm_drains_requests_in_flight(slot_llm):
    port = free_port()
    proc = subprocess.Popen([*aotc_exe(), "serve", str(slot_llm), "--port", str(port),
                             "--max-batch", "1", "--prefill-chunk", "1", "--drain-timeout",
                             "60"], env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), timeout=120)
        results, ended, started = {}, {}, threading.Event()

        def stream(i):      # one slot, prompts prefilled a token a step: they run in turn
            body = {"prompt": list(range(3 + i, 18 + i)), "max_tokens": 30, "temperature": 1.0,
                    "seed": i, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                results[i] = [json.loads(x[5:]) for x in r.iter_lines()
                              if x.startswith("data:") and x != "data: [DONE]"
                              and (started.set() or True)]
            ended[i] = time.perf_counter()
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        assert started.wait(60)
        # every request is the server's (running, waiting or done) before the signal: a client
        # still connecting when the listener closes would be refused, not drained
        wait_for(lambda: _known(url) + len(ended) >= 3, timeout=60)
        proc.send_signal(signal.SIGTERM)
        signalled = time.perf_counter()
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
        assert max(ended.values()) > signalled        # requests were in flight, and finished
        for i in range(3):
            tokens = [t for e in results[i] for t in e["choices"][0]["token_ids"]]
            assert len(tokens) == 30 and results[i][-1]["choices"][0]["finish_reason"] == "length"
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _known(url: str) -> int:
    """Requests the server holds now: in a cache slot or waiting for one (its metrics)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return int(sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(("aotc_queue_length ", "aotc_active_slots "))))


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        time.sleep(0.1)
        return False
