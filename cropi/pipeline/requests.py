"""What the score step takes and gives back (``ScoreRequest``, ``ScoreResult``) and where its store lies.

Torch-free, so the service's HTTP process derives its options from them; the step itself is
``cropi.pipeline.score``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from cropi.contracts import NAME_HELP, NAME_PATTERN, POOL, Fusion, VectorDtype, is_name
from cropi.generation.options import CollectOptions
from cropi.gradients.options import LossOptions
from cropi.pipeline.rank import RankRequest, SelectorName, check_selector
from cropi.projection.spec import DEFAULT_SPEC, ProjectionSpec

_RANK = RankRequest.model_fields  # ranking settings: the rank step's defaults and bounds


def validation_names(sets: dict[str, str]) -> dict[str, str]:
    """``sets`` (validation set name -> prompt file) when every name is a valid split name other than the pool's."""
    for name in sets:
        if name == POOL or not is_name(name):
            raise ValueError(f"validation set name {name!r} must be {NAME_HELP} and not {POOL!r}")
    return sets


class RefreshOptions(BaseModel):
    """Which prompts a refresh re-collects: its criterion, threshold and budget (``cropi refresh``,
    and the curriculum's ``refresh`` at every stage after the first)."""

    model_config = ConfigDict(extra="forbid")

    criterion: Literal["ess", "status"] = Field("ess", description="'ess': ESS/K below --below; 'status': the "
                                                "probability that a fresh group's status differs above --above")
    below: Optional[float] = Field(None, gt=0, le=1, description="criterion 'ess' (needs it): refresh prompts "
                                   "whose ESS/K is below this")
    above: float = Field(0.5, ge=0, lt=1, description="criterion 'status': refresh prompts whose status-change "
                         "probability is above this")
    budget: float = Field(gt=0, le=1, description="at most this fraction of the split's prompts")
    groups: Literal["any", "all_equal"] = Field(
        "any", description="which reused groups may be re-collected: any, or all_equal only (the blind spot: a group "
        "of all-equal rewards has a zero gradient at every checkpoint, so no ranking can pick its prompt, while a "
        "mixed group's gradient follows the checkpoint through its importance ratios)")

    def recorded(self) -> dict:
        """The options as refresh folders and plans record them: ``groups`` only where it is not 'any', so a
        refresh planned before the choice existed keeps its folder and its plan."""
        doc = self.model_dump(mode="json")
        if doc["groups"] == "any":
            doc.pop("groups")
        return doc

    @model_validator(mode="after")
    def _threshold(self) -> "RefreshOptions":
        if self.criterion == "ess" and self.below is None:
            raise ValueError("criterion 'ess' needs --below (the ESS/K threshold, in (0, 1])")
        return self


class ScoringSettings(BaseModel):
    """How a pool is scored and its subset picked: the settings a score request and a curriculum share,
    spelled once here (``CurriculumConfig`` extends it with its stages and trainer). Old names are
    accepted: ``spec`` for ``projection``, ``top_fraction`` / ``fraction`` for ``select_fraction``,
    ``dtype`` for ``gradient_dtype``, ``method`` for ``selector``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    projection: ProjectionSpec = Field(DEFAULT_SPEC, validation_alias=AliasChoices("projection", "spec"))
    loss: LossOptions = LossOptions()
    collect: CollectOptions = CollectOptions()
    fusion: Fusion = _RANK["fusion"]
    select_fraction: float = Field(_RANK["select_fraction"].default, gt=0, le=1,
                                   description=_RANK["select_fraction"].description,
                                   validation_alias=AliasChoices("select_fraction", "top_fraction", "fraction"))
    selector: SelectorName = Field(_RANK["selector"].default, description=_RANK["selector"].description,
                                   validation_alias=AliasChoices("selector", "method"))
    selector_options: dict[str, Any] = _RANK["selector_options"]
    max_validation: int = _RANK["max_validation"]
    gradient_dtype: VectorDtype = Field("float16", description="stored vector dtype",
                                        validation_alias=AliasChoices("gradient_dtype", "dtype"))
    device: str = Field("auto", description="torch device for gradients ('auto': cuda when present)")
    validation_groups: Literal["none", "answer"] = Field(
        "none", description="'answer': one validation vector per answer label of each set, all fused (against "
                            "label skew on short-answer tasks; see cropi.scoring.diagnostics)")


class ScoreRequest(ScoringSettings):
    """What to score and how (the shared settings are ``ScoringSettings``)."""

    name: Optional[str] = Field(None, pattern=NAME_PATTERN,
                                description="checkpoint name in the store (default: derived from its content)")
    model: str = Field(min_length=1, description="checkpoint to score (Hugging Face folder)")
    pool: str = Field(min_length=1, description="prompt pool file (jsonl, parquet or verl parquet)")
    validation: dict[str, str] = Field(default_factory=dict, description="validation set name -> prompt file "
                                       "(ranking needs at least one)")
    trajectories: Optional[dict[str, str]] = Field(None, description="split -> trajectory store; missing ones "
                                                                     "are collected")
    behavior: Optional[str] = Field(None, description="checkpoint that collects missing trajectories "
                                                      "(default: the scored model)")
    seed: int = _RANK["seed"]

    _validation_names = field_validator("validation")(classmethod(lambda cls, v: validation_names(v)))

    @model_validator(mode="after")
    def _selector_options(self) -> "ScoreRequest":
        check_selector(self.selector, self.selector_options)
        return self

    @property
    def splits(self) -> dict[str, str]:
        """Split name -> prompt file: the pool first, then the validation sets."""
        return {POOL: self.pool, **self.validation}


class ScoreResult(BaseModel):
    """What one scoring did and where its output lies."""

    name: str = Field(description="checkpoint name in the store")
    spec_id: str
    trajectories: dict[str, str] = Field(description="split -> trajectory store used")
    computed: dict[str, dict[str, int]] = Field(description="split -> gradient rows computed now, by status")
    excluded: dict[str, int] = Field(description="pool prompts left unranked, by status")
    ranked: int
    selected: list[str] = Field(description="the selected pool prompts, best first")
    ranking: str = Field(description="the stored ranking file (its 'selected' column is ``selected``)")
    refreshed: Optional[list[str]] = Field(None, description="the pool prompts re-collected at the model and "
                                           "ranked from their fresh gradients (a refresh; None: none asked)")
    replaced_by: Optional[str] = Field(None, description="the split of the refreshed prompts' fresh gradients, "
                                       "whose rows the ranking read in place of theirs (None: none refreshed)")
    diagnostics: dict = Field(default_factory=dict, description="the selection's data-source and answer-label mix "
                                                                "against the pool, with warnings")


def store_path(root: str | Path) -> str:
    """The store (gradients, rankings) under a root the pipeline works in."""
    return str(Path(root).resolve() / "store")
