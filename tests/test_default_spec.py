"""One default projection spec (cropi.projection.spec.DEFAULT_SPEC): ProjectionSpec's own field defaults,
so every partial spec is filled from it, whichever door it comes through, and the CLI's help prints it.
(The service's door, through HTTP, is tests/test_service_scoring.py.)"""

from __future__ import annotations

import argparse

from cropi.pipeline.compute_gradients import GradientJob
from cropi.pipeline.requests import ScoreRequest, ScoringSettings
from cropi.projection.fidelity import measured
from cropi.projection.spec import DEFAULT_SPEC, ONLINE_FILTER_SPEC, ProjectionSpec

GRADIENTS = ["gradients", "--model", "m", "--trajectories", "t", "--store", "s", "--split", "pool"]


def test_the_default_is_the_measured_scoring_spec_and_stored_ids_keep_their_meaning():
    assert DEFAULT_SPEC == ProjectionSpec(kind="tensorsketch", dim=4096)
    assert measured(DEFAULT_SPEC)["cell"] == "tensorsketch/k=4096"
    assert DEFAULT_SPEC.spec_id == "d4e200e094e0a4a8"  # the scoring spec's id before it became the default
    # an explicit spec's id never depends on the defaults: the former default sjlt spec's is unchanged
    assert ProjectionSpec(kind="sjlt", dim=32768, kept_fraction=0.1).spec_id == "d46e98ad85e66abb"


def test_a_partial_spec_is_filled_from_the_default():
    assert ScoringSettings.model_validate({"projection": {}}).projection == DEFAULT_SPEC
    assert ScoringSettings.model_validate({}).projection == DEFAULT_SPEC
    assert ScoreRequest.model_validate({"model": "m", "pool": "p", "spec": {}}).projection == DEFAULT_SPEC
    assert ProjectionSpec(dim=8192) == DEFAULT_SPEC.model_copy(update={"dim": 8192})
    assert ProjectionSpec.model_validate({"seed": 3}) == DEFAULT_SPEC.model_copy(update={"seed": 3})
    # every field's default is the default spec's value: nothing else fills a field left out
    assert {n: f.default for n, f in ProjectionSpec.model_fields.items()} == DEFAULT_SPEC.model_dump()


def test_the_cli_fills_a_partial_spec_from_the_default_and_its_help_prints_it():
    from cropi.cli import build_parser, gradient_job_from_args

    parser = build_parser()
    job = gradient_job_from_args(parser.parse_args([*GRADIENTS, "--projection-dim", "8192"]))
    assert job.projection == DEFAULT_SPEC.model_copy(update={"dim": 8192})
    assert gradient_job_from_args(parser.parse_args(GRADIENTS)).projection == DEFAULT_SPEC
    assert GradientJob.model_validate({"model": "m", "trajectories": "t", "store": "s", "split": "pool"}
                                      ).projection == DEFAULT_SPEC
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["gradients"]
    helps = {a.dest: a.help for a in sub._actions}
    for field, value in DEFAULT_SPEC.model_dump().items():
        shown = "none" if value is None else value
        assert helps[f"projection.{field}"].endswith(f"(default: {shown})"), (field, helps[f"projection.{field}"])


def test_the_online_filters_spec_is_named_for_its_own_purpose():
    """Not a second default: the online filters keep the factored kind for its cost per response
    (docs/online_filtering.md), under a name of its own."""
    from cropi.trainers.filters import OnlineFilterOptions

    assert OnlineFilterOptions().projection == ONLINE_FILTER_SPEC == ProjectionSpec(kind="factored")
    assert ONLINE_FILTER_SPEC != DEFAULT_SPEC
