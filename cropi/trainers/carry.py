"""What an in-process trainer carries from one curriculum stage to the next.

The policy's weights (a Hugging Face folder the next stage scores and loads), the
AdamW state, and the lineage marker. Shared by the embedded adapters (``lean``,
``trl``) so a stage saved by one reads the same way in the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from cropi.errors import InvalidInputError
from cropi.trainers.base import TrainingFailedError
from cropi.trainers.lineage import StageMarker, write_marker

OPTIMIZER_FILE = "optimizer.pt"


def adamw(policy, *, lr: float, weight_decay: float, carry: bool, previous: Optional[StageMarker],
          trainer: str):
    """AdamW over every parameter, with the previous stage's state when this trainer wrote it."""
    import torch

    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    if not (carry and previous and previous.trainer == trainer and previous.run_state):
        return optimizer
    path = Path(previous.run_state) / OPTIMIZER_FILE
    if not path.is_file():
        raise InvalidInputError(f"the previous stage's optimizer state {path} is missing: restore it, or "
                                "pass carry_optimizer=False to start this stage with a fresh AdamW")
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        optimizer.load_state_dict(state)
    except ValueError as e:
        raise InvalidInputError(f"{path} does not fit this model ({e}); pass carry_optimizer=False") from None
    for group in optimizer.param_groups:
        # A loaded state brings the old stage's settings; this stage's options win.
        group.update(lr=lr, weight_decay=weight_decay)
        group.pop("initial_lr", None)
    return optimizer


def save_stage(model, tokenizer, optimizer, out: Path, marker: StageMarker) -> Path:
    """Weights + config + tokenizer + marker in ``out/checkpoint``; AdamW state in ``out/trainer_state``.

    Saved with ``save_pretrained`` rather than a trainer's own saver, which may drop
    extra files (``training_args.bin``) into the folder and change its fingerprint.
    """
    import torch

    checkpoint, state_dir = out / "checkpoint", out / "trainer_state"
    checkpoint.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(checkpoint, safe_serialization=True)
    tokenizer.save_pretrained(checkpoint)
    if not any(checkpoint.glob("*.safetensors")):
        raise TrainingFailedError(f"no weights were written into {checkpoint}; see {out / 'train.log'}")
    torch.save(optimizer.state_dict(), state_dir / OPTIMIZER_FILE)
    write_marker(checkpoint, marker.model_copy(update={"run_state": str(state_dir.resolve())}))
    return checkpoint.resolve()
