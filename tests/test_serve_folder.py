"""A Hugging Face model folder exported with slots (`aotc export DIR --max-batch 3`): prompts of
different lengths generate as one padded batch, each as transformers generates it alone, and
`aotc serve`'s app answers text through the artifact's own tokenizer (runtime/tokenizer.py)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import aotc
from aotc.cli.main import main
from hf_folders import llama_folder

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
PROMPTS = ["the quick brown fox", "hello", "w12 w13 w14 w15 w16"]


@pytest.fixture(scope="module")
def folder_llm(tmp_path_factory):
    d = tmp_path_factory.mktemp("slots_folder")
    folder = llama_folder(d / "tiny-llama")
    out = d / "llm.aotc"
    result = CliRunner().invoke(main, ["export", str(folder), "-o", str(out), "--max-batch",
                                       "3", "--max-cache-len", "64", "--no-codegen"])
    assert result.exit_code == 0, result.output
    return folder, out


def test_text_prompts_of_different_lengths_in_slots(folder_llm):
    folder, out = folder_llm
    m = aotc.load(out)
    assert m.slots == 3 and len({len(m.tokenizer.encode(p)) for p in PROMPTS}) == 3
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    want = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        gen = model.generate(ids, max_new_tokens=16, do_sample=False)
        want.append(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
    assert m.generate(PROMPTS, max_new_tokens=16) == want
    padded = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    t = padded.input_ids.shape[1]
    hf = model.generate(**padded, max_new_tokens=16, do_sample=False)[:, t:].tolist()
    ours = m.generate(padded.input_ids, 16, attention_mask=padded.attention_mask)[:, t:]
    cut = lambda row: row[:row.index(2) + 1] if 2 in row else row     # noqa: E731 (eos)
    assert [cut(r) for r in ours.tolist()] == [cut(r) for r in hf]


def test_served_with_the_artifacts_tokenizer(folder_llm):
    from aotc.serve.app import create_app
    from aotc.serve.background import BackgroundServer
    m = aotc.load(folder_llm[1])
    with BackgroundServer(create_app(m)) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="-", max_retries=0)
        r = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=12,
                                      temperature=0)
        assert r.choices[0].text == m.generate(PROMPTS[0], max_new_tokens=12)
        chat = client.chat.completions.create(
            model="m", max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "hello"}])
        assert chat.choices[0].message.content == \
            m.chat([{"role": "user", "content": "hello"}], max_new_tokens=8)


def test_embeddings_from_a_feature_extraction_artifact(tmp_path):
    """/v1/embeddings with the openai client: each vector is the mean of transformers'
    last_hidden_state over the input's tokens, at unit length (floats and base64 alike)."""
    import torch

    from aotc.serve.app import create_app
    from aotc.serve.background import BackgroundServer as LiveServer
    from hf_folders import bert_folder
    folder = bert_folder(tmp_path / "bert", "BertModel")
    path = aotc.export(folder, path=tmp_path / "bert.aotc", task="feature-extraction",
                       codegen=False)
    m = aotc.load(path)
    hf = transformers.BertModel.from_pretrained(folder).eval()
    texts = ["hello world", "the quick brown fox jumps"]
    with LiveServer(create_app(m, model_name="bert")) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
        got = client.embeddings.create(model="bert", input=texts)        # base64 by default
        floats = client.embeddings.create(model="bert", input=texts[1],
                                          encoding_format="float")
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="bert", input="")
        with pytest.raises(openai.BadRequestError, match="embeddings"):
            client.completions.create(model="bert", prompt="hi", max_tokens=2)
    for text, item in zip(texts, got.data):
        ids = torch.tensor([m.tokenizer.encode(text)])
        with torch.no_grad():
            want = hf(input_ids=ids).last_hidden_state.mean(1)[0]
        want = torch.nn.functional.normalize(want, dim=-1)
        torch.testing.assert_close(torch.tensor(item.embedding), want, rtol=1e-4, atol=1e-4)
    assert floats.data[0].embedding == pytest.approx(got.data[1].embedding, abs=1e-6)
    assert got.usage.prompt_tokens == sum(len(m.tokenizer.encode(t)) for t in texts)
