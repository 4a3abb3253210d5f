"""Trainer adapters: trl trains a tiny model across stages; the verl launcher's argv and orchestration."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from cropi.data import as_messages, write_verl_parquet
from cropi.errors import ConflictError, InvalidInputError, MismatchError, NotFoundError
from cropi.models import build_tiny_model, load_causal_lm, load_tokenizer
from cropi.rewards import UnknownRewardError, get_reward, register_reward
from cropi.tasks.arithmetic import make_task_splits
from cropi.trainers import (StageResult, TrainerOptionsError, TrainingFailedError, UnknownTrainerError,
                            make_trainer, read_marker)
from cropi.trainers.lineage import MARKER
from cropi.trainers.trl import TrlOptions, completion_text, make_reward_func
from cropi.trainers.verl import (REWARD_FUNCTION, VERL_DEFAULT_REWARD, VerlOptions, hydra_value, merge_command,
                                 verl_command)

# A dense reward (digits in the response) so a random tiny model sees reward
# differences within a group and GRPO has a non-zero gradient; the task's real
# rewards are almost always 0 for an untrained model.
DIGITS_REWARD = "test_trainers_digits"


@register_reward(DIGITS_REWARD, replace=True)
def _digit_share(text: str, answer: str) -> float:
    return sum(c.isdigit() for c in text) / max(len(text), 1)


FAST = dict(batch_prompts=4, rollouts=4, max_new_tokens=16, lr=1e-3)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trainers") / "base", seed=0).resolve()


@pytest.fixture(scope="module")
def records():
    return make_task_splits(0, pool_size=40, val_size=8, test_size=8)["pool"][:12]


@pytest.fixture(scope="module")
def subset(tmp_path_factory, records) -> str:
    path = tmp_path_factory.mktemp("subset") / "stage.parquet"
    write_verl_parquet(records, str(path))
    return str(path)


def _weights(folder) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_causal_lm(folder).state_dict().items()}


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- trl


@pytest.fixture(scope="module")
def stage0(base_model, subset, tmp_path_factory) -> StageResult:
    out = tmp_path_factory.mktemp("run") / "stage_0"
    return make_trainer("trl", **FAST).train_stage(model=str(base_model), subset=subset, out_dir=str(out),
                                                   steps=3, seed=0, stage=0, reward=DIGITS_REWARD)


def test_trl_stage_writes_a_loadable_checkpoint_with_changed_weights(stage0, base_model):
    assert stage0.steps_done == 3 and stage0.global_step == 3 and stage0.stage == 0
    before, after = _weights(base_model), _weights(stage0.checkpoint)
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged tensors: {set(before) - set(changed)}"
    tok, base_tok = load_tokenizer(stage0.checkpoint), load_tokenizer(base_model)
    text = "Kalo has 17 apples and gets 25 more."
    assert tok(text)["input_ids"] == base_tok(text)["input_ids"]
    assert tok.chat_template == base_tok.chat_template
    # Only weights, config and tokenizer: no optimizer or training args to change the fingerprint.
    assert not [f for f in Path(stage0.checkpoint).iterdir() if f.suffix in (".pt", ".bin", ".pth")]


def test_trl_stage_logs_every_step(stage0):
    rows = _jsonl(stage0.metrics_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(0.0 <= r["reward_mean"] <= 1.0 and "loss" in r for r in rows)
    rewards = [r["reward_mean"] for r in rows]
    assert stage0.metrics["reward_mean"] == pytest.approx(sum(rewards) / 3)
    assert stage0.metrics["reward_last"] == pytest.approx(rewards[-1])
    assert stage0.metrics["loss_last"] == pytest.approx(rows[-1]["loss"])
    # At the first step the policy is the reference (the initial model): KL exactly 0.
    assert rows[0]["kl"] == 0.0 and rows[-1]["kl"] > 0.0
    assert "step 3" in Path(stage0.log_path).read_text()


def test_trl_marker_records_the_run(stage0, base_model):
    marker = read_marker(stage0.checkpoint)
    assert marker.trainer == "trl" and marker.stage == 0 and marker.global_step == 3
    assert marker.reference_model == str(base_model)


def test_trl_next_stage_continues_the_run(stage0, base_model, subset, tmp_path):
    result = make_trainer("trl", **FAST).train_stage(model=stage0.checkpoint, subset=subset,
                                                     out_dir=str(tmp_path / "stage_1"), steps=2, seed=1,
                                                     stage=1, reward=DIGITS_REWARD)
    assert result.steps_done == 2 and result.global_step == 5
    assert [r["step"] for r in _jsonl(result.metrics_path)] == [4, 5]
    marker = read_marker(result.checkpoint)
    assert marker.global_step == 5 and marker.reference_model == str(base_model)
    # The KL reference is still the initial model, not stage 0's checkpoint: KL > 0 from the first step.
    assert _jsonl(result.metrics_path)[0]["kl"] > 0.0
    # AdamW's state was carried: its step count covers both stages.
    state = torch.load(Path(marker.run_state) / "optimizer.pt", weights_only=True)
    assert {float(s["step"]) for s in state["state"].values()} == {5.0}
    assert all(g["lr"] == FAST["lr"] for g in state["param_groups"])


def test_trl_trains_on_from_an_earlier_checkpoint_of_its_run(stage0, base_model, subset, tmp_path):
    """What a checked stage's restore is (cropi.pipeline.curriculum.parts): after a part went on from stage 0's
    checkpoint, another part trains on from that same earlier checkpoint, its step count and AdamW state
    taken from it, not from the part that went on."""
    trainer = make_trainer("trl", **FAST)
    assert trainer.runs_in_parts
    parts = [trainer.train_stage(model=stage0.checkpoint, subset=subset, out_dir=str(tmp_path / name), steps=1,
                                 seed=seed, stage=1, reward=DIGITS_REWARD) for name, seed in (("a", 1), ("b", 2))]
    for part in parts:
        assert part.global_step == 4 and read_marker(part.checkpoint).global_step == 4
        state = torch.load(Path(read_marker(part.checkpoint).run_state) / "optimizer.pt", weights_only=True)
        assert {float(s["step"]) for s in state["state"].values()} == {4.0}
        assert read_marker(part.checkpoint).reference_model == str(base_model)


def test_trl_fresh_optimizer_when_not_carried(stage0, subset, tmp_path):
    result = make_trainer("trl", **FAST, carry_optimizer=False).train_stage(
        model=stage0.checkpoint, subset=subset, out_dir=str(tmp_path / "s1"), steps=1, seed=0, stage=1,
        reward=DIGITS_REWARD)
    assert result.global_step == 4
    state = torch.load(Path(read_marker(result.checkpoint).run_state) / "optimizer.pt", weights_only=True)
    assert {float(s["step"]) for s in state["state"].values()} == {1.0}


def test_trl_is_deterministic_given_seed(base_model, subset, tmp_path):
    trainer = make_trainer("trl", **FAST)
    runs = [trainer.train_stage(model=str(base_model), subset=subset, out_dir=str(tmp_path / f"r{i}"), steps=2,
                                seed=7, stage=0, reward=DIGITS_REWARD) for i in range(2)]
    a, b = _weights(runs[0].checkpoint), _weights(runs[1].checkpoint)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["reward_mean"] for r in _jsonl(runs[0].metrics_path)] == \
           [r["reward_mean"] for r in _jsonl(runs[1].metrics_path)]


def test_trl_reward_wrapper_matches_the_named_reward():
    fn = get_reward("exact_numeric")
    wrapped = make_reward_func(fn, "exact_numeric")
    completions = [[{"role": "assistant", "content": "so the answer is 42"}],
                   [{"role": "assistant", "content": "it is 41"}], "plain 42"]
    answers = ["42", "42", "42"]
    got = wrapped(completions=completions, answer=answers, prompt_id=["a", "b", "c"])
    assert got == [float(fn(completion_text(c), a)) for c, a in zip(completions, answers)]
    assert got[0] != got[1]
    assert wrapped.__name__ == "exact_numeric"


def test_trl_rejects_a_subset_smaller_than_a_step(base_model, records, tmp_path):
    small = tmp_path / "small.parquet"
    write_verl_parquet(records[:3], str(small))
    with pytest.raises(InvalidInputError, match="3 prompts but a step takes batch_prompts=4"):
        make_trainer("trl", **FAST).train_stage(model=str(base_model), subset=str(small),
                                                out_dir=str(tmp_path / "o"), steps=1, seed=0, stage=0,
                                                reward=DIGITS_REWARD)


def test_trl_rejects_prompts_that_do_not_fit(base_model, subset, records, tmp_path):
    tok = load_tokenizer(base_model)
    lengths = [len(tok.apply_chat_template(as_messages(r.prompt), add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]) for r in records]
    limit = sorted(lengths)[len(lengths) // 2]
    too_long = sum(n > limit for n in lengths)
    assert too_long > 0
    with pytest.raises(InvalidInputError, match=f"{too_long} prompts of .* do not fit max_prompt_tokens={limit}"):
        make_trainer("trl", **FAST, max_prompt_tokens=limit).train_stage(
            model=str(base_model), subset=subset, out_dir=str(tmp_path / "o"), steps=1, seed=0, stage=0,
            reward=DIGITS_REWARD)


def test_trl_rejects_unknown_reward_and_bad_stage_args(base_model, subset, tmp_path):
    trainer = make_trainer("trl", **FAST)
    args = dict(model=str(base_model), subset=subset, out_dir=str(tmp_path / "o"), seed=0, stage=0)
    with pytest.raises(UnknownRewardError):
        trainer.train_stage(**args, steps=1, reward="no_such_reward")
    with pytest.raises(InvalidInputError, match="steps must be an integer >= 1"):
        trainer.train_stage(**args, steps=0, reward=DIGITS_REWARD)


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("name, options, message", [
    ("trl", {"micro_batch": 5}, "micro_batch 5 must divide batch_prompts \\* rollouts = 32"),
    ("trl", {"rollouts": 1}, "rollouts"),
    ("trl", {"lr": 0}, "lr"),
    ("trl", {"learning_rate": 1e-5}, "learning_rate"),
    ("trl", {"loss_type": "ppo"}, "loss_type"),
    ("verl", {"batch_prompts": 6, "rollouts": 3, "n_gpus_per_node": 4}, "must divide evenly over the 4 GPUs"),
    ("verl", {"mini_batch_prompts": 48}, "mini_batch_prompts 48 must divide batch_prompts 128"),
    ("verl", {"tensor_parallel": 3}, "tensor_parallel 3 must divide n_gpus_per_node 8"),
    ("verl", {"extra_overrides": ["trainer.foo"]}, "key=value"),
    ("verl", {"experiment_name": "two words"}, "experiment_name"),
    ("verl", {"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
])
def test_bad_options_raise_a_clear_error(name, options, message):
    with pytest.raises(TrainerOptionsError, match=message):
        make_trainer(name, **options)


def test_unknown_trainer_and_wrong_options_type():
    with pytest.raises(UnknownTrainerError, match="available: lean, trl, verl"):
        make_trainer("deepspeed-chat")
    from cropi.trainers.trl import TrlTrainer

    with pytest.raises(TrainerOptionsError, match="takes TrlOptions"):
        TrlTrainer(VerlOptions())
    assert TrlTrainer(TrlOptions(lr=2e-5)).options.lr == 2e-5


# ---------------------------------------------------------------- verl command


def _parse(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv[3:])


def test_verl_command_has_cropi_settings_key_by_key(tmp_path):
    opts = VerlOptions(n_gpus_per_node=8, python="/envs/verl/bin/python")
    out = tmp_path / "run" / "stage_2"
    argv = verl_command(opts, model="/models/qwen2.5-1.5b-instruct", subset="/data/stage_2.parquet",
                        val_files="/data/val.parquet", out_dir=str(out), stage=2, steps=10, start_step=20,
                        seed=3, reward="math_verify")
    assert argv[:3] == ["/envs/verl/bin/python", "-m", "verl.trainer.main_ppo"]
    expected = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": "false",
        "data.train_files": "/data/stage_2.parquet",
        "data.val_files": "/data/val.parquet",
        "data.train_batch_size": "128",
        "data.filter_overlong_prompts": "true",
        "data.max_prompt_length": "2048",
        "data.max_response_length": "2048",
        "data.seed": "3",
        "actor_rollout_ref.model.path": "/models/qwen2.5-1.5b-instruct",
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.model.use_remove_padding": "false",
        "actor_rollout_ref.actor.optim.lr": "1e-06",
        "actor_rollout_ref.actor.optim.weight_decay": "0.01",
        "actor_rollout_ref.actor.optim.clip_grad": "1.0",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "128",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.actor.use_kl_loss": "true",
        "actor_rollout_ref.actor.kl_loss_coef": "0.001",
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff": "0.001",
        "actor_rollout_ref.actor.data_loader_seed": "3",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": "8",
        "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.6",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.rollout.seed": "3",
        "trainer.n_gpus_per_node": "8",
        "trainer.nnodes": "1",
        "trainer.total_training_steps": "30",  # 20 steps before this stage + 10 in it
        "trainer.total_epochs": "30",
        "trainer.save_freq": "30",
        "trainer.test_freq": "-1",
        "trainer.val_before_train": "false",
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str((tmp_path / "run" / "verl_run").resolve()),
        "trainer.max_actor_ckpt_to_keep": "1",
        "trainer.project_name": "cropi",
        "trainer.experiment_name": "cropi-curriculum",
        "trainer.logger": "[console,file]",
        "reward.custom_reward_function.path": REWARD_FUNCTION,
        "reward.custom_reward_function.name": "compute_score",
        "+reward.custom_reward_function.reward_kwargs.reward_name": "math_verify",
    }
    got = _parse(argv)
    assert len(got) == len(argv) - 3, "a key was passed twice"
    for key, value in expected.items():
        assert got.get(key) == value, key
    assert set(got) == set(expected)


def test_verl_command_variants(tmp_path):
    opts = VerlOptions(batch_prompts=16, rollouts=4, n_gpus_per_node=2, kl_coef=0.0, save_freq=5,
                       run_dir=str(tmp_path / "shared"), mini_batch_prompts=8,
                       extra_overrides=["actor_rollout_ref.model.use_remove_padding=false"])
    got = _parse(verl_command(opts, model="/m", subset="/s.parquet", val_files=None, out_dir="/x/stage_0",
                              stage=0, steps=4, reward=VERL_DEFAULT_REWARD))
    assert got["data.val_files"] == "/s.parquet"  # no validation asked: the subset stands in, never scored
    assert got["actor_rollout_ref.actor.use_kl_loss"] == "false"
    assert got["trainer.total_training_steps"] == "4" and got["trainer.save_freq"] == "5"
    assert got["trainer.default_local_dir"] == str((tmp_path / "shared").resolve())
    assert got["actor_rollout_ref.actor.ppo_mini_batch_size"] == "8"
    assert got["actor_rollout_ref.model.use_remove_padding"] == "false"
    assert not [k for k in got if "reward_function" in k]  # verl's own scorer


def test_verl_command_rejects_bad_steps():
    with pytest.raises(InvalidInputError, match="start_step"):
        verl_command(VerlOptions(), model="/m", subset="/s", val_files=None, out_dir="/o", stage=0, steps=1,
                     start_step=-1)


@pytest.mark.parametrize("value, text", [
    (True, "true"), (None, "null"), (3, "3"), (1e-6, "1e-06"), (["console", "file"], "[console,file]"),
    ("/plain/path-1.parquet", "/plain/path-1.parquet"), ("has space", "'has space'"), ("a,b", "'a,b'"),
    ("it's", "'it\\'s'"), ("true", "'true'"),
    ("~/runs/a", "'~/runs/a'"), ("/data/~me/x", "'/data/~me/x'"), ("0123", "'0123'"),
])
def test_hydra_value(value, text):
    assert hydra_value(value) == text


def test_merge_command_is_verls_cli():
    assert merge_command("py", "/r/global_step_5/actor", "/o/checkpoint") == [
        "py", "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", "/r/global_step_5/actor",
        "--target_dir", "/o/checkpoint"]


# ---------------------------------------------------------------- verl orchestration, with a stand-in verl

@pytest.fixture()
def fake_python(tmp_path) -> str:
    """verl's two entry points as far as the launcher can see (tests/support/verl_standin.py)."""
    from support.verl_standin import standin

    return str(standin(tmp_path))


