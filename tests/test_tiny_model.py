"""Tiny local models: deterministic builds, one tokenization everywhere, loading and fingerprints."""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cropi.errors import InvalidInputError, NotFoundError
from cropi.models import build_tiny_model, load_causal_lm, load_tokenizer
from cropi.models.tiny import IM_END, IM_START, ENDOFTEXT, default_corpus
from cropi.utils.fingerprint import model_fingerprint

SAMPLE_TEXTS = [
    "", " ", "0", "1234567890", "3.14159 and -42 and 1,000,000",
    "Ann has 12 apples and gets 7 more. How many apples does Ann have now?",
    "  leading spaces\n\ntwo newlines\r\nwindows\ttab   trailing   ",
    "naïve café, Zürich, São Paulo, Ångström",
    "cafe\u0301 (combining accent) vs caf\u00e9",
    "中文数字 ١٢٣ (arabic-indic digits) ⅷ ½",
    "emoji 🙂👍🏽 and ZWJ 👩‍👩‍👧 sequences",
    "it's we're they'll I'M YOU'D",
    "\\boxed{42} $x^2 + y^2 = z^2$ {braces} [brackets]",
    f"{IM_START}user\nWhat is 2+2?{IM_END}\n{IM_START}assistant\n",
    f"text{ENDOFTEXT}more{IM_END}{IM_START}",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="module")
def raw_tokenizer(tiny):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny / "tokenizer.json"))


@pytest.fixture(scope="module")
def auto_tokenizer(tiny):
    return load_tokenizer(tiny)


def test_build_is_deterministic_for_a_seed(tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    assert model_fingerprint(again) == model_fingerprint(tiny)
    assert model_fingerprint(other) != model_fingerprint(tiny)


def test_folder_is_an_ordinary_hf_checkpoint(tiny):
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (tiny / name).is_file(), name
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is True
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # vLLM's CPU attention needs it
    assert cfg["max_position_embeddings"] == 1024


def test_tiny_size_and_vocab(tiny, auto_tokenizer):
    model = load_causal_lm(tiny)
    n_params = sum(p.numel() for p in model.parameters())
    assert 300_000 <= n_params <= 1_000_000
    assert model.config.vocab_size == len(auto_tokenizer) == 512  # the default corpus reaches the target
    assert model.dtype == torch.float32
    assert model.config._attn_implementation == "eager"
    assert not model.training


def test_small_size(tmp_path):
    path = build_tiny_model(tmp_path / "small", size="small", seed=3)
    model = load_causal_lm(path)
    n_params = sum(p.numel() for p in model.parameters())
    assert 2_000_000 <= n_params <= 8_000_000
    assert model.config.num_hidden_layers == 4 and model.config.intermediate_size == 768
    assert model.config.vocab_size == len(load_tokenizer(path)) == 2048


def test_custom_corpus_sets_vocab_from_tokenizer(tmp_path):
    path = build_tiny_model(tmp_path / "c", corpus=["one two three"] * 20, vocab_size=300)
    model = load_causal_lm(path)
    tok = load_tokenizer(path)
    # Few distinct words: BPE stops short of 300, and the embedding matches what it got.
    assert model.config.vocab_size == len(tok) < 300
    assert tok.encode("one two three", add_special_tokens=False) == [tok.convert_tokens_to_ids(t) for t in
                                                                     ["one", "Ġtwo", "Ġthree"]]


def test_build_rejects_bad_settings(tmp_path):
    with pytest.raises(InvalidInputError, match="size"):
        build_tiny_model(tmp_path / "x", size="huge")
    with pytest.raises(InvalidInputError, match="vocab_size"):
        build_tiny_model(tmp_path / "y", vocab_size=100)


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_ids_agree_between_tokenizers_and_transformers(text, raw_tokenizer, auto_tokenizer):
    ids = raw_tokenizer.encode(text).ids
    assert auto_tokenizer.encode(text, add_special_tokens=False) == ids
    assert auto_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)  # byte-level BPE is lossless


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60))
def test_ids_agree_on_arbitrary_text(raw_tokenizer, auto_tokenizer, text):
    ids = raw_tokenizer.encode(text).ids
    assert auto_tokenizer.encode(text, add_special_tokens=False) == ids
    assert auto_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_digits_are_single_tokens(auto_tokenizer):
    ids = auto_tokenizer.encode("9081726354", add_special_tokens=False)
    assert [auto_tokenizer.decode([i]) for i in ids] == list("9081726354")


