"""A curriculum's config: the closed schema, reading it from a file, and the resume key."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, ValidationError, field_validator, model_validator

from cropi.contracts import NAME_HELP, is_name
from cropi.errors import InvalidInputError, format_validation_error
from cropi.generation import CollectOptions
from cropi.pipeline.curriculum.check import CheckOptions
from cropi.pipeline.requests import RefreshOptions, ScoreRequest, ScoringSettings, validation_names
from cropi.selection import RANKING_SELECTORS, SELECTORS, get_selector
from cropi.utils.hashing import short_hash

# Check options whose default changed, each at the commit that changed it (issue 32's revisions): refresh status ->
# blind_spot (19ec187), widened selection -> filled (4047630), sizing theta_0 -> stage_start (1e0a25a), widen_when
# saturated -> stalled (ddfb16b, revision 16), race_length part -> sequential (001c144, revision 19), race_sample
# check -> rest (6d8838d, revision 22), race_no_gain keep -> pool (the commit after 6253806, revision 23), race_no_gain
# pool -> restart (the commit after 50459a6, revision 24), race_gain any -> resolved (the commit after 2d973e6,
# revision 25), no_gain_draw pool -> mixed (the commit after d412228, revision 26), race_futility never -> stop (the
# commit after 800dbd0, revision 27).
CHANGED_DEFAULTS = ("refresh", "widened", "sizing", "widen_when", "race_length", "race_sample", "race_no_gain",
                    "race_gain", "no_gain_draw", "race_futility")

# The checked curriculum's refresh (check.refresh): the status criterion at its decision point (a fresh group more
# likely than not in the other status) and no cap, which would keep the blind spot for the prompts over it; both
# ways ("status", issue 32's revision 9) or the blind spot's way only ("blind_spot": reused all-equal groups,
# revision 10)
_STATUS = RefreshOptions(criterion="status", above=0.5, budget=1.0)
CHECK_REFRESH = {"status": _STATUS, "blind_spot": _STATUS.model_copy(update={"groups": "all_equal"})}

METHODS = SELECTORS  # a curriculum's method is a selector of the registry
MAX_STAGES = 1000


class CurriculumConfigError(InvalidInputError):
    """A curriculum config that cannot run (a bad file, a missing validation set)."""


class CurriculumConfig(ScoringSettings):
    """One staged curriculum: the scoring settings (``ScoringSettings``, shared with the score step) and
    its stages and trainer. ``reward`` is the curriculum's one reward: trajectories are collected and the
    trainer trains with it (``collect.reward`` is set from it)."""

    name: str = Field(description="the curriculum's folder under <root>/curricula")
    model: str = Field(min_length=1, description="initial checkpoint (Hugging Face folder)")
    pool: str = Field(min_length=1, description="prompt pool file (jsonl, parquet, verl parquet)")
    validation: dict[str, str] = Field(default_factory=dict, description="validation split name -> prompt file")
    stages: int = Field(3, ge=1, le=MAX_STAGES)
    steps_per_stage: int = Field(10, ge=1)
    skew_fields: list[str] = Field(default_factory=list, max_length=32, description="keys of the pool records' "
                                   "extra_info whose skew every stage's record checks beside the answer labels "
                                   "(a latent feature the targets may share: a shortcut)")
    trainer: str = "trl"
    trainer_options: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(0, ge=0)
    reward: str = CollectOptions.model_fields["reward"]
    recollect_each_stage: bool = False
    check: CheckOptions = Field(default_factory=CheckOptions, description="train each stage in parts and check its "
                                "effect on the validation sets after each (cropi.pipeline.curriculum.check)")
    refresh: Optional[RefreshOptions] = Field(
        None, description="CROPI, at every stage after the first: re-collect the pool prompts this picks at "
                          "theta_m and rank them from their fresh gradients (cropi.pipeline.refresh)")

    @property
    def stage_refresh(self) -> Optional[RefreshOptions]:
        """The refresh a stage's scoring runs: the curriculum's own, else the check's (``check.refresh``) where
        a ranking selector reuses theta_0's trajectories."""
        if self.refresh is not None:
            return self.refresh
        if self.check.enabled and self.check.refresh != "never" and self.ranks and not self.recollect_each_stage:
            return CHECK_REFRESH[self.check.refresh]
        return None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not is_name(v):
            raise ValueError(f"curriculum name {v!r} must be {NAME_HELP}")
        return v

    _validation_names = field_validator("validation")(classmethod(lambda cls, v: validation_names(v)))

    @model_validator(mode="after")
    def _check(self) -> "CurriculumConfig":
        if (self.ranks or "validation" in get_selector(self.selector).needs) and not self.validation:
            raise ValueError(f"selector {self.selector!r} reads the validation sets: give at least one "
                             "under 'validation' (split name -> prompt file)")
        get_selector(self.selector).parse_options(self.selector_options)
        get_selector(self.check.fallback)  # an unknown fallback fails here, naming the known selectors
        if self.refresh is not None and (not self.ranks or self.recollect_each_stage):
            raise ValueError("'refresh' re-collects part of the pool that CROPI reuses from the initial model: it "
                             f"needs a ranking selector ({', '.join(RANKING_SELECTORS)}) and recollect_each_stage "
                             "false (which re-collects all of it)")
        if self.collect.reward != self.reward:  # one reward: collection follows the curriculum's
            object.__setattr__(self, "collect", self.collect.model_copy(update={"reward": self.reward}))
        return self

    @property
    def method(self) -> str:
        """The selector's name (the field's name before selectors were one registry)."""
        return self.selector

    @property
    def ranks(self) -> bool:
        """Whether the selector reads the influence ranking (then every stage is scored at theta_m)."""
        return self.selector in RANKING_SELECTORS

    @classmethod
    def from_file(cls, path: str | Path) -> "CurriculumConfig":
        """Load a YAML (.yaml/.yml) or JSON file; relative paths in it are taken from the file's folder."""
        path = Path(path)
        if not path.is_file():
            raise CurriculumConfigError(f"curriculum config {path} does not exist")
        text = path.read_text()
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as e:  # yaml and json raise different types; the message is what matters
            raise CurriculumConfigError(f"cannot parse {path}: {e}") from None
        if not isinstance(data, dict):
            raise CurriculumConfigError(f"{path} must hold a mapping of config fields, got {type(data).__name__}")
        return cls.parse(_resolve_paths(data, path.parent))

    @classmethod
    def parse(cls, data: dict) -> "CurriculumConfig":
        """``model_validate`` with pydantic's errors as one readable ``CurriculumConfigError``."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise CurriculumConfigError(f"bad curriculum config: {format_validation_error(e, 'config')}") from None

    def resume_keys(self) -> set[str]:
        """The keys a curriculum started with this config may have stored: ``resume_key``, and one for each set of
        the check options whose default changed (``CHANGED_DEFAULTS``) that this config holds at today's default,
        as a curriculum naming that value before it was the default spelled it (the value means what it did then,
        so that curriculum resumes; without this it was refused as started with another config)."""
        changed = [n for n in CHANGED_DEFAULTS if getattr(self.check, n) == getattr(CheckOptions(), n)]
        return {self.resume_key(frozenset(named)) for r in range(len(changed) + 1)
                for named in itertools.combinations(changed, r)}

    def resume_key(self, named: frozenset[str] = frozenset()) -> str:
        """Hash of everything a resumed run must keep (all but ``stages``).

        Taken over the config as state.json version 1 spelled it (``collect.backend_options``,
        no ``collect.reward``), so curricula started before the options were unified resume.
        ``named``: check options kept in the key even at their default (``resume_keys``).
        """
        doc = self.model_dump(mode="json", exclude={"stages"})
        doc["method"] = doc.pop("selector")  # the key's name before the selector registry
        for later in ("selector_options", "skew_fields"):  # added later: curricula started before keep their key
            if not doc[later]:
                doc.pop(later)
        doc["loss"] = self.loss.recorded()  # CROPI's estimator as before the choice existed
        doc["projection"] = self.projection.recorded()  # no factor fields unless the kind is factored
        # added later: curricula started before keep their key
        later = ("confirm_on", "at_whole_pool", "best_of", "test", "rerace", "refresh", "widened", "sizing",
                 "saturation_reference", "widen_check", "screen", "race_length", "widen_when", "race_unresolved",
                 "race_sample", "race_no_gain", "race_gain", "pool_revisit",
                 "no_gain_draw", "race_futility", "race_gain_length", "race_efficacy")
        for name in later:
            if doc["check"][name] == getattr(CheckOptions(), name) and name not in named:
                doc["check"].pop(name)
        if doc["check"] == CheckOptions().model_dump(mode="json", exclude=set(later)):
            doc.pop("check")  # added later, on by default: curricula started before keep their key
        if doc["refresh"] is None:
            doc.pop("refresh")  # added later, as validation_groups
        if doc["validation_groups"] == "none":
            doc.pop("validation_groups")  # added later: curricula started before it keep their key
        collect = doc["collect"]
        collect.pop("reward")
        collect["backend_options"] = {k: v for k, v in collect.pop("engine").items() if v is not None}
        return short_hash(doc)

    def score_request(self, model: str, behavior: str) -> ScoreRequest:
        """The score step's request for ``model`` over ``behavior``'s trajectories: the pool, and for a
        ranking selector the validation sets (the pass-rate controls need the pool's trajectories only)."""
        shared = self.model_dump(include=set(ScoringSettings.model_fields))
        if not self.ranks:  # the request ranks nothing: its selector is moot
            shared.pop("selector")
            shared.pop("selector_options")
        return ScoreRequest(model=model, behavior=behavior, pool=self.pool,
                            validation=self.validation if self.ranks else {}, seed=self.seed, **shared)


def _resolve_paths(data: dict, base: Path) -> dict:
    def fix(p: Any) -> Any:
        return str((base / p).resolve()) if isinstance(p, str) and "://" not in p and not Path(p).is_absolute() else p

    data = dict(data)
    for key in ("model", "pool"):
        if key in data:
            data[key] = fix(data[key])
    if isinstance(data.get("validation"), dict):
        data["validation"] = {k: fix(v) for k, v in data["validation"].items()}
    return data
