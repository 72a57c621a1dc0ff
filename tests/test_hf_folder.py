"""From a Hugging Face model folder to text: `aotc export DIR`, the tokenizer in the artifact,
`m.generate(text)` / `m.chat(...)` / `aotc generate --prompt`, against transformers on the same
folder. One export per model kind, shared by the module's tests."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

import aotc
from aotc.cli.main import main
from aotc.errors import ArtifactError, UsageError
from aotc.options import FolderOptions, option_fields
from aotc.artifact import format as fmt
from aotc.runtime.tokenizer import Tokenizer
from conftest import run_python
from hf_folders import bert_folder, gpt2_folder, llama_folder, vit_folder

transformers = pytest.importorskip("transformers")
PROMPTS = ["the quick brown fox", "hello world and", "w12 w13 w14 w15 w16"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def exported(folder, out, *flags):
    result = invoke("export", folder, "-o", out, *flags)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    folder = llama_folder(d / "tiny-llama")
    assert len(list(folder.glob("model-*.safetensors"))) > 1      # a sharded checkpoint
    return folder, exported(folder, d / "llm.aotc")                # task from architectures


@pytest.fixture(scope="module")
def hf_llama(llama):
    folder, _ = llama
    return (transformers.AutoModelForCausalLM.from_pretrained(folder).eval(),
            transformers.AutoTokenizer.from_pretrained(folder))


def hf_text(hf_llama, prompt: str, new_tokens: int) -> str:
    model, tok = hf_llama
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_greedy_text_equals_transformers(llama, hf_llama):
    m = aotc.load(llama[1])
    assert m.generation.batch == 1
    for prompt in PROMPTS:
        assert m.generate(prompt, max_new_tokens=32) == hf_text(hf_llama, prompt, 32)
    # a list of prompts of different lengths: each alone, in order
    assert m.generate(PROMPTS, max_new_tokens=8) == [hf_text(hf_llama, p, 8) for p in PROMPTS]
    # token-level generation is unchanged
    ids = torch.tensor([hf_llama[1].encode(PROMPTS[0])])
    assert torch.equal(m.generate(ids, 8)[:, :ids.shape[1]], ids)


def test_eos_stops_generation(llama):
    """The eos id of generation_config.json ends the text (it is not decoded)."""
    m = aotc.load(llama[1])
    tok = m.tokenizer
    assert tok.eos_token_ids == (2,) and tok.pad_token_id == 3
    stream = list(m.stream(torch.tensor([tok.encode(PROMPTS[0])]), 32))
    ids = torch.cat(stream, dim=1)[0].tolist()
    m.tokenizer.eos_token_ids = (99999, ids[3])   # as if the model's 4th token were an eos
    try:
        assert m.generate(PROMPTS[0], max_new_tokens=32) == tok.decode(ids[:ids.index(ids[3])])
    finally:
        m.tokenizer.eos_token_ids = (2,)


def test_tokenizer_matches_transformers(llama, hf_llama):
    _, hf_tok = hf_llama
    tok = Tokenizer.load(llama[1] / fmt.TOKENIZER_DIR)     # the artifact's folder
    for text in PROMPTS + ["", "unseen zebra words!"]:
        assert tok.encode(text) == hf_tok.encode(text)
        assert tok.decode(hf_tok.encode(text)) == hf_tok.decode(hf_tok.encode(text),
                                                                skip_special_tokens=True)
    messages = [{"role": "user", "content": "hello "}, {"role": "assistant", "content": "w1"},
                {"role": "user", "content": "the fox"}]
    for add in (True, False):
        assert tok.apply_chat_template(messages, add_generation_prompt=add) == \
            hf_tok.apply_chat_template(messages, add_generation_prompt=add, tokenize=False)


def test_chat_and_cli_prompt(llama, hf_llama):
    folder, art = llama
    m = aotc.load(art)
    messages = [{"role": "user", "content": "hello world"}]
    model, tok = hf_llama
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    want = tok.decode(model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:],
                      skip_special_tokens=True)
    assert m.chat(messages, max_new_tokens=16) == want
    result = invoke("generate", art, "--prompt", PROMPTS[1], "--new-tokens", 16)
    assert result.exit_code == 0, result.output
    assert result.output.rstrip("\n") == m.generate(PROMPTS[1], max_new_tokens=16)
    result = invoke("inspect", art)
    assert result.exit_code == 0 and "model:   LlamaForCausalLM" in result.output
    assert "tokenizer: chat_template.jinja" in result.output and "eos ids [2]" in result.output


def test_artifact_lists_and_hashes_the_tokenizer(llama):
    folder, art = llama
    manifest = json.loads((art / fmt.MANIFEST).read_text())
    carried = sorted(p for p in manifest["files"] if p.startswith("tokenizer/"))
    assert carried == sorted(f"tokenizer/{p.name}" for p in folder.iterdir()
                             if p.name in fmt.TOKENIZER_FILES)
    assert "tokenizer/chat_template.jinja" in carried
    assert manifest["options"]["task"] == "text-generation" and manifest["options"]["decode"]
    for rel in carried:
        assert (art / rel).read_bytes() == (folder / rel.split("/")[1]).read_bytes()


def test_package_carries_the_tokenizer(llama, tmp_path):
    pkg = tmp_path / "llm.aotcpkg"
    result = invoke("pack", llama[1], "-o", pkg)
    assert result.exit_code == 0, result.output
    assert aotc.load(pkg).generate(PROMPTS[0], max_new_tokens=8) == \
        aotc.load(llama[1]).generate(PROMPTS[0], max_new_tokens=8)


def test_tampered_tokenizer_is_refused(llama, tmp_path):
    copy = shutil.copytree(llama[1], tmp_path / "copy.aotc")
    path = copy / "tokenizer" / "tokenizer.json"
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"<pad>"', b'"<PAD>"', 1))
    with pytest.raises(ArtifactError, match="tokenizer"):
        aotc.load(copy)


def test_malformed_tokenizer_files_are_typed_errors(llama):
    files = {n: (llama[1] / "tokenizer" / n).read_bytes()
             for n in ("tokenizer.json", "tokenizer_config.json")}
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Tokenizer.from_files(dict(files, **{"tokenizer_config.json": b"{oops"}))
    with pytest.raises(ArtifactError, match="tokenizers library"):
        Tokenizer.from_files(dict(files, **{"tokenizer.json": b'{"model": 3}'}))
    with pytest.raises(ArtifactError, match="not one aotc reads"):
        Tokenizer.from_files(dict(files, **{"vocab.txt": b"a"}))
    with pytest.raises(ArtifactError, match="no tokenizer.json"):
        Tokenizer.from_files({"tokenizer_config.json": files["tokenizer_config.json"]})


NO_TRANSFORMERS = """
import sys
sys.modules["transformers"] = None          # `import transformers` raises ImportError
import aotc
m = aotc.load(sys.argv[1])
print(m.generate(sys.argv[2], max_new_tokens=16))
assert "transformers" not in [k for k, v in sys.modules.items() if v is not None]
"""


def test_loads_and_generates_without_transformers(llama):
    result = run_python(NO_TRANSFORMERS, llama[1], PROMPTS[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.rstrip("\n") == aotc.load(llama[1]).generate(PROMPTS[2],
                                                                     max_new_tokens=16)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    folder = bert_folder(d / "tiny-bert")
    return folder, exported(folder, d / "bert.aotc", "--task", "fill-mask", "--seq-len", 8)


def test_fill_mask_matches_transformers(bert):
    folder, art = bert
    m = aotc.load(art)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert m.tokenizer.encode("hello world") == tok.encode("hello world")
    batch = tok(["hello world and", "the quick brown fox jumps over"], padding=True,
                return_tensors="pt")        # another batch and length, padded: a real mask
    with torch.no_grad():
        want = hf(**batch).logits
    got = m(batch["input_ids"], batch["attention_mask"])["logits"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_image_classification_matches_transformers(tmp_path):
    folder = vit_folder(tmp_path / "tiny-vit")
    art = aotc.export(folder, path=tmp_path / "vit.aotc")      # the Python API, task inferred
    m = aotc.load(art)
    assert m.tokenizer is None
    hf = transformers.AutoModelForImageClassification.from_pretrained(folder).eval()
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        want = hf(pixel_values=pixels).logits
    torch.testing.assert_close(m(pixels)["logits"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("cls,task", [("BertForTokenClassification", "token-classification"),
                                      ("BertForSequenceClassification", "text-classification"),
                                      ("BertModel", "feature-extraction"),
                                      ("GPT2ForSequenceClassification", "text-classification")])
def test_text_tasks_match_transformers(tmp_path, cls, task):
    folder = (gpt2_folder if cls.startswith("GPT2") else bert_folder)(tmp_path / "m", cls)
    art = exported(folder, tmp_path / "m.aotc")          # the task from config.architectures
    m = aotc.load(art)
    hf = getattr(transformers, cls).from_pretrained(folder).eval()
    ids = torch.randint(4, 300, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[1, 7:] = 0
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask)
    got = m(ids, mask)
    key = "last_hidden_state" if task == "feature-extraction" else "logits"
    torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_gpt2_text_equals_transformers(tmp_path):
    """GPT-2's learned positions bound the cache (n_positions); its attention_mask comes after
    past_key_values in forward, which export passes by keyword."""
    folder = gpt2_folder(tmp_path / "gpt2")
    m = aotc.load(exported(folder, tmp_path / "gpt2.aotc"))
    assert m.max_cache_len == 96
    hf = (transformers.AutoModelForCausalLM.from_pretrained(folder).eval(),
          transformers.AutoTokenizer.from_pretrained(folder))
    for prompt in PROMPTS:
        assert m.generate(prompt, max_new_tokens=32) == hf_text(hf, prompt, 32)


@pytest.mark.slow
def test_batched_generator_matches_transformers(llama, hf_llama, tmp_path):
    """--batch 2: two prompts of one length run as one batch, others each alone."""
    art = exported(llama[0], tmp_path / "b2.aotc", "--batch", 2, "--max-cache-len", 64)
    m = aotc.load(art)
    assert m.generation.batch == 2 and m.max_cache_len == 64
    same = ["w1 w2 w3", "w7 w8 w9"]
    assert len({len(m.tokenizer.encode(p)) for p in same}) == 1
    assert m.generate(same, max_new_tokens=32) == [hf_text(hf_llama, p, 32) for p in same]
    assert m.generate(PROMPTS, max_new_tokens=8) == [hf_text(hf_llama, p, 8) for p in PROMPTS]


def test_folder_usage_errors(llama, tmp_path):
    folder, _ = llama
    result = invoke("export", folder, "--task", "object-detection", "-o", tmp_path / "x.aotc")
    assert result.exit_code == 2, result.output
    assert "object-detection" in result.output and "text-generation" in result.output
    result = invoke("export", folder, "-i", "1x8:int64", "-o", tmp_path / "x.aotc")
    assert result.exit_code == 2 and "example inputs" in result.output
    result = invoke("export", "samples/mlp.py:Net", "--task", "fill-mask", "-i", "2x4")
    assert result.exit_code == 2 and "--task applies to model folders" in result.output
    result = invoke("export", tmp_path, "-o", tmp_path / "x.aotc")
    assert result.exit_code == 2 and "without config.json" in result.output
    with pytest.raises(UsageError, match="--batch"):
        FolderOptions(batch=0)
    assert not (tmp_path / "x.aotc").exists()
    params = {p.name for p in main.commands["export"].params}
    assert {name for name, *_ in option_fields(FolderOptions)} <= params


def test_text_api_refuses_token_artifacts_without_tokenizer(llama, tmp_path):
    m = aotc.load(llama[1])
    m.tokenizer = None
    with pytest.raises(UsageError, match="carries no tokenizer"):
        m.generate("hello", max_new_tokens=4)


def test_module_factory_reference(tmp_path, monkeypatch):
    (tmp_path / "tinypkg").mkdir()
    (tmp_path / "tinypkg" / "__init__.py").write_text("")
    (tmp_path / "tinypkg" / "nets.py").write_text(
        "import torch\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = invoke("export", "tinypkg.nets:make", "-i", "2x4", "--no-prove")
    assert result.exit_code == 0, result.output
    m = aotc.load(tmp_path / "nets.aotc")
    x = torch.randn(2, 4)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    torch.testing.assert_close(m(x), net(x))


def test_tokenizer_of_older_folders(llama):
    """Folders of older transformers: special tokens as {"content": ...} in
    special_tokens_map.json, the chat template in tokenizer_config.json, and a
    generation_config whose eos_token_id is a list."""
    data = (llama[1] / "tokenizer" / "tokenizer.json").read_bytes()
    files = {"tokenizer.json": data,
             "special_tokens_map.json": json.dumps({"eos_token": {"content": "</s>"},
                                                    "pad_token": "<pad>"}).encode(),
             "tokenizer_config.json": json.dumps({"chat_template": [
                 {"name": "tool_use", "template": "tools"},
                 {"name": "default", "template": "{{ messages[0]['content'] }}!"}]}).encode()}
    tok = Tokenizer.from_files(files)
    assert tok.eos_token_ids == (2,) and tok.pad_token_id == 3
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"
    gen = {"generation_config.json": b'{"eos_token_id": [2, 1]}'}
    tok = Tokenizer.from_files(dict(files, **gen))
    assert tok.eos_token_ids == (2, 1)
    with pytest.raises(UsageError, match="no chat template"):
        Tokenizer.from_files({"tokenizer.json": data}).apply_chat_template([])
