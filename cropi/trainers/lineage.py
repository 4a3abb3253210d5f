"""Where a stage checkpoint came from, so the next stage continues the same run.

Every checkpoint a trainer adapter writes carries a small ``cropi_stage.json``:
the trainer, the run's reference model (the curriculum's initial model, which the
KL loss compares against at every stage), the stage, the run's global step, and
where the trainer keeps state it can carry over (the optimizer). A folder without
the file is a fresh start: it is its own reference and the run is at step 0.

The file is JSON, not a weight or tokenizer file, so it does not change the
folder's content fingerprint (``cropi.utils.fingerprint``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cropi.errors import CorruptDataError

MARKER = "cropi_stage.json"


class StageMarker(BaseModel):
    """The lineage record kept in a stage checkpoint folder."""

    model_config = ConfigDict(extra="forbid")

    trainer: str
    reference_model: str = Field(description="absolute path of the run's initial model")
    stage: int = Field(ge=0)
    global_step: int = Field(ge=0, description="optimizer steps of the run when this checkpoint was saved")
    run_state: Optional[str] = Field(None, description="folder of carried trainer state (optimizer), if any")


def write_marker(checkpoint: str | Path, marker: StageMarker) -> Path:
    """Write ``marker`` into the checkpoint folder; return the file's path."""
    path = Path(checkpoint) / MARKER
    path.write_text(marker.model_dump_json(indent=2) + "\n")
    return path


def read_marker(model: str | Path) -> Optional[StageMarker]:
    """The marker of a checkpoint folder, or None when the folder has none (a fresh start)."""
    path = Path(model) / MARKER
    if not path.is_file():
        return None
    try:
        return StageMarker.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as e:
        raise CorruptDataError(f"{path} is not a valid stage marker ({e}); delete it to treat "
                               f"{model} as a fresh start, or restore it from the run") from None


def reference_model(model: str | Path) -> str:
    """The run's reference model for a checkpoint: its marker's, else the folder itself."""
    marker = read_marker(model)
    return marker.reference_model if marker else str(Path(model).resolve())
