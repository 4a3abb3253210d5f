"""Load a local checkpoint and its tokenizer the one way cropi uses them.

Always ``trust_remote_code=False`` and safetensors weights only (a checkpoint folder
is data, never code: pickle weights such as ``pytorch_model.bin`` can run code when
loaded, so they are refused, never loaded), and eager attention (per-example gradients through ``torch.func`` fail with sdpa
when an attention mask is passed).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from cropi.errors import InvalidInputError, NotFoundError

TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelLoadError(InvalidInputError):
    """A folder exists but is not a loadable checkpoint."""


def model_dir(path: str | Path) -> Path:
    """The checkpoint folder, checked to exist and to hold a config.json."""
    folder = Path(path)
    if not folder.exists():
        raise NotFoundError(f"model folder {folder} does not exist: pass the path of a checkpoint "
                            "saved with save_pretrained (or build one with cropi.models.build_tiny_model)")
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is a file, not a model folder: pass the folder that holds config.json")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} is not a model folder: expected config.json in it "
                             "(as written by save_pretrained)")
    return folder


def load_causal_lm(path: str | Path, *, device: str | torch.device = "cpu",
                   dtype: torch.dtype | str = torch.float32, attn_implementation: str = "eager"):
    """A causal LM from a local folder, in eval mode, on ``device``, in ``dtype``.

    Eager attention unless asked otherwise: only code that never takes per-example
    gradients (generation) should pass ``"sdpa"``.
    """
    from transformers import AutoModelForCausalLM

    folder = model_dir(path)
    _check_safetensors(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=_dtype(dtype),
                                                     attn_implementation=attn_implementation,
                                                     trust_remote_code=False, local_files_only=True,
                                                     use_safetensors=True)
    except (OSError, ValueError, pickle.UnpicklingError) as e:
        raise ModelLoadError(f"cannot load a causal LM from {folder}: {e}. Expected config.json with a "
                             "model type transformers knows and *.safetensors weights") from e
    return model.to(device).eval()


def _check_safetensors(folder: Path) -> None:
    """Refuse a folder whose weights are not in safetensors files, naming what it holds instead."""
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in PICKLE_WEIGHTS for p in folder.glob(pattern))
    if pickled:
        raise ModelLoadError(
            f"{folder} holds its weights only as pickle files ({', '.join(pickled[:5])}), which cropi never "
            "loads (unpickling can run code). Convert the checkpoint to safetensors where you trust its origin, "
            "e.g. AutoModelForCausalLM.from_pretrained(folder).save_pretrained(new_folder, "
            "safe_serialization=True), and pass new_folder")
    raise ModelLoadError(f"{folder} has no weights: expected model.safetensors (or sharded *.safetensors "
                         "with model.safetensors.index.json) beside config.json")


def load_tokenizer(path: str | Path):
    """The tokenizer saved beside a checkpoint (``AutoTokenizer``, no remote code)."""
    from transformers import AutoTokenizer

    folder = model_dir(path)
    if not any((folder / m).is_file() for m in TOKENIZER_MARKERS):
        raise ModelLoadError(f"{folder} has no tokenizer: expected one of {', '.join(TOKENIZER_MARKERS)} "
                             "beside config.json (save the tokenizer into the checkpoint folder)")
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load the tokenizer in {folder}: {e}") from e


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise InvalidInputError(f"unknown dtype {dtype!r}: use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]