def test_special_tokens(tiny, auto_tokenizer):
    specials = {t: auto_tokenizer.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)}
    for token, tid in specials.items():
        assert auto_tokenizer.encode(token, add_special_tokens=False) == [tid]
    assert auto_tokenizer.eos_token == IM_END and auto_tokenizer.pad_token == ENDOFTEXT
    gen = json.loads((tiny / "generation_config.json").read_text())
    cfg = json.loads((tiny / "config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"] == specials[IM_END]
    decoded = auto_tokenizer.decode(auto_tokenizer.encode(f"a{IM_END}b", add_special_tokens=False),
                                    skip_special_tokens=True)
    assert decoded == "ab"


def test_chat_template_renders_chatml(auto_tokenizer, raw_tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 17 + 25?"},
            {"role": "assistant", "content": "42"}, {"role": "user", "content": "And 1 + 1?"}]
    text = auto_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    assert text == expected + "<|im_start|>assistant\n"
    no_prompt = auto_tokenizer.apply_chat_template(msgs[1:2], add_generation_prompt=False, tokenize=False)
    assert no_prompt == "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n"  # no system message invented
    ids = auto_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(ids) == raw_tokenizer.encode(expected + "<|im_start|>assistant\n").ids


def test_chat_template_rejects_unknown_roles(auto_tokenizer):
    from jinja2 import TemplateError

    with pytest.raises(TemplateError, match="role"):
        auto_tokenizer.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)
    with pytest.raises(TemplateError, match="system"):
        auto_tokenizer.apply_chat_template([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}],
                                           tokenize=False)


def test_default_corpus_is_seeded():
    first = list(default_corpus(5, n=50))
    assert first == list(default_corpus(5, n=50))
    assert first != list(default_corpus(6, n=50))
    assert any(IM_START in t for t in first) and any(ch.isdigit() for t in first for ch in t)


def test_model_runs_and_matches_a_fresh_load(tiny, auto_tokenizer):
    from transformers import AutoModelForCausalLM

    model = load_causal_lm(tiny)
    ids = torch.tensor([auto_tokenizer.encode("Ann has 3 apples.", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
        reference = AutoModelForCausalLM.from_pretrained(tiny, attn_implementation="sdpa")(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.allclose(logits, reference, atol=1e-5)


def test_load_errors_say_what_is_expected(tmp_path, tiny):
    with pytest.raises(NotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "missing")
    with pytest.raises(NotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInputError, match="config.json"):
        load_causal_lm(empty)
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    with pytest.raises(InvalidInputError, match="not a model folder"):
        load_causal_lm(afile)
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(tiny / name, no_tok / name)
    assert load_causal_lm(no_tok) is not None
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(tiny / "config.json", no_weights / "config.json")
    with pytest.raises(InvalidInputError, match="has no weights: expected model.safetensors"):
        load_causal_lm(no_weights)
    with pytest.raises(InvalidInputError, match="tokenizer"):
        load_tokenizer(no_tok)
    with pytest.raises(InvalidInputError, match="dtype"):
        load_causal_lm(tiny, dtype="float8")


def test_fingerprint_tracks_weights_config_and_tokenizer(tiny, tmp_path):
    base = model_fingerprint(tiny)
    assert len(base) == 16 and int(base, 16) >= 0

    def variant(name):
        dst = tmp_path / name
        shutil.copytree(tiny, dst)
        return dst

    resaved = variant("resaved")  # only bookkeeping changes: same fingerprint
    cfg = json.loads((resaved / "config.json").read_text())
    cfg["transformers_version"] = "0.0.1"
    (resaved / "config.json").write_text(json.dumps(cfg, indent=7))
    (resaved / "generation_config.json").write_text("{}")
    (resaved / "README.md").write_text("notes")
    (resaved / "optimizer.pt").write_bytes(b"trainer state is not the model")
    (resaved / "training_args.bin").write_bytes(b"nor are its arguments")
    assert model_fingerprint(resaved) == base

    weights = variant("weights")
    model = load_causal_lm(weights)
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3
    model.save_pretrained(weights)
    assert model_fingerprint(weights) != base

    config = variant("config")
    cfg = json.loads((config / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (config / "config.json").write_text(json.dumps(cfg))
    assert model_fingerprint(config) != base

    tok = variant("tok")
    (tok / "chat_template.jinja").write_text("{{ messages }}")
    assert model_fingerprint(tok) != base


def test_fingerprint_errors(tmp_path):
    with pytest.raises(NotFoundError):
        model_fingerprint(tmp_path / "missing")
    with pytest.raises(InvalidInputError, match="config.json"):
        model_fingerprint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="weight"):
        model_fingerprint(tmp_path)
