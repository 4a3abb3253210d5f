"""The offline pipeline end to end through the `cropi` command: collect (hf and vLLM),
gradients for a pool and two validation sets, rank; kill-and-resume; Ray shards; bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cropi.cli import main
from cropi.models.loading import load_causal_lm
from cropi.scoring import rank_pool
from cropi.store import GradientStore, TrajectoryStore
from support.cli import run_cli
from support.disk import fill_after
from support.store import snapshot

SPLITS = ("pool", "val_a", "val_b")
COLLECT = ["--backend", "hf", "--samples", "4", "--max-new-tokens", "40", "--temperature", "1.0",
           "--reward", "exact_numeric"]
PROJ = ["--projection-kind", "sjlt", "--projection-kind", "sjlt", "--projection-dim", "512", "--kept-fraction", "0.5", "--dtype", "float32"]


def cli_subprocess(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    return subprocess.Popen([sys.executable, "-m", "cropi.cli", *args], env=env, cwd=Path(__file__).parents[1],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.fixture(scope="module")
def collected(task_model, task_files, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pipeline")
    for split in SPLITS:
        run_cli("collect", "--model", task_model, "--prompts", task_files[split], "--out", str(root / "traj" / split),
                *COLLECT)
    return root


@pytest.fixture(scope="module")
def scored(collected, task_model) -> Path:
    for split in SPLITS:
        run_cli("gradients", "--model", task_model, "--trajectories", str(collected / "traj" / split),
                "--store", str(collected / "store"), "--split", split, "--name", "warm", *PROJ)
    return collected


def test_collect_rows_follow_the_contract(collected, task_model):
    table = TrajectoryStore.open(str(collected / "traj" / "pool")).read_table()
    assert table.num_rows == 20 * 4
    rewards = np.array(table["reward"].to_pylist(), dtype=float)
    assert set(np.unique(rewards)) <= {0.0, 1.0} and 0 < rewards.mean() < 1, "task model should be partly right"
    for row in table.slice(0, 8).to_pylist():
        assert len(row["behavior_logprobs"]) == len(row["response_token_ids"]) > 0
        assert row["finish_reason"] in ("stop", "length")


def test_rank_end_to_end_matches_library(scored, capsys):
    out = run_cli("rank", "--store", str(scored / "store"), "--name", "warm", "--pool", "pool",
                  "--validation", "val_a,val_b", "--top-fraction", "0.25", "--selector", "cropi")
    rows = out["rows"]
    assert len(rows) == 20
    ranked = [r for r in rows if r["rank"] > 0]
    assert [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))
    assert sum(out["meta"]["excluded"].values()) == 20 - len(ranked)
    assert all(r["status"] != "ok" for r in rows if r["rank"] == 0)
    assert sum(r["selected"] for r in rows) == min(5, len(ranked))
    # Independent recomputation from the stored vectors.
    gs = GradientStore(str(scored / "store"))
    spec_id = out["meta"]["spec_id"]
    pool = gs.open_split("warm", spec_id, "pool").read()
    val = {v: gs.open_split("warm", spec_id, v).read() for v in ("val_a", "val_b")}
    again = rank_pool(pool.prompt_ids, pool.vectors, list(pool.columns["status"]),
                      {k: (t.prompt_ids, t.vectors, list(t.columns["status"])) for k, t in val.items()})
    by_id = {r["prompt_id"]: r for r in rows}
    for i, pid in enumerate(again.prompt_ids):
        assert by_id[pid]["rank"] == again.rank[i]
        if again.rank[i]:
            assert by_id[pid]["score:val_a"] == pytest.approx(again.scores["val_a"][i])


def test_gradient_rows_carry_status_and_counts(scored):
    gs = GradientStore(str(scored / "store"))
    (entry,) = [s for s in gs.list_splits() if s["split"] == "pool"]
    t = gs.open_split("warm", entry["spec_id"], "pool").read()
    status = list(t.columns["status"])
    ok = np.array(status) == "ok"
    assert ok.any() and len(t) == 20
    assert not np.any(t.vectors[~ok]) and np.all(np.linalg.norm(t.vectors[ok], axis=1) > 0)
    assert np.all(np.asarray(t.columns["n_responses"]) == 4)


@pytest.mark.vllm
def test_vllm_collect_logprobs_match_teacher_forcing(task_model, task_files, tmp_path):
    """vLLM's raw log-probs are what transformers' teacher forcing of the same checkpoint gives,
    so POPI's ratio is 1 at the behavior policy. Tolerance 1e-4: both sides run float32
    (observed ~1e-6); exp(1e-4) - 1 = 1e-4 relative error on a ratio is negligible."""
    pytest.importorskip("vllm")
    out = tmp_path / "traj"
    proc = cli_subprocess("collect", "--model", task_model, "--prompts", task_files["val_a"], "--out", str(out),
                          "--backend", "vllm", "--samples", "4", "--max-new-tokens", "32", "--temperature", "1.0")
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    model = load_causal_lm(task_model)
    worst = 0.0
    for traj in TrajectoryStore.open(str(out)).iter_prompts():
        for resp, beh in zip(traj.responses, traj.behavior_logprobs):
            ids = torch.tensor([list(traj.prompt_token_ids) + list(resp)])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].double()
            n = len(traj.prompt_token_ids)
            tf = torch.log_softmax(logits[n - 1:-1], -1).gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
            worst = max(worst, float((tf - torch.tensor(beh, dtype=torch.float64)).abs().max()))
    assert worst < 1e-4, worst


def _wait_for_commit(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    start = time.time()
    while time.time() - start < timeout:
        commits = list(path.glob("commits/*.json"))
        if commits and any(json.loads(c.read_text()).get("shards") for c in commits):
            return
        if proc.poll() is not None:
            raise AssertionError(f"job ended before it could be killed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    raise AssertionError("no commit appeared")


def _kill_and_resume(args: list[str], data_dir: Path) -> None:
    proc = cli_subprocess(*args)
    _wait_for_commit(data_dir, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    rerun = cli_subprocess(*args)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-2000:]


def test_collect_killed_then_resumed_equals_uninterrupted(collected, task_model, task_files, tmp_path):
    out = tmp_path / "traj"
    _kill_and_resume(["collect", "--model", task_model, "--prompts", task_files["pool"], "--out", str(out),
                      "--batch-prompts", "2", *COLLECT], out)
    key = ["prompt_id", "sample_index"]
    got = TrajectoryStore.open(str(out)).read_table().sort_by([(k, "ascending") for k in key])
    want = TrajectoryStore.open(str(collected / "traj" / "pool")).read_table().sort_by([(k, "ascending") for k in key])
    assert got.num_rows == want.num_rows == 80
    for col in ("prompt_id", "sample_index", "prompt_token_ids", "response_token_ids", "reward", "finish_reason"):
        assert got[col].to_pylist() == want[col].to_pylist(), col
    # The killed run generated 2 prompts a batch, the reference 32: batched float32 kernels
    # round differently, so log-probs agree to float tolerance, not bit for bit.
    for a, b in zip(got["behavior_logprobs"].to_pylist(), want["behavior_logprobs"].to_pylist()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gradients_killed_then_resumed_equals_uninterrupted(scored, task_model, tmp_path):
    store = tmp_path / "store"
    args = ["gradients", "--model", task_model, "--trajectories", str(scored / "traj" / "pool"), "--store", str(store),
            "--split", "pool", "--name", "warm", "--rows-per-shard", "1", *PROJ]
    split_dir = None
    proc = cli_subprocess(*args)
    start = time.time()
    while split_dir is None and time.time() - start < 300:  # the split directory appears once the job starts
        found = list(store.glob("gradients/warm/*/pool"))
        split_dir = found[0] if found else None
        time.sleep(0.02)
    _wait_for_commit(split_dir, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before the kill landed"
    rerun = cli_subprocess(*args)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-2000:]
    _assert_same_vectors(GradientStore(str(store)), GradientStore(str(scored / "store")))


def test_gradients_on_a_full_device_stop_with_what_to_do_keep_their_shards_and_resume(scored, task_model, tmp_path,
                                                                                      monkeypatch, capsys):
    store = tmp_path / "store"
    args = ["gradients", "--model", task_model, "--trajectories", str(scored / "traj" / "pool"), "--store", str(store),
            "--split", "pool", "--name", "warm", "--rows-per-shard", "1", *PROJ]
    failed = fill_after(monkeypatch, 12)  # some shards commit, then the device is full
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # a line of its own, after the bar it stopped
    assert err.startswith("cropi gradients: error: no space left on the device to write ") and failed, err
    assert failed[0].split(".tmp-")[0] in err and "rerun the same command" in err
    (spec,) = [s["spec_id"] for s in GradientStore(str(store)).list_splits() if s["split"] == "pool"]
    kept = GradientStore(str(store)).open_split("warm", spec, "pool").read(verify=True)
    assert 0 < len(kept.prompt_ids) < 20  # what was committed before the device filled, whole
    monkeypatch.undo()  # room again: the same command resumes
    assert main(args) == 0
    _assert_same_vectors(GradientStore(str(store)), GradientStore(str(scored / "store")))


def test_gradients_already_stored_load_no_model_and_another_checkpoint_under_the_name_is_still_refused(
        scored, task_model, tmp_path, monkeypatch, capsys):
    import cropi.pipeline.compute_gradients as job_module

    store = tmp_path / "store"
    shutil.copytree(scored / "store", store)
    args = ["gradients", "--trajectories", str(scored / "traj" / "pool"), "--store", str(store), "--split", "pool",
            "--name", "warm", *PROJ]

    def no_load(*_, **__):
        raise AssertionError("a model was loaded for gradients already stored")

    monkeypatch.setattr(job_module, "load_causal_lm", no_load)
    monkeypatch.setattr(job_module, "load_tokenizer", no_load)
    out = run_cli(*args, "--model", task_model)
    assert out["computed"] == {} and out["skipped"] == out["total"] == 20
    other = tmp_path / "other"  # the same weights, another config: another checkpoint under the same name
    shutil.copytree(task_model, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"cropi_test_marker": 1}))
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*args, "--model", str(other)]) == 2
    err = capsys.readouterr().err  # refused with the store's own mismatch, not served the stored rows
    assert "different identity" in err and "identity.checkpoint.fingerprint" in err, err[-2000:]


def _assert_same_vectors(a: GradientStore, b: GradientStore) -> None:
    """Same prompts once each, same statuses, same vectors. Float tolerance, not bits: the runs
    compared use different thread counts, so float32 reductions are ordered differently."""
    (sa,) = [s for s in a.list_splits() if s["split"] == "pool"]
    (sb,) = [s for s in b.list_splits() if s["split"] == "pool" and s["spec_id"] == sa["spec_id"]]
    ta = a.open_split("warm", sa["spec_id"], "pool").read()
    tb = b.open_split("warm", sb["spec_id"], "pool").read()
    assert sorted(ta.prompt_ids) == sorted(tb.prompt_ids) and len(ta.prompt_ids) == len(set(ta.prompt_ids))
    order = [tb.index(p) for p in ta.prompt_ids]
    np.testing.assert_allclose(ta.vectors, tb.vectors[order], rtol=1e-4, atol=1e-6)
    assert list(ta.columns["status"]) == [tb.columns["status"][i] for i in order]


def test_two_ray_workers_equal_one_worker(scored, task_model, tmp_path):
    pytest.importorskip("ray")
    store = tmp_path / "store"
    run_cli("gradients", "--model", task_model, "--trajectories", str(scored / "traj" / "pool"), "--store", str(store),
            "--split", "pool", "--name", "warm", "--ray", "local", "--workers", "2", *PROJ)
    writers = {p.name for p in store.glob("gradients/warm/*/pool/commits/*.json")}
    assert writers == {"shard-0000-of-0002.json", "shard-0001-of-0002.json"}
    _assert_same_vectors(GradientStore(str(store)), GradientStore(str(scored / "store")))


# --- bad input: a clear message, and the store as it was -------------------------------------------


def cli_error(capsys, *args: str) -> str:
    code = main(list(args))
    assert code == 2
    return capsys.readouterr().err


def test_missing_and_non_model_checkpoint(capsys, scored, tmp_path):
    before = snapshot(scored / "store")
    err = cli_error(capsys, "gradients", "--model", str(tmp_path / "nope"), "--trajectories",
                    str(scored / "traj" / "pool"), "--store", str(scored / "store"), "--split", "pool")
    assert "nope" in err
    (tmp_path / "empty").mkdir()
    err = cli_error(capsys, "gradients", "--model", str(tmp_path / "empty"), "--trajectories",
                    str(scored / "traj" / "pool"), "--store", str(scored / "store"), "--split", "pool")
    assert "config.json" in err
    assert snapshot(scored / "store") == before


def test_tokenizer_mismatch_is_refused(capsys, scored, tmp_path):
    from cropi.models import build_tiny_model

    other = build_tiny_model(tmp_path / "other", corpus=[f"other words {i} zeta" for i in range(300)], vocab_size=300)
    before = snapshot(scored / "store")
    err = cli_error(capsys, "gradients", "--model", str(other), "--trajectories", str(scored / "traj" / "pool"),
                    "--store", str(scored / "store"), "--split", "pool", "--name", "other")
    assert "tokenizer" in err and "collect" in err
    assert snapshot(scored / "store") == before


def test_overlong_prompt_and_malformed_file(capsys, task_model, tmp_path):
    from cropi.data import PromptRecord, write_jsonl

    write_jsonl([PromptRecord(prompt_id="long", prompt="7 + " * 3000 + "1", answer="1")], tmp_path / "long.jsonl")
    out = tmp_path / "traj"
    err = cli_error(capsys, "collect", "--model", task_model, "--prompts", str(tmp_path / "long.jsonl"),
                    "--out", str(out), "--backend", "hf")
    assert "long" in err and "max-new-tokens" in err.replace("max_new_tokens", "max-new-tokens")
    assert not out.exists()
    (tmp_path / "bad.jsonl").write_text('{"prompt_id": "a", "prompt": "1+1", "answer": "2"}\n{not json\n')
    err = cli_error(capsys, "collect", "--model", task_model, "--prompts", str(tmp_path / "bad.jsonl"),
                    "--out", str(out), "--backend", "hf")
    assert "line 2" in err
    assert not out.exists()


def test_other_checkpoint_under_same_name_and_missing_spec(capsys, scored, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    changed = tmp_path / "changed"
    shutil.copytree(_model_dir(scored), changed)
    weights = load_file(changed / "model.safetensors")
    first = next(iter(weights))
    weights[first] = weights[first] + 1e-3
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    before = snapshot(scored / "store")
    err = cli_error(capsys, "gradients", "--model", str(changed), "--trajectories", str(scored / "traj" / "pool"),
                    "--store", str(scored / "store"), "--split", "pool", "--name", "warm", *PROJ)
    assert "fingerprint" in err
    assert snapshot(scored / "store") == before
    err = cli_error(capsys, "rank", "--store", str(scored / "store"), "--name", "warm", "--pool", "pool",
                    "--validation", "val_a", "--spec-id", "0000000000000000")
    assert "specs present" in err


def _model_dir(scored: Path) -> Path:
    identity = TrajectoryStore.open(str(scored / "traj" / "pool")).identity
    return Path(identity["model"]["path"])


# ---------------------------------------------------------------- the score step, job files, the command's surface


def test_score_refuses_trajectories_of_another_prompt_set(capsys, collected, task_model, task_files, tmp_path):
    """A store collected from the 20-prompt pool cannot stand in for the 8-prompt val_a set."""
    root = tmp_path / "root"
    err = cli_error(capsys, "score", "--model", task_model, "--root", str(root), "--pool", task_files["pool"],
                    "--validation", f"val_a={task_files['val_a']}",
                    "--trajectories", f"pool={collected / 'traj' / 'pool'}",
                    "--trajectories", f"val_a={collected / 'traj' / 'pool'}")
    assert "'val_a'" in err and "do not match" in err and "leave 'val_a' out" in err
    assert not (root / "store").exists()


def test_score_command_equals_gradients_then_rank(scored, collected, task_model, task_files, tmp_path):
    """`cropi score` over the same trajectories stores bitwise the vectors and the ranking the
    separate `cropi gradients` + `cropi rank` made, and returns the ranking's selection."""
    root = tmp_path / "root"
    given = [a for s in SPLITS for a in ("--trajectories", f"{s}={collected / 'traj' / s}")]
    out = run_cli("score", "--model", task_model, "--root", str(root), "--name", "warm", "--pool", task_files["pool"],
                  "--validation", f"val_a={task_files['val_a']}", "--validation", f"val_b={task_files['val_b']}",
                  *given, "--select-fraction", "0.25", "--projection-kind", "sjlt", "--projection-dim", "512",
                  "--kept-fraction", "0.5", "--gradient-dtype", "float32")
    _assert_same_vectors(GradientStore(str(scored / "store")), GradientStore(str(root / "store")))
    ranked = run_cli("rank", "--store", str(scored / "store"), "--name", "warm", "--pool", "pool",
                     "--validation", "val_a,val_b", "--top-fraction", "0.25")
    assert out["selected"] == [r["prompt_id"] for r in ranked["rows"] if r["selected"]]
    import pyarrow.parquet as pq

    table = pq.read_table(out["ranking"])
    assert table.select(["prompt_id", "rank", "selected"]).to_pylist() == [
        {k: r[k] for k in ("prompt_id", "rank", "selected")} for r in ranked["rows"]]


