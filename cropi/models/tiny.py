"""Tiny Qwen2-architecture models built offline, for tests and the demo.

No model hub is reachable where cropi is tested, so a checkpoint is made from a
transformers config with seeded random weights, plus a byte-level BPE tokenizer
trained with the ``tokenizers`` library. The tokenizer uses exactly the pipeline
transformers' ``Qwen2Tokenizer`` rebuilds when ``AutoTokenizer`` loads a qwen2
folder (NFC, Qwen2's split regex, byte-level without its own regex), so token
ids agree between the ``tokenizers`` object, transformers and vLLM.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from cropi.errors import InvalidInputError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen2's pre-tokenizer split: digits one at a time, so numbers tokenize evenly.
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen-style ChatML; unlike Qwen2.5's template it adds no default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('unknown chat role ' + message['role'] + ': use system, user or assistant') -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' and not loop.first -%}"
    "{{- raise_exception('a system message must come first') -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

SIZES: dict[str, dict] = {
    # head_dim 64 in both: vLLM's CPU attention refuses small head dims such as 16.
    "tiny": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                 num_hidden_layers=2, intermediate_size=384, vocab_size=512),
    "small": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=4, intermediate_size=768, vocab_size=2048),
}

MAX_POSITIONS = 1024


class TinyModelError(InvalidInputError):
    """A tiny model cannot be built with the given settings."""


def build_tiny_model(out_dir: str | Path, *, size: Literal["tiny", "small"] = "tiny", seed: int = 0,
                     corpus: Iterable[str] | None = None, vocab_size: int | None = None) -> Path:
    """Build a seeded Qwen2 causal LM and its tokenizer into ``out_dir``; return the folder.

    ``vocab_size`` is the BPE training target (512 for "tiny", 2048 for "small"); the
    model's embedding has exactly as many rows as the trained tokenizer has tokens,
    so it can never sample an id the tokenizer cannot decode. The same arguments
    give the same bytes of weights and tokenizer.
    """
    if size not in SIZES:
        raise TinyModelError(f"unknown tiny model size {size!r}: use one of {sorted(SIZES)}")
    dims = dict(SIZES[size])
    target = dims.pop("vocab_size") if vocab_size is None else int(vocab_size)
    dims.pop("vocab_size", None)
    if target < 256 + len(SPECIAL_TOKENS):
        raise TinyModelError(f"vocab_size {target} is too small: a byte-level BPE needs at least "
                             f"{256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = default_corpus(seed) if corpus is None else corpus
    tokenizer = train_tokenizer(texts, target)
    _save_tokenizer(tokenizer, out)
    _save_model(out, dims, tokenizer, seed)
    return out


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE with Qwen2's pre-tokenization on ``texts``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _save_tokenizer(tok, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
                                      unk_token=None, bos_token=None,
                                      extra_special_tokens=[IM_START, IM_END],
                                      model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False)
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(out)
    # Say which class loads it, so transformers and vLLM agree without guessing.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _save_model(out: Path, dims: dict, tok, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos = tok.token_to_id(IM_END)
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), max_position_embeddings=MAX_POSITIONS,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos,
                         pad_token_id=tok.token_to_id(ENDOFTEXT), rope_theta=10000.0,
                         use_sliding_window=False, **dims)
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=config.pad_token_id,
                                               bos_token_id=None)
    model.save_pretrained(out, safe_serialization=True)
    (out / "model.safetensors").chmod(0o644)  # saved via a private temp file; others may read it


def default_corpus(seed: int = 0, n: int = 12000) -> Iterator[str]:
    """Short arithmetic word problems, chat-formatted dialogues and digit strings.

    Names are made from random syllables so the text has enough distinct words for
    BPE to reach a few thousand merges; everything is drawn from ``seed``.
    """
    rng = random.Random(seed)
    makers = (_word_problem, _chat, _digits, _equation)
    for i in range(n):
        yield makers[i % len(makers)](rng)


_SYLLABLES = ("ka", "lo", "mi", "ra", "te", "su", "no", "vi", "da", "pe", "zu", "ma", "ri", "to", "be",
              "sha", "len", "dor", "fin", "gal", "hu", "jo", "qui", "wen", "xa", "yo", "bri", "cla",
              "ste", "mon", "par", "el", "an", "is", "or", "ul")
_ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "cookies", "shells", "cards",
          "tickets", "eggs", "flowers", "stickers", "bottles", "boxes", "candies", "shirts", "cups")
_PLACES = ("market", "school", "library", "garden", "bakery", "store", "farm", "park", "office")
_PRICES = ("dollars", "cents", "euros", "coins")


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, worked solution, answer) of a one-step word problem."""
    name, other, item = _name(rng), _name(rng), rng.choice(_ITEMS)
    a, b = rng.randint(2, 99), rng.randint(1, 60)
    kind = rng.randrange(4)
    if kind == 0:
        return (f"{name} has {a} {item} and gets {b} more from {other}. How many {item} does {name} "
                f"have now?", f"{a} + {b} = {a + b}.", a + b)
    if kind == 1:
        return (f"{name} had {a + b} {item} at the {rng.choice(_PLACES)} and gave {b} to {other}. "
                f"How many {item} are left?", f"{a + b} - {b} = {a}.", a)
    if kind == 2:
        unit = rng.choice(_PRICES)
        return (f"{name} buys {b} {item} that cost {a} {unit} each. How many {unit} does {name} pay?",
                f"{b} * {a} = {a * b}.", a * b)
    return (f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each "
            f"friend get?", f"{a * b} / {b} = {a}.", a)


def _word_problem(rng: random.Random) -> str:
    question, work, answer = _problem(rng)
    return f"{question} {work} The answer is {answer}."


def _chat(rng: random.Random) -> str:
    system = f"{IM_START}system\nYou are a careful math tutor.{IM_END}\n" if rng.random() < 0.3 else ""
    question, work, answer = _problem(rng)
    return (f"{system}{IM_START}user\n{question} Put the final answer in \\boxed{{}}.{IM_END}\n"
            f"{IM_START}assistant\nLet me think step by step. {work} "
            f"The answer is \\boxed{{{answer}}}.{IM_END}\n")


def _digits(rng: random.Random) -> str:
    return " ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(8))


def _equation(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op, val = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)])
    return f"{a} {op} {b} = {val}. So the answer is \\boxed{{{val}}}."
