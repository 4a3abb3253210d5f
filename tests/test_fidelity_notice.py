"""A spec whose fidelity was never measured at its size is usable; `cropi rank` prints a notice naming
the benchmark. The table of measured specs agrees with the committed results it cites."""

from __future__ import annotations

import json
from pathlib import Path

from cropi.projection import ProjectionSpec
from cropi.projection.fidelity import BENCHMARK, MEASURED, measured, notice

ROOT = Path(__file__).resolve().parents[1]


def test_measured_specs_are_every_cell_of_the_results_they_cite():
    cited = {m["result"] for m in MEASURED.values()}
    for path in cited:
        grid = json.loads((ROOT / path).read_text())["grid"]
        for name, cell in grid.items():
            for s in cell["seeds"]:
                fields = {"kind": cell["kind"], "seed": int(s)}
                if cell["kind"] == "factored":
                    f = name.split("/")[1].split("x")
                    fields |= {"factor_out": int(f[0]), "factor_in": int(f[1])}
                elif cell["kind"] != "identity":
                    fields |= {"dim": cell["k"]}
                    if cell["kind"] != "tensorsketch":
                        fields["kept_fraction"] = cell["kept_fraction"]
                found = measured(ProjectionSpec(**fields))
                assert found is not None and found["result"] in cited, (path, name)


def test_notice_for_an_unmeasured_size_names_the_benchmark_and_none_for_a_measured_one():
    assert notice(ProjectionSpec()) is None  # the default spec, at any seed
    assert notice(ProjectionSpec(seed=7)) is None
    assert notice(ProjectionSpec(kind="tensorsketch", dim=4096, seed=3)) is None
    for spec in (ProjectionSpec(dim=8192), ProjectionSpec(kind="factored", factor_in=64, factor_out=64),
                 ProjectionSpec(kind="tensorsketch", dim=8192), ProjectionSpec(exclude="embed")):
        text = notice(spec)
        assert text and BENCHMARK in text and spec.spec_id in text


def test_cropi_rank_prints_the_notice_for_an_unmeasured_spec(tmp_path, capsys):
    from support.golden import rank_through_cli, store_through_cli

    store = store_through_cli(tmp_path, "--projection-kind", "tensorsketch", "--projection-dim", "512",
                              "--dtype", "float32")
    capsys.readouterr()
    ranked = rank_through_cli(store)
    err = capsys.readouterr().err
    spec = ProjectionSpec(kind="tensorsketch", dim=512)
    assert ranked["meta"]["spec_id"] == spec.spec_id and ranked["rows"]  # the spec is used
    assert BENCHMARK in err and spec.spec_id in err
    assert ranked["meta"]["projection"]["kind"] == "tensorsketch" and ranked["meta"]["projection"]["dim"] == 512
    assert ranked["meta"]["fidelity"] is None  # recorded with the ranking: never measured at this size


def test_scoring_defaults_to_the_measured_spec_and_each_ranking_records_it(tmp_path, capsys):
    """No projection named: the gradients job and the ranking use DEFAULT_SPEC, whose fidelity is measured;
    the ranking's meta names the spec and the result that measured it, and no notice is printed."""
    from support.golden import rank_through_cli, store_through_cli

    from cropi.pipeline.requests import ScoreRequest
    from cropi.projection.spec import DEFAULT_SPEC

    assert ScoreRequest.model_fields["projection"].default == DEFAULT_SPEC and measured(DEFAULT_SPEC)
    store = store_through_cli(tmp_path, "--dtype", "float32")
    capsys.readouterr()
    ranked = rank_through_cli(store)
    assert BENCHMARK not in capsys.readouterr().err
    meta = ranked["meta"]
    assert meta["spec_id"] == DEFAULT_SPEC.spec_id
    assert ProjectionSpec(**meta["projection"]) == DEFAULT_SPEC
    assert meta["fidelity"] == measured(DEFAULT_SPEC) and meta["fidelity"]["cell"] == "tensorsketch/k=4096"


def test_each_dtype_measurement_agrees_with_the_result_it_cites_and_names_its_device():
    """A bfloat16 measurement (benchmarks/fidelity.py --model-dtype bfloat16) counts for its spec in that
    dtype only; float32 entries say they were measured on CPU in float32."""
    from cropi.projection.fidelity import DTYPE_MEASURED, DTYPE_RESULTS

    for entry in MEASURED.values():
        assert entry["device"] == "cpu" and entry["model_dtype"] == "float32"
    for dtype, path in DTYPE_RESULTS.items():
        file = ROOT / path
        if not file.is_file():
            assert not any(d == dtype for _, d in DTYPE_MEASURED)
            assert notice(ProjectionSpec(), dtype) and BENCHMARK in notice(ProjectionSpec(), dtype)
            continue
        doc = json.loads(file.read_text())
        spec = ProjectionSpec(**{k: v for k, v in doc["spec"].items() if k != "spec_id"})
        found = measured(spec, dtype)
        assert found == {"result": path, "cell": doc["cell"], "device": doc["device"], "model_dtype": dtype,
                         "met": doc["goal"]["met"]}
        assert doc["dtype"] == dtype and set(doc["precision_at_10_by_seed"]) == {"0", "1", "2"}
        assert doc["goal"]["met"] == (min(doc["precision_at_10_by_seed"].values()) >= 0.95
                                      and doc["compression"] >= 100)
        assert notice(spec, dtype) is None and notice(spec.model_copy(update={"seed": 5}), dtype) is None