def test_job_file_runs_the_same_step_and_bad_files_are_refused(capsys, scored, tmp_path):
    job = tmp_path / "rank.json"
    job.write_text(json.dumps({"kind": "rank", "request": {"store": str(scored / "store"), "name": "warm",
                                                           "validation": ["val_a", "val_b"], "top_fraction": 0.25}}))
    via_job = run_cli("job", str(job))
    direct = run_cli("rank", "--store", str(scored / "store"), "--name", "warm", "--validation", "val_a,val_b",
                     "--top-fraction", "0.25")
    assert via_job["rows"] == direct["rows"]
    job.write_text(json.dumps({"kind": "rank", "request": {"store": "s", "name": "warm", "validation": ["a"],
                                                           "shell": "rm -rf /"}}))
    assert "shell" in cli_error(capsys, "job", str(job))
    job.write_text(json.dumps({"kind": "collect", "job": {"model": "m", "prompts": "p", "out": "o",
                                                          "engine": {"trust_remote_code": True}}}))
    assert "trust_remote_code" in cli_error(capsys, "job", str(job))
    proc = subprocess.run([sys.executable, "jobs/run.py", str(tmp_path / "missing.json")], capture_output=True,
                          text=True, cwd=Path(__file__).parents[1], env=dict(os.environ, TQDM_DISABLE="1"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_engine_options_are_closed(task_model):
    from cropi.generation import GenerationError, make_backend

    for bad in ({"trust_remote_code": True}, {"attn_implementation": "eager"}, {"model": "/elsewhere"},
                {"tensor_parallel_size": 2}):  # the last: a vLLM option handed to hf
        with pytest.raises(GenerationError, match="engine options"):
            make_backend("hf", task_model, **bad)


def test_help_shows_every_default_and_version(capsys):
    from cropi.cli import COMMANDS, build_parser
    from cropi.generation import CollectOptions, SamplingConfig

    parser = build_parser()
    for name in ("collect", "gradients", "rank", "score"):
        sub = parser._subparsers._group_actions[0].choices[name]
        for action in sub._actions:
            if action.option_strings and action.dest not in ("help", "json") and not action.required:
                assert action.help and "(default: " in action.help, (name, action.option_strings)
    text = parser._subparsers._group_actions[0].choices["score"].format_help()
    assert f"(default: {CollectOptions().validation_samples})" in text.replace("\n", " ").replace("  ", " ")
    assert f"(default: {SamplingConfig().temperature})" in text.replace("\n", " ")
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.startswith("cropi ")
    assert "serve" in parser.format_help() and set(COMMANDS) >= {"collect", "gradients", "rank", "score", "job"}


def test_out_of_range_options_are_refused(capsys, tmp_path):
    err = cli_error(capsys, "collect", "--model", "m", "--prompts", "p", "--out", str(tmp_path / "o"),
                    "--samples", "5000")
    assert "--samples" in err and "4096" in err
    err = cli_error(capsys, "collect", "--model", "m", "--prompts", "p", "--out", str(tmp_path / "o"),
                    "--max-new-tokens", "100000")
    assert "--max-new-tokens" in err


def test_serve_without_the_service_says_what_to_install(capsys, monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    assert main(["serve", "--root", "x"]) == 2
    assert "install cropi[serve]" in capsys.readouterr().err
