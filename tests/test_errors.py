"""cropi.errors.format_validation_error: pydantic's complaints as one line, spelled once, and the
library's option parsers (flags, job files, trainer and selector options) all using it."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field, ValidationError

from cropi.errors import InvalidInputError, format_validation_error


class Inner(BaseModel):
    k: int = Field(gt=0)


class Outer(BaseModel):
    lr: float = Field(gt=0)
    inner: Inner = Inner(k=1)


def _error(data) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate(data)
    return caught.value


def test_every_problem_on_one_line_with_its_place():
    e = _error({"lr": -1, "inner": {"k": 0}})
    assert format_validation_error(e) == ("lr: Input should be greater than 0; "
                                          "inner.k: Input should be greater than 0")


def test_a_problem_with_the_whole_value_is_named_by_whole():
    assert format_validation_error(_error([1]), "config").startswith("config: Input should be")


def test_where_renders_the_place_and_limit_counts_the_rest():
    e = _error({"lr": -1, "inner": {"k": 0}})
    flags = format_validation_error(e, where=lambda loc: "--" + str(loc[-1]).replace("_", "-"))
    assert flags == "--lr: Input should be greater than 0; --k: Input should be greater than 0"
    assert format_validation_error(e, limit=1) == "lr: Input should be greater than 0 (and 1 more)"
    assert format_validation_error(e, limit=2) == format_validation_error(e)


def test_the_library_parsers_say_it_the_same_way(tmp_path):
    from cropi.pipeline.jobfile import load_job_file
    from cropi.selection.base import get_selector
    from cropi.trainers.base import TrainerOptionsError, parse_options

    with pytest.raises(TrainerOptionsError, match=r"^bad options for trainer 'x': lr: Input should be greater"):
        parse_options(Outer, {"lr": 0}, "x")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"kind": "rank", "request": {"store": "s"}}))
    with pytest.raises(InvalidInputError, match=r"bad job file .*job\.json: rank\.request\.\w+: Field required"):
        load_job_file(job)
    with pytest.raises(InvalidInputError, match=r"bad options for selector 'random': no_such: Extra inputs"):
        get_selector("random").parse_options({"no_such": 1})


def test_a_bad_flag_is_named_as_the_flag(capsys):
    from cropi.cli import main

    code = main(["rank", "--store", "s", "--name", "n", "--pool", "pool", "--validation", "a", "--top-fraction", "2"])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith("error: --select-fraction: Input should be less than or equal to 1")
