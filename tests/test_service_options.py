"""The service's options are the library's: every library option field reaches a caller or is refused
by name, and a field added to a library model reaches the service (or is refused there by name)
with nothing in cropi_service/ edited."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from cropi.generation.options import CollectOptions, EngineOptions
from cropi.gradients.options import LossOptions
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.requests import RefreshOptions, ScoreRequest
from cropi.projection.spec import ProjectionSpec
from cropi.trainers.trl import TrlOptions
from cropi.trainers.verl import VerlOptions
from cropi_service.options import caller

REPO = Path(__file__).resolve().parents[1]
PAIRS = [(caller.Projection, ProjectionSpec), (caller.Loss, LossOptions), (caller.Engine, EngineOptions),
         (caller.Collect, CollectOptions), (caller.ScoringOptions, ScoreRequest),
         (caller.CurriculumOptions, CurriculumConfig), (caller.Refresh, RefreshOptions), (caller.TrlTraining, TrlOptions),
         (caller.VerlTraining, VerlOptions)]


def schema_fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_json_schema()["properties"])


@pytest.mark.parametrize("service,library", PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_each_library_field_is_offered_or_refused_by_name(service, library):
    offered = schema_fields(service) - {"name"} if service in (caller.TrlTraining, caller.VerlTraining) \
        else schema_fields(service)
    assert offered <= set(library.model_fields)
    for field in sorted(set(library.model_fields) - offered):
        with pytest.raises(ValidationError) as e:
            service.model_validate({field: "x", **({"name": "trl"} if service is caller.TrlTraining else {}),
                                    **({"name": "verl"} if service is caller.VerlTraining else {})})
        assert any(err["loc"][-1] == field and "cannot be set by a caller" in err["msg"]
                   for err in e.value.errors()), e.value


def test_offered_fields_keep_the_library_bounds_and_tighten_them():
    assert caller.Collect.model_validate({"pool_samples": 256}).pool_samples == 256
    with pytest.raises(ValidationError, match="less than or equal to 256"):  # the service's tighter bound
        caller.Collect.model_validate({"pool_samples": 257})
    with pytest.raises(ValidationError, match="greater than 0"):  # the library's own bound
        caller.Collect.model_validate({"pool_samples": 0})
    with pytest.raises(ValidationError, match="micro_batch 3 must divide"):  # a library validator, at the edge
        caller.TrlTraining.model_validate({"name": "trl", "micro_batch": 3})
    # the library's old names are accepted, and the library request gets the library's names
    assert caller.ScoringOptions.model_validate({"top_fraction": 0.5}).model_dump(exclude_none=True) == \
        {"select_fraction": 0.5}


def test_a_caller_names_a_selector_of_the_librarys_registry():
    from cropi.selection import DEFAULT_SELECTOR, SELECTORS

    assert caller.ScoringOptions.model_validate({}).model_dump(exclude_none=True).get("selector",
                                                                                      DEFAULT_SELECTOR) == "cropi"
    check = caller.CurriculumOptions.model_validate({"check": {"parts": 2, "fallback": "informative"}}).check
    assert (check.parts, check.fallback) == (2, "informative")  # the check's options are closed: a caller's
    with pytest.raises(ValidationError, match="fallback"):
        caller.CurriculumOptions.model_validate({"check": {"fallback": "nope"}})
    assert caller.CurriculumOptions.model_validate({"selector": "informative"}).selector == "informative"
    assert caller.CurriculumOptions.model_validate({"method": "cropi"}).selector == "cropi"  # the old name
    with pytest.raises(ValidationError) as e:
        caller.CurriculumOptions.model_validate({"selector": "best"})
    assert all(name in str(e.value) for name in SELECTORS)  # the refusal lists the registered ones


def test_a_curriculum_caller_may_ask_for_a_per_stage_refresh_within_the_librarys_rules():
    got = caller.CurriculumOptions.model_validate({"refresh": {"criterion": "status", "above": 0.4, "budget": 0.2}})
    assert got.model_dump(exclude_none=True)["refresh"] == {"criterion": "status", "above": 0.4, "budget": 0.2}
    with pytest.raises(ValidationError, match="needs --below"):  # the library's cross-field rule, at the edge
        caller.CurriculumOptions.model_validate({"refresh": {"criterion": "ess", "budget": 0.2}})
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        caller.CurriculumOptions.model_validate({"refresh": {"criterion": "status", "budget": 2}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        caller.CurriculumOptions.model_validate({"refresh": {"budget": 0.2, "out": "/etc"}})


def test_a_curriculum_requests_stages_and_fraction_are_the_librarys_fields():
    """The request's own ``stages`` and ``fraction`` restate nothing: their bounds, defaults and descriptions are
    the library's (``stages`` under the shared server's tighter bound, stated once in ``caller``), and the job's
    stored parameters judge them alike at job start."""
    from annotated_types import Le

    from cropi.pipeline.curriculum.config import MAX_STAGES
    from cropi_service.options.derive import library_field
    from cropi_service.options.params import CurriculumParams
    from cropi_service.options.requests import CurriculumCreate

    assert caller.MAX_STAGES <= MAX_STAGES
    for model in (CurriculumCreate, CurriculumParams):
        for mine, theirs, tighter in (("stages", "stages", [Le(caller.MAX_STAGES)]),
                                      ("fraction", "select_fraction", [])):
            field, library = model.model_fields[mine], CurriculumConfig.model_fields[theirs]
            assert field.annotation is library.annotation and field.metadata == [*library.metadata, *tighter]
            assert field.description == library.description
            if model is CurriculumCreate:
                assert field.default == library.default
    body = {"name": "cur", "path": "m", "pool": "ds_1", "validation": ["ds_2"]}
    assert CurriculumCreate.model_validate(body | {"stages": caller.MAX_STAGES}).stages == caller.MAX_STAGES
    with pytest.raises(ValidationError, match=f"less than or equal to {caller.MAX_STAGES}"):
        CurriculumCreate.model_validate(body | {"stages": caller.MAX_STAGES + 1})
    with pytest.raises(ValidationError, match="greater than 0"):  # the library's own bound
        CurriculumCreate.model_validate(body | {"fraction": 0})
    # ``fraction`` is a name the library accepts for select_fraction: the service spells none of its own
    assert "fraction" in CurriculumConfig.model_fields["select_fraction"].validation_alias.choices
    with pytest.raises(TypeError, match="not accepted as 'share'"):
        library_field(CurriculumConfig, "select_fraction", name="share")


# A library edit the service has never seen: a bounded number, and a free-form path.
LIBRARY_EDIT = '''    new_knob: int = Field(3, ge=0, le=9, description="a new collection setting")
    new_path: str = Field("x", description="a new file to read")
'''

PROBE = r'''
import json, sys
from pydantic import ValidationError
from cropi_service.options.params import ScoringParams
from cropi_service.options.requests import CheckpointCreate

out = {"offered": sorted(CheckpointCreate.model_json_schema()["$defs"]["Collect"]["properties"])}
params = {"roots": ["/r"], "name": "ck", "model": "/r/m", "pool": "/r/p.jsonl", "validation": {"gsm": "/r/g.jsonl"}}
for key, value in (("new_knob", 5), ("new_knob", 10), ("new_path", "/etc/passwd")):
    body = {"name": "ck", "path": "m", "pool": "ds_1", "validation": ["ds_2"], "options": {"collect": {key: value}}}
    try:
        CheckpointCreate.model_validate(body)
        request = ScoringParams.model_validate({**params, "options": body["options"]}).library_request()
        out[f"{key}={value}"] = getattr(request.collect, key)
    except ValidationError as e:
        out[f"{key}={value}"] = [".".join(map(str, err["loc"])) + ": " + err["msg"] for err in e.errors()]
print(json.dumps(out))
'''


def test_a_field_added_to_a_library_model_reaches_the_service_unedited(tmp_path):
    library = tmp_path / "cropi"
    shutil.copytree(REPO / "cropi", library, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    options = library / "generation" / "options.py"
    text = options.read_text()
    anchor = "    # The default is part of every stored curriculum's resume key"
    assert anchor in text
    options.write_text(text.replace(anchor, LIBRARY_EDIT + anchor))
    # the edited library first on the path; cropi_service comes from this tree, untouched
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert "new_knob" in out["offered"] and "new_path" not in out["offered"]
    assert out["new_knob=5"] == 5  # reaches the library's request
    assert any(m.startswith("options.collect.new_knob:") and "less than or equal to 9" in m for m in out["new_knob=10"])
    assert any(re.match(r"options\.collect\.new_path: .*new_path cannot be set by a caller: it is free-form", m)
               for m in out["new_path=/etc/passwd"])