def _verl(fake_python, tmp_path, **extra):
    return make_trainer("verl", batch_prompts=4, rollouts=2, n_gpus_per_node=1, python=fake_python,
                        run_dir=str(tmp_path / "verl_run"), **extra)


def test_verl_stages_continue_one_run(fake_python, base_model, subset, tmp_path):
    trainer = _verl(fake_python, tmp_path)
    r0 = trainer.train_stage(model=str(base_model), subset=subset, out_dir=str(tmp_path / "s0"), steps=3, seed=0,
                             stage=0, reward="exact_numeric")
    r1 = trainer.train_stage(model=r0.checkpoint, subset=subset, out_dir=str(tmp_path / "s1"), steps=2, seed=0,
                             stage=1, reward="exact_numeric")
    assert (r0.global_step, r0.steps_done, r1.global_step, r1.steps_done) == (3, 3, 5, 2)
    calls = _jsonl(tmp_path / "verl_run" / "calls.jsonl")
    assert [c["trainer.total_training_steps"] for c in calls] == ["3", "5"]
    # The model path stays the initial model (verl's reference); stage 1's weights come from the resume.
    assert {c["actor_rollout_ref.model.path"] for c in calls} == {str(base_model)}
    # Stage 0's sampler position was dropped before stage 1 read a new subset.
    assert [c["_data_pt_at_start"] for c in calls] == [False, False]
    assert not (tmp_path / "verl_run" / "global_step_3" / "data.pt").exists()
    assert read_marker(r1.checkpoint).global_step == 5 and read_marker(r1.checkpoint).reference_model == str(base_model)
    assert load_causal_lm(r1.checkpoint) is not None
    assert r1.metrics["reward_mean"] == pytest.approx((0.4 + 0.5) / 2)
    assert r1.metrics["reward_last"] == pytest.approx(0.5) and r1.metrics["loss_last"] == -5
    assert "verl.model_merger" in Path(r1.log_path).read_text()


