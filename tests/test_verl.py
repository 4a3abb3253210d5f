"""cropi against the real verl: its dataset reads our subsets, its config takes our overrides,
its merger converts the checkpoint layout we read, its reward loader calls our function.

Runs in the verl environment: ``.venv-verl/bin/python -m pytest tests/test_verl.py``.
Elsewhere (no verl importable) the whole module is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402
import yaml  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from cropi.data import as_messages, write_verl_parquet  # noqa: E402
from cropi.models import build_tiny_model, load_tokenizer  # noqa: E402
from cropi.tasks.arithmetic import make_task_splits  # noqa: E402
from cropi.trainers.verl import VerlOptions, merge_command, verl_command, verl_overrides  # noqa: E402

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("verl") / "tiny", seed=0).resolve()


@pytest.fixture(scope="module")
def records():
    return make_task_splits(1, pool_size=40, val_size=8, test_size=8)["pool"][:16]


@pytest.fixture(scope="module")
def subset(tmp_path_factory, records) -> Path:
    path = tmp_path_factory.mktemp("subset") / "stage_0.parquet"
    write_verl_parquet(records, str(path))
    return path


def _dataset_config(tmp_path, max_prompt_length: int):
    return OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": max_prompt_length,
                             "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1,
                             "truncation": "error", "return_raw_chat": True, "cache_dir": str(tmp_path / "cache")})


def test_rlhf_dataset_reads_every_row_of_our_subset(tiny, records, subset, tmp_path):
    from tokenizers import Tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    tok = load_tokenizer(tiny)
    ds = RLHFDataset(data_files=str(subset), tokenizer=tok, config=_dataset_config(tmp_path, 512))
    # verl tokenized every prompt to filter overlong ones: none was dropped.
    assert len(ds) == len(records)
    raw = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    for i, r in enumerate(records):
        item = ds[i]
        assert item["raw_prompt"] == as_messages(r.prompt)
        assert item["reward_model"]["ground_truth"] == r.answer
        assert item["data_source"] == r.data_source
        assert item["extra_info"]["prompt_id"] == r.prompt_id and item["index"] == i
        # What verl's agent loop feeds the rollout: the chat template applied, then tokenized.
        text = tok.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids and ids == raw.encode(text, add_special_tokens=False).ids
    batch = collate_fn([ds[i] for i in range(4)])
    assert list(batch["reward_model"][j]["ground_truth"] for j in range(4)) == [r.answer for r in records[:4]]


def test_rlhf_dataset_filters_with_our_tokenizer(tiny, records, subset, tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tok = load_tokenizer(tiny)
    lengths = sorted(len(tok.apply_chat_template(as_messages(r.prompt), add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"]) for r in records)
    limit = lengths[len(lengths) // 2]
    ds = RLHFDataset(data_files=str(subset), tokenizer=tok, config=_dataset_config(tmp_path, limit))
    assert len(ds) == sum(n <= limit for n in lengths)


def _compose(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", *argv[3:]],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return yaml.safe_load(proc.stdout)


def _lookup(config: dict, key: str):
    node = config
    for part in key.lstrip("+").split("."):
        assert isinstance(node, dict) and part in node, f"{key}: {part!r} is not in verl's composed config"
        node = node[part]
    return node


def test_main_ppo_composes_with_our_exact_overrides(tiny, subset, tmp_path):
    opts = VerlOptions(batch_prompts=4, rollouts=2, n_gpus_per_node=1, max_new_tokens=64,
                       max_prompt_tokens=256, python=sys.executable)
    kwargs = dict(model=str(tiny), subset=str(subset), val_files=str(subset), out_dir=str(tmp_path / "stage_1"),
                  stage=1, steps=3, start_step=5, seed=11, reward="exact_numeric")
    config = _compose(verl_command(opts, **kwargs))
    overrides = verl_overrides(opts, **kwargs)
    for key, value in overrides.items():
        assert _lookup(config, key) == value, key
    # Spot checks of what CROPI's run depends on, read back from verl's own config.
    assert config["algorithm"]["adv_estimator"] == "grpo"
    assert config["trainer"]["total_training_steps"] == 8
    assert config["actor_rollout_ref"]["actor"]["optim"]["lr"] == pytest.approx(1e-6)
    assert config["actor_rollout_ref"]["actor"]["use_kl_loss"] is True
    assert config["reward"]["custom_reward_function"]["reward_kwargs"] == {"reward_name": "exact_numeric"}


def test_a_misspelt_override_is_refused_by_verl(tiny, subset, tmp_path):
    opts = VerlOptions(batch_prompts=4, n_gpus_per_node=1, extra_overrides=["trainer.totl_epochs=3"])
    argv = verl_command(opts, model=str(tiny), subset=str(subset), val_files=None, out_dir=str(tmp_path / "s"),
                        stage=0, steps=1)
    # Composed in-process the way main_ppo's @hydra.main does (same config module and name).
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException

    with initialize_config_module("verl.trainer.config", version_base=None):
        compose("ppo_trainer", overrides=argv[3:-1])  # everything but the typo composes
        with pytest.raises(ConfigCompositionException, match="totl_epochs"):
            compose("ppo_trainer", overrides=argv[3:])


def test_verl_reward_loader_calls_our_function(tiny, subset, tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    opts = VerlOptions(batch_prompts=4, n_gpus_per_node=1)
    overrides = verl_overrides(opts, model=str(tiny), subset=str(subset), val_files=None,
                               out_dir=str(tmp_path / "s"), stage=0, steps=1, reward="exact_numeric")
    section = {k.lstrip("+").split("reward.custom_reward_function.", 1)[1]: v
               for k, v in overrides.items() if "custom_reward_function" in k}
    fn_config = {"path": section["path"], "name": section["name"],
                 "reward_kwargs": {"reward_name": section["reward_kwargs.reward_name"]}}
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": fn_config}}))
    assert fn(data_source="arithmetic", solution_str="so 12 + 30 = 42", ground_truth="42", extra_info={}) == 1.0
    assert fn(data_source="arithmetic", solution_str="so 12 + 30 = 41", ground_truth="42", extra_info={}) == 0.0


def test_model_merger_turns_an_fsdp_actor_checkpoint_into_our_hf_folder(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    # verl's FSDP layout for one rank: model_world_size_1_rank_0.pt, fsdp_config.json, huggingface/.
    actor = tmp_path / "global_step_4" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    state = model.state_dict()
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    for f in tiny.iterdir():
        if f.suffix != ".safetensors":
            (actor / "huggingface" / f.name).write_bytes(f.read_bytes())

    target = tmp_path / "checkpoint"
    proc = subprocess.run(merge_command(sys.executable, actor, target), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).state_dict()
    for key, value in state.items():
        # The merger stores bfloat16.
        assert torch.equal(merged[key], value.to(torch.bfloat16).to(torch.float32)), key
    tok = load_tokenizer(target)
    assert tok("What is 12 + 30?")["input_ids"] == load_tokenizer(tiny)("What is 12 + 30?")["input_ids"]


# ------------------------------------------------- a verl curriculum, killed and retried at every point

@pytest.fixture()
def standin(tmp_path) -> Path:
    from support.verl_standin import standin as write_launcher

    return write_launcher(tmp_path)


def test_a_verl_curriculum_survives_a_kill_at_every_point_of_a_stage(standin, tiny, records, tmp_path,
                                                                     monkeypatch):
    from safetensors.torch import load_file

    from cropi.data import write_verl_parquet
    from cropi.pipeline.curriculum import CurriculumConfig, run_curriculum
    from cropi.trainers.base import TrainingFailedError
    from cropi.trainers.lineage import read_marker
    from support.verl_standin import STEP_DELTA

    pool = tmp_path / "pool.parquet"
    write_verl_parquet(records, str(pool))
    log = tmp_path / "launches.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    config = CurriculumConfig(name="verl-3", model=str(tiny), pool=str(pool), stages=3, method="random",
                              select_fraction=0.5, steps_per_stage=3, reward="exact_numeric", trainer="verl",
                              trainer_options={"batch_prompts": 4, "rollouts": 2, "n_gpus_per_node": 1,
                                               "save_freq": 2, "python": str(standin)})
    root = tmp_path / "root"
    # Stage m trains global steps 3m+1 .. 3m+3 and saves at the even ones and at its end.
    kills = ["before_save@3",   # after the mid-stage save at 2
             "during_save@3",   # weights half written, tracker still at 2
             "after_save@3",    # saved, tracker at 3, killed before exiting
             "merge@3",         # the merger torn mid-write
             "before_save@4",   # stage 1, before its first save
             "during_save@6",   # stage 1, after the mid-stage save at 4
             "merge@9"]         # stage 2, after all of verl's work
    for kill in kills:
        monkeypatch.setenv("FAKE_VERL_KILL", kill)
        with pytest.raises(TrainingFailedError, match="status -9"):
            run_curriculum(config, root=root)
    monkeypatch.delenv("FAKE_VERL_KILL")
    result = run_curriculum(config, root=root)

    assert result["finished"] and [s["global_step"] for s in result["stages"]] == [3, 6, 9]
    assert [s["steps_done"] for s in result["stages"]] == [3, 3, 3]
    curricula = root / "curricula" / "verl-3"
    launches = [(c["start"], c["end"]) for c in map(json.loads, log.read_text().splitlines())]
    # Every retry resumed from the newest checkpoint verl had recorded; a finished verl run was only merged.
    assert launches == [(0, 3), (2, 3), (2, 3),            # stage 0: killed 3 times, then merged twice
                        (3, 6), (3, 6), (4, 6),            # stage 1
                        (6, 9)]                            # stage 2: trained once, merged twice
    # Each stage trained in its own run folder, branched from the previous stage's (hard links), and the
    # curriculum released the state behind every checkpoint it will not train on from again: the last stays.
    run_dirs = [read_marker(s["checkpoint"]).run_state for s in result["stages"]]
    assert run_dirs == [str((curricula / f"stage-{m}" / "verl_run").resolve()) for m in range(3)]
    assert not Path(run_dirs[0]).exists() and not Path(run_dirs[1]).exists()
    run_dir = Path(run_dirs[2])
    assert sorted(p.name for p in run_dir.glob("global_step_*")) == ["global_step_9"]  # max_actor_ckpt_to_keep=1
    assert all((Path(s["checkpoint"]) / "model.safetensors").is_file() for s in result["stages"])  # weights stay
    # The weights saw exactly 9 steps: no step lost or replayed across the kills.
    initial = load_file(str(tiny / "model.safetensors"))
    final = load_file(str(Path(result["final_checkpoint"]) / "model.safetensors"))
    for key, value in initial.items():
        torch.testing.assert_close(final[key], value + 9 * STEP_DELTA, rtol=0, atol=1e-5)
    # Each stage read its own subset, and no stage inherited the previous stage's sampler position.
    calls = list(map(json.loads, log.read_text().splitlines()))
    assert {c["train_files"] for c in calls} == {str((curricula / f"stage-{m}" / "subset.parquet").resolve())
                                                 for m in range(3)}
    assert not any(c["data_pt"] for c in calls if c["start"] in (3, 6))
    assert not list(root.rglob("checkpoint.partial")) and not list(root.rglob("verl_run.partial"))


def test_preflight_runs_verl_composition(tiny, subset, tmp_path):
    from cropi.errors import InvalidInputError
    from cropi.trainers.verl import preflight

    opts = VerlOptions(batch_prompts=4, rollouts=2, n_gpus_per_node=1, python=sys.executable,
                       run_dir=str(tmp_path / "~run"))  # a "~" in a path must survive Hydra
    argv = verl_command(opts, model=str(tiny), subset=str(subset), val_files=None, out_dir=str(tmp_path / "s"),
                        stage=0, steps=1)
    preflight(argv, dict(__import__("os").environ), tmp_path)
    bad = verl_command(opts.model_copy(update={"extra_overrides": ["trainer.totl_epochs=3"]}), model=str(tiny),
                       subset=str(subset), val_files=None, out_dir=str(tmp_path / "s"), stage=0, steps=1)
    with pytest.raises(InvalidInputError, match="totl_epochs"):
        preflight(bad, dict(__import__("os").environ), tmp_path)