def test_verl_refuses_to_mix_runs(fake_python, base_model, subset, tmp_path):
    trainer = _verl(fake_python, tmp_path)
    r0 = trainer.train_stage(model=str(base_model), subset=subset, out_dir=str(tmp_path / "s0"), steps=2, seed=0,
                             stage=0, reward="exact_numeric")
    again = dict(subset=subset, out_dir=str(tmp_path / "s1"), steps=1, seed=0, stage=1, reward="exact_numeric")
    with pytest.raises(ConflictError, match="already holds a verl run at global step 2"):
        trainer.train_stage(model=str(base_model), **again)
    r1 = trainer.train_stage(model=r0.checkpoint, **again)
    trainer.train_stage(model=r1.checkpoint, **(again | {"out_dir": str(tmp_path / "s2"), "stage": 2}))
    # Stage 1 again, after stage 2 moved the run on: not a retry of the run's newest attempt.
    with pytest.raises(MismatchError, match="from global step 2 but .* is at step 4"):
        trainer.train_stage(model=r0.checkpoint, **again)


def test_verl_reports_a_failed_run(fake_python, base_model, subset, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VERL_FAIL", "1")
    with pytest.raises(TrainingFailedError, match="(?s)exited with status 3.*CUDA error: no GPU"):
        _verl(fake_python, tmp_path).train_stage(model=str(base_model), subset=subset,
                                                 out_dir=str(tmp_path / "s0"), steps=1, seed=0, stage=0,
                                                 reward="exact_numeric")


def test_verl_checks_inputs_before_launching(fake_python, base_model, subset, tmp_path):
    trainer = _verl(fake_python, tmp_path)
    args = dict(model=str(base_model), out_dir=str(tmp_path / "s0"), steps=1, seed=0, stage=0)
    with pytest.raises(UnknownRewardError):
        trainer.train_stage(subset=subset, reward="nope", **args)
    with pytest.raises(NotFoundError, match="does not exist"):
        trainer.train_stage(subset=str(tmp_path / "missing.parquet"), reward="exact_numeric", **args)
    with pytest.raises(InvalidInputError, match="12 prompts but a step takes batch_prompts=16"):
        make_trainer("verl", batch_prompts=16, n_gpus_per_node=1, python=fake_python).train_stage(
            subset=subset, reward="exact_numeric", **args)
    assert not (tmp_path / "verl_run").exists()


def test_verl_missing_interpreter_is_a_clear_error(base_model, subset, tmp_path):
    trainer = make_trainer("verl", batch_prompts=4, n_gpus_per_node=1, python=str(tmp_path / "no-python"))
    with pytest.raises(NotFoundError, match="set VerlOptions.python"):
        trainer.train_stage(model=str(base_model), subset=subset, out_dir=str(tmp_path / "s0"), steps=1, seed=0,
                            stage=0, reward="exact_numeric")


def test_verl_python_defaults_to_the_environment_variable(monkeypatch):
    monkeypatch.setenv("CROPI_VERL_PYTHON", "/opt/verl/bin/python")
    assert VerlOptions().python == "/opt/verl/bin/python"


# ---------------------------------------------------------------- verl reward function


def test_verl_reward_function_uses_the_named_reward():
    from cropi.rewards.verl_reward import compute_score

    assert compute_score("arithmetic", "so it is 42", "42", {}, reward_name="exact_numeric") == 1.0
    assert compute_score("arithmetic", "so it is 41", "42", {}, reward_name="exact_numeric") == 0.0
    # Without the config's name, a row's extra_info decides, else math_verify.
    assert compute_score("arithmetic", "so it is 42", 42, {"reward": "exact_numeric"}) == 1.0
    assert compute_score("arithmetic", "The answer is \\boxed{42}.", "42") == 1.0
    with pytest.raises(UnknownRewardError):
        compute_score("arithmetic", "42", "42", {}, reward_name="no_such_reward")


def test_marker_file_is_not_a_weight_file(stage0):
    assert (Path(stage0.checkpoint) / MARKER).suffix == ".json"
    assert os.path.getsize(Path(stage0.checkpoint) / MARKER) > 0


def test_which_trainers_run_a_stage_in_parts(tmp_path):
    """A checked stage needs training on from any checkpoint of the run: lean and trl can, and verl can when each
    call branches its own run folder (the default); one shared ``run_dir`` continues only from its newest step,
    so its stages run unchecked and the stage record says so."""
    from cropi.trainers import trainer_class

    assert trainer_class("lean").runs_in_parts and trainer_class("trl").runs_in_parts
    assert make_trainer("verl", n_gpus_per_node=1).runs_in_parts
    assert not make_trainer("verl", n_gpus_per_node=1, run_dir=str(tmp_path / "shared")).runs_in_parts


def test_a_verl_call_branches_its_own_run_folder_from_the_state_behind_its_checkpoint(tmp_path):
    """The state is hard-linked, not copied, and the branch's own changes (verl pruning the loaded step) leave
    the parent's state whole, so the parent's checkpoint can be trained on from again."""
    import shutil

    from cropi.trainers.lineage import StageMarker, write_marker
    from cropi.trainers.verl import TRACKER, _branch, latest_step

    parent = tmp_path / "part-0" / "verl_run"
    weights = parent / "global_step_5" / "actor" / "model_world_size_1_rank_0.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"fsdp state")
    (parent / TRACKER).write_text("5")
    checkpoint = tmp_path / "part-0" / "train" / "checkpoint"
    checkpoint.mkdir(parents=True)
    write_marker(checkpoint, StageMarker(trainer="verl", reference_model="/m", stage=0, global_step=5,
                                         run_state=str(parent)))
    for part in ("part-1", "part-2"):  # two calls from one checkpoint: a part, then its successor after a revert
        own = tmp_path / part / "verl_run"
        _branch(str(checkpoint), own)
        linked = own / "global_step_5" / "actor" / weights.name
        assert latest_step(own) == 5 and os.stat(linked).st_ino == os.stat(weights).st_ino
        linked.unlink()  # verl pruning the branch's copy of the step it loaded
        assert weights.read_bytes() == b"fsdp state"
    _branch(str(checkpoint), own)  # a retry finds its folder as it left it
    assert not (own / "global_step_5" / "actor" / weights.name).exists()
    assert not list(tmp_path.rglob("*.partial"))
    shutil.rmtree(parent)  # released
    with pytest.raises(ConflictError, match="is gone: it was released"):
        _branch(str(checkpoint), tmp_path / "part-3" / "verl_run")
    assert not (tmp_path / "part-3").exists()
