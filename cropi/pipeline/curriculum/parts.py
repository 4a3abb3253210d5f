"""A checked stage: train it in parts, check the validation objective after each, act on it.

The trainer only trains a number of steps from a checkpoint and saves (``train_stage``); restoring is
training on from an earlier checkpoint. cropi.pipeline.curriculum.check measures and decides. The
stage's record (``state.json``, ``stages[m]["check"]``) is saved after every part, so a killed
curriculum resumes at the part it was in without repeating or losing a decision:

    plan     the parts' steps, the validation sample and its noise, the reversal z, the pool's
             expected share of all-equal groups, the two arms (primary selector, fallback)
    start    the arm and fraction the stage begins with, its checkpoint and objective
    race     stage 0, and a stage after a confirmed reversal: the first part trained with each arm from the
             stage's start (the better goes on); ``race_lead``: how far it led, its SE, and whether resolved (with
             `race_length: sequential` each arm's first half, ``race_first_look`` its lead, and where that was not
             resolved ``race_on``: each arm's other half, on from its own first half); with `pool_revisit: race`,
             a stage after one that ended holding the pool by the no-gain action races the ranked subset that action
             left against the pool instead (``revisit``: the ranked subset, which read higher, the lead, which went on)
    parts    per part: arm, fraction, steps, checkpoint (and with `widened: filled`, how many of a widened
             subset's prompts the fill drew, with `no_harm` also how many pool prompts of negative gain it left
             out: `negative`; a subset short of a batch: its fill and its `warnings`), the
             check's reading and action (and, when the screen fired, its confirmation on held-out prompts and
             a fresh stream: `confirm`;
             with `at_whole_pool: keep`, a fall at the whole pool is `no_fallback` and the part kept; with
             `widen_when: stalled`, a saturated part's rise over the best and whether it is resolved: `rising`)
    widen_races  with ``widen_check: race``: per race, the part it stands for, the current and the doubled
             fraction, both entries trained from one checkpoint (the winner is also that part of ``parts``), the
             winner's fraction and ``lead``; a saturated part records the race it asks for (``saturated``)
    end      the stage's checkpoint, objective, case(s), the arm and fraction later stages take (and
             ``race_wider``: a widening race still pending, which the next stage begins with; ``revisit``: the ranked
             subset the next stage races against the pool)

The best a fall is measured against starts as the previous stage's (``best_of: run``) where it reads higher
than the stage's start: a restore may go back to an earlier stage's checkpoint.

Steps are counted as spent: every trained part counts, a reverted one and the race's loser included,
and the stage's metrics file (what reports read) gives every row the curriculum's spent step.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from cropi.contracts import POOL
from cropi.data import PromptRecord, load_prompts, write_verl_parquet
from cropi.pipeline.curriculum import check as chk
from cropi.pipeline.curriculum import steps
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.curriculum.state import CurriculumPaths, StageState
from cropi.pipeline.progress import Progress
from cropi.selection import filled, fraction_count
from cropi.utils.fingerprint import model_fingerprint
from cropi.utils.fsio import resolve, write_json_atomic


def checked(config: CurriculumConfig, trainer) -> str | None:
    """Why a stage of this curriculum is not checked (None: it is)."""
    if not config.check.enabled:
        return "the check is off (check.enabled: false)"
    if not getattr(trainer, "runs_in_parts", False):
        return (f"trainer {getattr(trainer, 'name', type(trainer).__name__)!r} cannot run a stage in parts (it cannot train on from an earlier "
                "checkpoint of its run): the stage runs unchecked")
    if not config.validation:
        return "no validation sets to check against"
    return None


def run_checked_stage(config: CurriculumConfig, paths: CurriculumPaths, state: StageState, m: int,
                      pool: dict[str, PromptRecord], trainer, selector, progress: Progress) -> dict:
    """Train stage ``m`` in checked parts; returns its ``trained`` record. ``selector(arm, fraction)``
    gives the stage subset's prompt ids for an arm at a fraction (from the stage's ranking)."""
    stage = state.stage(m)
    record = stage.get("check")
    if record is None or "plan" not in record:
        record = stage["check"] = _plan(config, paths, state, m, trainer)
        state.save()
    if record.get("unchecked"):
        return _unchecked(config, paths, state, m, pool, trainer, selector, record)
    run = _Stage(config, paths, state, m, pool, trainer, selector, record, progress)
    if "start" not in record:
        record["start"] = run.start()
        state.save()
    if run.races and not record.get("raced"):
        run.race()
    while run.remaining() > 0:
        run.part(len(record["parts"]))
    if "end" not in record:
        record["end"] = run.end()
        _tell_the_ranking(stage, record)
        state.save()
    return run.trained()


def _plan(config: CurriculumConfig, paths: CurriculumPaths, state: StageState, m: int, trainer) -> dict:
    opts = config.check
    steps = _split(config.steps_per_stage, opts.parts)
    z = chk.reversal_z(opts, len(steps))
    scored = state.stage(m).get("scored", {})
    offline = scored.get("trajectories") or {}
    variance = _variance(config, state, m, offline)
    v, sets, checks = sum(variance.values()) / len(variance), len(variance), len(steps)
    n = at_samples = chk.sample_size(v, opts, sets, checks)
    sizes = {name: len(load_prompts(path)) for name, path in config.validation.items()}
    per = 2 if opts.confirm_on == "held_out_prompts" else 1  # n read at every check, n more to confirm a fall
    smallest = min(sizes.values())
    fit = chk.fit_samples(v, opts, sets, checks, smallest // per) if smallest < per * n else None
    samples, n = fit or (opts.samples, n)
    plan = {"steps": steps, "z": round(z, 6), "test": opts.test, "rerace": opts.rerace, "variance": variance,
            "prompts_per_set": n, "samples": samples, "arms": [config.selector, opts.fallback],
            "rollouts": trainer.options.rollouts, "widened": opts.widened, "sizing": opts.sizing,
            "widen_check": opts.widen_check, "screen_z": round(chk.screen_z(opts, len(steps)), 6),
            "race_length": opts.race_length, "widen_when": opts.widen_when, "race_unresolved": opts.race_unresolved,
            "race_sample": opts.race_sample, "race_no_gain": opts.race_no_gain, "race_gain": opts.race_gain,
            "race_futility": opts.race_futility, "race_gain_length": opts.race_gain_length,
            "race_efficacy": opts.race_efficacy,
            "pool_revisit": opts.pool_revisit, "no_gain_draw": opts.no_gain_draw,
            "pool_flat_share": _pool_flat_share(offline.get(POOL), trainer.options.rollouts)}
    if samples != opts.samples:
        plan["samples_raised"] = (f"validation sets of {smallest} prompts hold {per} x {n}, not the "
                                  f"{per} x {at_samples} the check needs at "
                                  f"{opts.samples} samples a prompt: {samples} samples a prompt resolve the fall")
    needed = per * n
    short = {name: size for name, size in sizes.items() if size < needed}
    doc = {"plan": plan, "parts": []}
    if short:
        doc["unchecked"] = (f"validation sets {', '.join(f'{k} ({size} prompts)' for k, size in sorted(short.items()))} "
                            f"are too small to resolve a fall of {opts.resolve} at alpha {opts.alpha}: the check "
                            f"needs {needed} prompts a set at {opts.samples} samples each"
                            + (f" ({n} read at every check, {n} to confirm a fall)" if per > 1 else "")
                            + f", and more than {chk.MAX_SAMPLES} samples a prompt would not make up for it; "
                            "this stage runs unchecked")
    return doc


def _variance(config: CurriculumConfig, state: StageState, m: int, offline: dict) -> dict[str, float]:
    """Per validation set, the per-prompt pass-rate variance stage ``m``'s sample is sized from: theta_0's, from its
    offline trajectories (``sizing: theta_0``, and stage 0); under ``stage_start`` after a checked stage, that stage's
    end reading (its checkpoint is this stage's start; k draws a prompt), and at least ``resolve (1 - resolve)``."""
    opts = config.check
    end, draws = {}, 0
    if opts.sizing == "stage_start" and m:
        previous = state.stage(m - 1).get("check") or {}
        if (previous.get("end") or {}).get("checkpoint") == state.stage_model(m) and previous["end"].get("values"):
            end, draws = previous["end"]["values"], previous["plan"]["samples"]
    out = {name: chk.reading_variance(end[name], draws) if name in end
           else chk.prompt_variance(_rewards(offline[name])) if name in offline else 0.25  # theta_0's, read only here
           for name in config.validation}
    return out if opts.sizing == "theta_0" else {name: chk.planned_variance(v, opts) for name, v in out.items()}


class _Stage:
    def __init__(self, config, paths, state, m, pool, trainer, selector, record, progress):
        self.config, self.paths, self.state, self.m, self.pool = config, paths, state, m, pool
        self.trainer, self.selector, self.record, self.progress = trainer, selector, record, progress
        self.opts = config.check
        self.plan = record["plan"]
        self.arms = self.plan["arms"]
        # stage 0 races the two arms over its first part, and so does a stage after a confirmed reversal (revision
        # 8); a race needs a second part to go on with, and two subsets that differ: at the whole pool both arms
        # train every prompt (a widened subset is filled to its share of the pool, revision 11)
        previous = self._previous_end()
        # (read from the plan: a stage planned before revision 8 resumes as it began, unraced)
        again = (bool(previous) and self.plan.get("rerace", "never") == "after_reversal"
                 and "reversed" in (previous["cases"] or []))
        # and a stage after one that ended holding the pool by the no-gain action races the ranked subset that action
        # left against the pool (pool_revisit: race, round 26; read from the plan: a stage planned before the option
        # resumes as it began)
        self.revisit = (previous.get("revisit") if previous and self.plan.get("pool_revisit", "never") == "race"
                        else None)
        self.races = self.opts.race and len(self.plan["steps"]) >= 2 and (
            bool(self.revisit) or ((m == 0 or again) and self.arms[0] != self.arms[1]
                                   and self._begins_with(previous)[1] < 1))
        sets = {n: load_prompts(p) for n, p in config.validation.items()}
        self.sample, held_out = chk.ValidationSample.draw_pair(sets, self.plan["prompts_per_set"], config.seed,
                                                               self.plan["samples"])
        self.confirm_sample = held_out if self.opts.confirm_on == "held_out_prompts" else self.sample
        self.race_sample = self._race_sample(sets, held_out) if self.races else None
        options = trainer.options
        self.sampling = {"reward": config.reward, "temperature": options.temperature,
                         "max_new_tokens": options.max_new_tokens}

    # ------------------------------------------------------------------ steps of the stage

    def _race_sample(self, sets: dict, held_out: chk.ValidationSample) -> chk.ValidationSample | None:
        """What the race's arms are read on beside the check's sample (None: the check's sample alone). With
        ``race_sample: rest`` (read from the plan: a stage planned before the option resumes as it began), every
        prompt of each set but the confirmation sample's, at the most draws a prompt whose generations stay within
        what the race's second half trains one arm on (its steps x prompts a step x rollouts), at least the
        check's: the reading costs no more than the half part it saves when it resolves."""
        if self.plan.get("race_sample", "check") != "rest":
            return None
        rest = chk.ValidationSample.beside(sets, None if self.confirm_sample is self.sample else held_out,
                                           self.config.seed, self.plan["samples"])
        whole, first = self._race_steps()
        half = whole - first if self._race_length() == "sequential" else whole
        budget = max(1, half) * getattr(self.trainer.options, "batch_prompts", 1) * self.plan["rollouts"]
        return chk.ValidationSample(rest.records, self.config.seed,
                                    chk.race_draws(budget, sum(rest.size().values()), self.plan["samples"]))

    def _previous_end(self) -> dict | None:
        """The previous stage's check ``end`` (None at stage 0 or after an unchecked stage)."""
        return (self.state.stage(self.m - 1).get("check") or {}).get("end") if self.m else None

    def _begins_with(self, previous: dict | None) -> tuple[str, float]:
        """The arm and fraction this stage begins with: where the previous stage ended, else the primary at the
        curriculum's fraction."""
        return (previous["arm"], previous["fraction"]) if previous else (self.arms[0], self.config.select_fraction)

    def start(self) -> dict:
        """The arm and fraction this stage begins with (the previous stage's), its checkpoint and objective."""
        previous = self._previous_end()
        model = self.state.stage_model(self.m)
        arm, fraction = self._begins_with(previous)
        earlier = previous["values"] if previous and previous["checkpoint"] == model else None
        values, seconds = self._reading(model, earlier)
        spent = self.state.stage(self.m - 1)["trained"]["global_step"] if self.m else 0
        best = {"stage": self.m, "part": -1, "checkpoint": model, "values": values}
        if self.opts.best_of == "run":
            carried, read_s = self._carried(model, values)
            best, seconds = carried or best, seconds + read_s
        reference, read_s = self._pool_reference(model)
        seconds += read_s
        pending = {"race_wider": previous["race_wider"]} if previous and previous.get("race_wider") else {}
        return {"arm": arm, "fraction": fraction, "checkpoint": model, "values": values,
                "objective": round(chk.objective(chk.from_lists(values)), 6), "check_s": round(seconds, 3),
                "spent": spent, "best": best,
                "current": {"arm": arm, "fraction": fraction, "checkpoint": model} | pending,
                **({"pool_flat": reference} if reference else {})}

    def _pool_reference(self, model: str) -> tuple[dict | None, float]:
        """``saturation_reference: stage_start``: the all-equal share of a seeded uniform sample of the pool read at
        ``model`` (this stage's start) with the trainer's rollouts a prompt, as many prompts as a part draws groups
        (at most the pool), with its prompts and draws; and the seconds the reading took. None where theta_0's
        offline share serves: the option's default, stage 0 (whose start is theta_0), and a trainer that does not
        say its batch."""
        batch = steps.batch_of(self.trainer)
        if self.opts.saturation_reference != "stage_start" or not self.m or not batch:
            return None, 0.0
        n = min(len(self.pool), max(self.plan["steps"]) * batch)
        ids = random.Random(f"cropi.check.pool:{self.config.seed}:{self.m}").sample(sorted(self.pool), n)
        sample = chk.ValidationSample({POOL: [self.pool[p] for p in ids]}, self.config.seed, self.plan["rollouts"])
        rates, seconds = self._measure(model, stream=f"pool:{self.m}", sample=sample)
        share = round(chk.all_equal_share(rates[POOL]), 6)
        return {"share": share, "prompts": n, "draws": self.plan["rollouts"]}, seconds

    def _carried(self, model: str, values: dict) -> tuple[dict | None, float]:
        """The previous stage's best (the curriculum's so far), read on this stage's sample, where it reads above
        this stage's start ``values``; and the seconds reading it took. None at stage 0, after an unchecked
        stage, or where the start is that best or reads as high."""
        previous = self.state.stage(self.m - 1).get("check") if self.m else None
        best = ((previous or {}).get("end") or {}).get("best")
        if not best or best["checkpoint"] == model:
            return None, 0.0
        theirs, seconds = self._reading(best["checkpoint"], best["values"])
        if chk.objective(chk.from_lists(theirs)) <= chk.objective(chk.from_lists(values)):
            return None, seconds
        return {"stage": best.get("stage", self.m - 1), "part": best["part"], "checkpoint": best["checkpoint"],
                "values": theirs}, seconds

    def _reading(self, checkpoint: str, earlier: dict | None) -> tuple[dict, float]:
        """``checkpoint``'s readings on this stage's sample, and the seconds they took: ``earlier`` (the previous
        stage's readings of it) where that stage's plan read the same sample (prompts a set, draws a prompt: the
        same prompts and streams give the same reading), else measured now."""
        plan = {}
        if self.m:
            plan = (self.state.stage(self.m - 1).get("check") or {}).get("plan") or {}
        if earlier and (plan.get("prompts_per_set"), plan.get("samples")) == (self.plan["prompts_per_set"],
                                                                             self.plan["samples"]):
            return earlier, 0.0
        measured, seconds = self._measure(checkpoint)
        return chk.as_lists(measured), seconds

    def race(self) -> None:
        """The stage's first part with each arm from its start (theta_0 at stage 0); the better objective goes on
        (ties: the primary). The loser's steps are spent first (the winner's part follows them), out of the
        stage's own steps. With ``race_length: half`` each arm trains half the part; with ``sequential`` half, and,
        where the higher half's lead is not resolved at alpha (``race_first_look``), the other half on from its own
        checkpoint (``race_on``), the higher whole part going on; with ``race_futility: stop`` not where the higher
        half reads at or below the stage's start (``race_first_look.futile``), and with ``race_efficacy: stop`` not
        where its gain over the start is resolved there (``race_first_look.gained``): the race is then decided at its
        first look, as a half-length one, and the no-gain test follows. With ``race_unresolved: fallback`` the fallback
        goes on wherever the last look's lead is not resolved at alpha (``race_unresolved`` records the reading)."""
        start = self.record["start"]
        entries = self.record.setdefault("race", [])
        whole, steps = self._race_steps()
        contestants = self._contestants()
        for side in range(len(entries), len(contestants)):  # an entry's place is its contestant's: its seed's digit
            arm, fraction = contestants[side]
            entry = self._train(0, arm, fraction, start["checkpoint"], start["spent"],
                                tag=self._race_tag(arm, fraction), steps=steps, side=side)
            entries.append(self._race_read(entry))
            self.state.save()
        legs, halves = entries, None
        sequential = self._race_length() == "sequential" and whole > steps
        if sequential:
            if "race_first_look" not in self.record:  # the decision to go on, saved before either arm does
                higher, lower = self._ranked(entries)
                look = self._race_lead(higher, lower)
                futility, efficacy = self._futility_reads(higher), self._efficacy_reads(higher)
                if not look["resolved"] and (futility or efficacy):  # the higher half's gain over the start
                    gain = self._gain_over_start(higher)
                    if futility:
                        look["futile"] = gain["lead"] <= 0
                    if efficacy and not look.get("futile"):
                        look |= {"gain": gain, "gained": gain["resolved"]}
                self.record["race_first_look"] = look
                self.state.save()
            look = self.record["race_first_look"]
            if not look["resolved"] and not look.get("futile") and not look.get("gained"):
                legs = self.record.setdefault("race_on", [])  # each arm's other half, in the arms' order
                for side in range(len(legs), len(entries)):
                    legs.append(self._other_half(entries[side], side, whole - steps))
                    self.state.save()
        winner, loser = self._ranked(legs)
        read = self._race_lead(winner, loser)
        if self.revisit:  # the pool, the decision in force, goes on unless the ranked subset's lead is resolved
            self.record["revisit"] = {"arm": self.revisit["arm"], "fraction": self.revisit["fraction"],
                                      "higher": "pool" if winner["fraction"] >= 1 else "ranked", "lead": read}
            if winner["fraction"] < 1 and not read["resolved"]:
                winner, loser = loser, winner
            self.record["revisit"]["went_on"] = "pool" if winner["fraction"] >= 1 else "ranked"
        elif self.plan.get("race_unresolved", "higher") == "fallback" and winner["arm"] != self.arms[1] \
                and not read["resolved"]:  # the race cannot tell its arms apart: the smaller downside goes on
            self.record["race_unresolved"] = {"went_on": self.arms[1], "higher": winner["arm"], "lead": read}
            winner, loser = loser, winner
        if legs is not entries:  # a whole part each, as two halves: each arm's first half before its other
            halves = tuple(next(e for e in entries if (e["arm"], e["fraction"]) == (side["arm"], side["fraction"]))
                           for side in (winner, loser))
        elif sequential and self._gain_goes_on(winner):  # the winner alone trains on to its whole part
            halves, winner = (winner, None), self._winner_on(winner, whole - steps)
        self._settle(winner, loser, start["spent"], halves)
        self.record["race_lead"] = read  # the higher reading's lead: the winner's, but where the fallback went on
        if halves and halves[1]:
            self.record["race"], self.record["race_on"] = [halves[1], halves[0]], [loser, winner]
        elif halves:
            self.record["race"], self.record["race_on"] = [loser, halves[0]], [winner]
        else:
            self.record["race"] = [loser, winner]
        # the pool going on from a revisit is the no-gain action's draw already: judged as any part
        no_gain = not (self.revisit and winner["fraction"] >= 1) and self._race_no_gain(winner)
        self.record["raced"] = True
        self._decide(dict(winner), first=True, to_pool=no_gain)

    def _contestants(self) -> list[tuple[str, float]]:
        """A race's (arm, fraction) pairs, in the order they train, each one's place the arm digit of its seeds: the two
        arms at the stage's start fraction, or in a revisit (``pool_revisit: race``) the ranked subset the no-gain
        action left, then the pool the stage began with."""
        start = self.record["start"]
        if self.revisit:
            return [(self.revisit["arm"], self.revisit["fraction"]), (start["arm"], start["fraction"])]
        return [(arm, start["fraction"]) for arm in self.arms]

    def _race_tag(self, arm: str, fraction: float) -> str:
        """A race entry's folder: the arm's (a revisit's contestants share their arm: the fraction's too)."""
        return f"race-{arm}-{fraction:g}" if self.revisit else f"race-{arm}"

    def _race_no_gain(self, winner: dict) -> bool:
        """``race_no_gain`` restart or pool (read from the plan: a stage planned before the option resumes as it
        began): the stage's start read on the race's own sample (``race_start``: saved once, so a resumed race
        decides as it began) and whether the winner's reading there shows no gain over the start's (``race_gain``:
        under ``any`` no higher, under ``resolved`` not higher by more than the race's own test resolves), the paired
        gain recorded with that test."""
        if not self._start_reads(winner):
            return False
        gain = self._gain_over_start(winner)
        shown = gain["resolved"] if self.plan.get("race_gain", "any") == "resolved" else gain["lead"] > 0
        start = self.record["race_start"]
        start["gain"], start["no_gain"] = gain, not shown
        return start["no_gain"]

    def _gain_over_start(self, entry: dict) -> dict:
        """A race entry's paired gain over the stage's start on the race's own sample (``chk.race_lead``), the start
        read there once (``race_start``, saved: a resumed race reads the same)."""
        if "race_start" not in self.record:
            values, seconds = self._measure(self.record["start"]["checkpoint"], sample=self.race_sample)
            self.record["race_start"] = {"values": chk.as_lists(values), "objective": round(chk.objective(values), 6),
                                         "draws": self.race_sample.samples, "check_s": round(seconds, 3)}
            self.state.save()
        return chk.race_lead(chk.from_lists(entry["race_values"]), chk.from_lists(self.record["race_start"]["values"]),
                             self.opts.alpha, self.plan.get("test", "normal"))

    def _start_reads(self, entry: dict) -> bool:
        """Whether a race entry is read against the stage's start: a no-gain action exists (``race_no_gain`` other
        than keep, read from the plan: a stage planned before the option resumes as it began) and the entry was read
        on the race's own sample."""
        return self.plan.get("race_no_gain", "keep") != "keep" and "race_values" in entry

    def _futility_reads(self, higher: dict) -> bool:
        """``race_futility: stop`` (read from the plan, as above): whether an unresolved first look reads the higher
        arm's gain over the start, to stop the race where it is at or below zero. Only the arms' race (not a
        revisit), and only where the no-gain test reads the start, which would discard both arms' steps without a
        resolved gain."""
        return self.plan.get("race_futility", "never") == "stop" and self._arms_gain_reads(higher)

    def _arms_gain_reads(self, entry: dict, resolved: bool = False) -> bool:
        """Whether an arms' race (not a revisit) reads ``entry``'s gain over the start (``_start_reads``), and with
        ``resolved`` only where the no-gain test counts resolved gains alone (``race_gain: resolved``, from the plan):
        the condition the futility bound, the efficacy bound and the winner's gain look share."""
        return (not self.revisit and self._start_reads(entry)
                and (not resolved or self.plan.get("race_gain", "any") == "resolved"))

    def _efficacy_reads(self, higher: dict) -> bool:
        """``race_efficacy: stop`` (read from the plan, as above): whether an unresolved first look reads the higher
        arm's gain over the start, to stop the race where it is resolved (``race_first_look.gained``). Only the arms'
        race, only where the no-gain test reads the start and counts resolved gains alone (``race_gain: resolved``):
        there a resolved gain settles that a ranked subset goes on, and only the unresolved pick is left."""
        return self.plan.get("race_efficacy", "never") == "stop" and self._arms_gain_reads(higher, resolved=True)

    def _gain_goes_on(self, winner: dict) -> bool:
        """``race_gain_length: sequential`` (read from the plan, as above): whether the winner of a sequential arms'
        race decided at its first look trains on to its whole part before the no-gain test, its half's paired gain
        over the start above zero and not resolved (``race_gain_look``: that gain, and ``on``; saved before the
        other half trains, so a resumed race goes on as it began). Only where the no-gain test counts resolved gains
        alone (``race_gain: resolved``), which a half inside the noise would fail at half the part."""
        if "race_gain_look" not in self.record:
            if not (self.plan.get("race_gain_length", "half") == "sequential"
                    and self._arms_gain_reads(winner, resolved=True)):
                return False
            gain = self._gain_over_start(winner)
            self.record["race_gain_look"] = {"gain": gain, "on": gain["lead"] > 0 and not gain["resolved"]}
            self.state.save()
        return self.record["race_gain_look"]["on"]

    def _winner_on(self, half: dict, steps: int) -> dict:
        """The race winner's other half, trained on from its half's checkpoint with the seed it would have had had
        both arms gone on (``race_on``), read on the race's sample; saved, so a resumed race trains it once."""
        legs = self.record.setdefault("race_on", [])
        if not legs:
            legs.append(self._other_half(half, self.record["race"].index(half), steps))
            self.state.save()
        return legs[0]

    def _other_half(self, half: dict, side: int, steps: int) -> dict:
        """A sequential race's arm trained on from its half's checkpoint (``side``: the arm's place in the race, its
        seed's digit), read on the race's sample: a leg of ``race_on``."""
        tag = f"{self._race_tag(half['arm'], half['fraction'])}-on"
        entry = self._train(0, half["arm"], half["fraction"], half["checkpoint"], self.record["start"]["spent"],
                            tag=tag, steps=steps, seed_part=_RACE_ON, side=side)
        return self._race_read(entry) | {"leg": "on"}

    def _race_read(self, entry: dict) -> dict:
        """A race entry with its reading on the race's own sample where it has one (``race_values``,
        ``race_objective``; the seconds counted in the entry's checks); its ``values`` stay the check sample's,
        what every later check and the best checkpoint compare with."""
        if self.race_sample is not None:
            values, seconds = self._measure(entry["checkpoint"], sample=self.race_sample)
            entry |= {"race_values": chk.as_lists(values), "race_objective": round(chk.objective(values), 6),
                      "race_draws": self.race_sample.samples, "check_s": round(entry["check_s"] + seconds, 3)}
        return entry

    def _race_lead(self, higher: dict, lower: dict) -> dict:
        """``_lead`` of a race's entries on what the race read: its own sample where it has one."""
        return self._lead(higher, lower, "race_values" if "race_values" in higher and "race_values" in lower
                          else "values")

    def _ranked(self, entries: list[dict]) -> tuple[dict, dict]:
        """A race's two entries as (the higher objective, the other, on what the race read); a tie to the
        primary, in a revisit to the pool."""
        first = (lambda e: e["fraction"] >= 1) if self.revisit else (lambda e: e["arm"] == self.arms[0])
        winner = max(entries, key=lambda e: (e.get("race_objective", e["objective"]), first(e)))
        return winner, next(e for e in entries if e is not winner)

    def _race_steps(self) -> tuple[int, int]:
        """The arms' race's whole part and what each arm trains before its (first) look: the whole part, or half
        of it (``race_length`` half and sequential)."""
        whole = min(self.plan["steps"][0], self.config.steps_per_stage // 2)
        return whole, whole if self._race_length() == "part" else max(1, whole // 2)

    def _race_length(self) -> str:
        """How long the arms' race trains (read from the plan: a stage planned before the option resumes as it
        began)."""
        return self.plan.get("race_length", "part")

    def _settle(self, winner: dict, loser: dict, spent: int, halves: tuple[dict, dict | None] | None = None) -> dict:
        """A decided race (the arms', or a widening one): each entry marked won or lost, the loser's steps spent
        first from ``spent`` and the winner's after them; returns the winner's lead (``chk.race_lead``). ``halves``:
        the winner's and the loser's first halves, where a sequential race trained each arm on (the loser's None where
        the winner alone did: race_gain_length), each spent before its arm's other half."""
        first, other = halves or (None, None)  # other None: the winner alone trained on (race_gain_length)
        chains = ([e for e in (other, loser) if e], [e for e in (first, winner) if e])
        for chain, outcome in zip(chains, ("lost", "won")):
            for e in chain:
                e["race"], e["spent_start"] = outcome, spent
                spent += e["steps"]
        return self._lead(winner, loser)

    def _lead(self, higher: dict, lower: dict, key: str = "values") -> dict:
        """``chk.race_lead`` of one entry's readings (``key``) over another's, at the check's alpha and the plan's
        test: a race's winner over its loser, and (``widen_when: stalled``) a saturated part over the best before
        it."""
        return chk.race_lead(chk.from_lists(higher[key]), chk.from_lists(lower[key]), self.opts.alpha,
                             self.plan.get("test", "normal"))

    def remaining(self) -> int:
        """Steps of the stage's budget not yet spent (every trained part counts, the race's loser too)."""
        return self.config.steps_per_stage - (self._spent() - self.record["start"]["spent"])

    def part(self, j: int) -> None:
        cur = self._current()
        planned = self.plan["steps"]
        size = planned[min(j, len(planned) - 1)]
        if self._racing(j) or (cur.get("race_wider") and self.remaining() >= 2 * size):
            self.widen_race(j, size)
            return
        # a race took one part of the budget beside its winner's: the arms' race (a half-length one, or a sequential
        # one stopped at its first look: its two halves together one part, the winner's), and every widening race
        arms_race = 1 if self.races and (self._race_length() == "part" or self.record.get("race_on")) else 0
        last = j >= len(planned) - 1 - arms_race - len(self.record.get("widen_races", []))
        steps = self.remaining() if last else min(size, self.remaining())
        entry = self._train(j, cur["arm"], cur["fraction"], cur["checkpoint"], self._spent(), tag=f"part-{j}",
                            steps=steps)
        self._decide(entry)

    def _racing(self, j: int) -> bool:
        """Whether part ``j`` is a widening race begun before a kill (its record written, its winner not yet)."""
        races = self.record.get("widen_races") or []
        return bool(races) and races[-1]["part"] == j and "winner" not in races[-1]

    def widen_race(self, j: int, steps: int) -> None:
        """Part ``j`` as a race from the current checkpoint between the current subset and the doubled one
        (``widen_check: race``): each trained ``steps``, both read on the stage's sample; the higher objective goes
        on, a tie to the wider (the saturation test favoured it). The loser's steps are spent first, as the arms'
        race's; the winner is then judged as any part."""
        cur = self._current()
        races = self.record.setdefault("widen_races", [])
        if not self._racing(j):
            races.append({"part": j, "from": cur["checkpoint"], "arm": cur["arm"],
                          "fractions": [cur["fraction"], cur["race_wider"]], "entries": []})
            self.state.save()
        race = races[-1]
        for fraction in race["fractions"][len(race["entries"]):]:
            race["entries"].append(self._train(j, race["arm"], fraction, race["from"], self._spent(),
                                               tag=f"part-{j}-{fraction:g}", steps=steps))
            self.state.save()
        current, wider = race["entries"]
        winner = wider if wider["objective"] >= current["objective"] else current
        loser = current if winner is wider else wider
        race["lead"] = self._settle(winner, loser, min(e["spent_start"] for e in race["entries"]))
        race["winner"] = winner["fraction"]
        self._decide(dict(winner) | {"widen_race": len(races) - 1})

    def end(self) -> dict:
        cur, start = self._current(), self.record["start"]
        last = next((e for e in reversed(self.record["parts"]) if e["checkpoint"] == cur["checkpoint"]), None)
        values = last["values"] if last else self._best()["values"]
        final = self._judge(chk.from_lists(values), chk.from_lists(start["values"]))
        actions = [e["action"] for e in self.record["parts"]]
        widened_by = {e.get("widened_by", "saturation") for e in self.record["parts"] if e.get("widened")}
        raced = [r for r in self.record.get("widen_races", []) if "winner" in r]
        cases = [c for c, hit in (("reversed", "reverted" in actions),
                                  ("saturated", "saturation" in widened_by
                                   or any(e.get("saturated") for e in self.record["parts"])),
                                  ("raced_wider", any(r["winner"] > r["fractions"][0] for r in raced)),
                                  ("kept_narrower", any(r["winner"] == r["fractions"][0] for r in raced)),
                                  ("saturated_rising", any((e.get("rising") or {}).get("resolved")
                                                           for e in self.record["parts"])),
                                  ("both_arms_fell", "both_arms_fell" in widened_by),
                                  ("no_gain", "no_gain" in widened_by),
                                  ("no_fallback", "no_fallback" in actions),
                                  ("helped", final.change > final.margin)) if hit] or ["flat"]
        out = {"checkpoint": cur["checkpoint"], "arm": cur["arm"], "fraction": cur["fraction"], "values": values,
               "objective": round(final.value, 6), "change": round(final.change, 6), "margin": round(final.margin, 6),
               "cases": cases}
        if self.opts.best_of == "run":  # what the next stage starts its best from
            out["best"] = dict(self._best())
        if cur.get("race_wider"):  # saturated with no room left to race: the next stage begins with the race
            out["race_wider"] = cur["race_wider"]
        revisit = self._revisit_next(cur)
        if revisit:
            out["revisit"] = revisit
        return out

    def _revisit_next(self, cur: dict) -> dict | None:
        """``pool_revisit: race``: the ranked subset (arm, fraction) the next stage races against the pool, where this
        stage ends holding the pool by the no-gain action (it widened to the pool here, or a revisit left the pool
        on with neither lead resolved); None otherwise."""
        if self.plan.get("pool_revisit", "never") != "race" or cur["fraction"] < 1:
            return None
        widened = next((e for e in self.record["parts"] if e.get("widened_by") == "no_gain"), None)
        if widened:
            return {"arm": widened["arm"], "fraction": widened["fraction"]}
        revisit = self.record.get("revisit")
        settled = revisit and revisit["higher"] == "pool" and revisit["lead"]["resolved"]
        if revisit and revisit["went_on"] == "pool" and not settled:
            return {"arm": revisit["arm"], "fraction": revisit["fraction"]}
        return None

    def trained(self) -> dict:
        parts = self._spent_parts()
        steps = sum(e["steps"] for e in parts)
        end = self.record["end"]
        metrics_path = self._merge_metrics(parts)
        last = self.record["parts"][-1]
        seconds = {"train": sum(e["train_s"] for e in parts), "select": sum(e.get("select_s", 0.0) for e in parts),
                   "check": self.record["start"]["check_s"] + sum(e["check_s"] for e in parts)
                   + (self.record.get("race_start") or {}).get("check_s", 0.0),
                   "eval": sum(e["metrics"].get("eval_s") or 0.0 for e in parts)}
        metrics = dict(last["metrics"]) | {f"{k}_s": round(v, 3) for k, v in seconds.items()}
        shares = [e["zero_share"] for e in parts if e.get("zero_share") is not None]
        if shares:
            metrics["zero_advantage_share"] = sum(shares) / len(shares)
        batch = self.config.trainer_options.get("batch_prompts") or getattr(self.trainer.options, "batch_prompts", 0)
        return {"checkpoint": end["checkpoint"], "fingerprint": model_fingerprint(end["checkpoint"]),
                "steps_done": steps, "global_step": self.record["start"]["spent"] + steps,
                "lineage_step": self._lineage_end(end["checkpoint"]), "metrics": metrics, "log": last["log"],
                "metrics_path": metrics_path,
                "passes": sum(e["steps"] * batch / max(e["n_prompts"], 1) for e in parts) if batch else None,
                "checked": True}

    # ------------------------------------------------------------------ the pieces

    def _train(self, j: int, arm: str, fraction: float, model: str, spent: int, *, tag: str, steps: int,
               seed_part: int | None = None, side: int | None = None) -> dict:
        import time

        began = time.monotonic()
        subset = self._subset(arm, fraction)
        select_s = time.monotonic() - began
        out = self.paths.stage(self.m) / tag
        if out.exists():  # a run killed inside this part: train the part again from its start
            shutil.rmtree(out)
        self.progress(f"part {j} ({arm}, {fraction:g})", j, len(self.plan["steps"]))
        result = self.trainer.train_stage(model=model, subset=str(subset), out_dir=str(out / "train"), steps=steps,
                                          seed=_part_seed(self.config.seed, self.m,
                                                          j if seed_part is None else seed_part,
                                                          self._digit(arm) if side is None else side),
                                          stage=self.m, reward=self.config.reward)
        values, check_s = self._measure(result.checkpoint)
        share = result.metrics.get("zero_advantage_share")
        return {"index": j, "arm": arm, "fraction": fraction, "steps": result.steps_done, "subset": str(subset),
                "n_prompts": len(load_prompts(str(subset))), **self._fill_record(subset), "from": model,
                "checkpoint": result.checkpoint,
                "spent_start": spent, "lineage_start": result.global_step - result.steps_done,
                "values": chk.as_lists(values), "objective": round(chk.objective(values), 6),
                "zero_share": share, "groups": result.steps_done * getattr(self.trainer.options, "batch_prompts", 0),
                "train_s": round(result.metrics.get("runtime_s", time.monotonic() - began), 3),
                "select_s": round(select_s, 3), "check_s": round(check_s, 3),
                "metrics": {k: v for k, v in result.metrics.items()}, "metrics_path": result.metrics_path,
                "log": result.log_path}

    def _digit(self, arm: str) -> int:
        """An arm's digit in its parts' seeds: its place in the plan's arms; the mixed draw's after them."""
        return self.arms.index(arm) if arm in self.arms else len(self.arms)

    def _decide(self, entry: dict, first: bool = False, to_pool: bool = False) -> None:
        """Judge a part (``first``: the race's winner) against the best and set what the next part trains;
        ``to_pool``: the race's winner showed no gain over the start (``_race_no_gain``), so it goes on at the
        whole pool (with ``no_gain_draw: mixed`` as the arm ``mixed``: the pool's mixed prompts); under
        ``race_no_gain: restart`` from the best checkpoint, the winner not made the best (the race read no gain of it
        over the start, a checkpoint the best reads at least as high as); under ``higher`` so only where the race read
        the winner at or below the start (``_restarts``)."""
        best, pending = self._best(), {}
        verdict = self._judge(chk.from_lists(entry["values"]), chk.from_lists(best["values"]), screen=True)
        if verdict.action == "reverted" and entry["fraction"] >= 1 and self.opts.at_whole_pool == "keep":
            verdict = chk.without_fallback(verdict)  # both arms select the whole pool, nothing is wider (revision 5)
        if verdict.action == "reverted":  # the screen fired: read both again on a fresh stream
            verdict = chk.confirmed(verdict, self._confirm(entry, best))
        entry |= verdict.record()
        if first:
            entry["action"] = f"race_won+{verdict.action}"
        arm, fraction = entry["arm"], entry["fraction"]
        if verdict.action == "reverted":  # back to the best checkpoint, on with the other arm (the race's
            if not first:                   # winner keeps its arm: the loser measured worse still)
                arm = self.arms[1] if arm == self.arms[0] else self.arms[0]
            checkpoint = best["checkpoint"]
            if self._both_arms_fell(entry, checkpoint) and fraction < 1:  # against the fraction, not an arm
                fraction = _widen(entry, fraction, "both_arms_fell")
        elif to_pool and self._restarts():  # kept, but the race showed no gain
            checkpoint = best["checkpoint"]
        else:  # kept, or a screen the fresh reading did not confirm
            checkpoint = entry["checkpoint"]
            if verdict.value > chk.objective(chk.from_lists(best["values"])):
                self.record["start"]["best"] = {"stage": self.m, "part": entry["index"], "checkpoint": checkpoint,
                                                "values": entry["values"]}
            if (self.opts.widen and fraction < 1 and entry.get("zero_share") is not None and self._saturated(entry)
                    and not self._rising(entry, best)):
                if self.plan.get("widen_check", "none") == "race":  # the next part races the doubled fraction
                    pending = {"race_wider": min(1.0, 2 * fraction)}
                    entry["saturated"] = pending["race_wider"]
                else:
                    fraction = _widen(entry, fraction, "saturation")
        if to_pool and fraction < 1:
            fraction = _widen(entry, fraction, "no_gain", to=1.0)
            if self.plan.get("no_gain_draw", "pool") == "mixed":  # the pool less its all-equal groups
                arm = entry["no_gain_draw"] = MIXED
        entry["then"] = {"arm": arm, "fraction": fraction, "checkpoint": checkpoint} | pending
        self.record["start"]["current"] = entry["then"]
        self.record["parts"].append(entry)
        self.state.save()

    def _restarts(self) -> bool:
        """Whether the no-gain action trains from the best checkpoint rather than the race's winner's: always under
        ``race_no_gain: restart``; under ``higher`` only where the race read the winner at or below the start (the
        point estimate's argmax between the two, recorded as ``race_start.from_winner``)."""
        rule = self.plan.get("race_no_gain")
        if rule == "higher":
            start = self.record["race_start"]
            start["from_winner"] = start["gain"]["lead"] > 0
            return not start["from_winner"]
        return rule == "restart"

    def _rising(self, entry: dict, best: dict) -> bool:
        """``widen_when: stalled``: whether the part's rise over the best it was judged against is resolved (one-sided
        at alpha, ``chk.race_lead``'s test), recorded as ``rising``; a rising part keeps its fraction. Always False
        under ``saturated`` (read from the plan: a stage planned before the option resumes as it began)."""
        if self.plan.get("widen_when", "saturated") != "stalled":
            return False
        entry["rising"] = self._lead(entry, best)
        return entry["rising"]["resolved"]

    def _saturated(self, entry: dict) -> bool:
        """The part's all-equal share against the pool's: read at the stage's start where the stage did
        (``pool_flat``), else theta_0's offline share (``plan["pool_flat_share"]``; None: none to test against)."""
        read = self.record["start"].get("pool_flat")
        if read:
            return chk.saturated(entry["zero_share"], entry["groups"], read["share"], self.opts, read["prompts"])
        reference = self.plan["pool_flat_share"]
        return reference is not None and chk.saturated(entry["zero_share"], entry["groups"], reference, self.opts)

    def _both_arms_fell(self, entry: dict, checkpoint: str) -> bool:
        """Whether the other arm has already fallen below this same best checkpoint in this stage (a confirmed
        reversal back to it): both arms then measured worse than where they started, at this fraction."""
        return any("reverted" in e["action"] and e["arm"] != entry["arm"] and e["fraction"] == entry["fraction"]
                   and e["then"]["checkpoint"] == checkpoint for e in self.record["parts"])

    def _judge(self, values: dict, best: dict, screen: bool = False) -> chk.Verdict:
        """``chk.judge`` at the plan's level and test (a plan written before revision 7 has no ``test``: the
        normal quantile it was planned with, so a resumed stage decides as it began); a part's ``screen`` at the
        plan's screen level (``check.screen``; a plan written before it screens at its ``z``)."""
        z = self.plan.get("screen_z", self.plan["z"]) if screen else self.plan["z"]
        return chk.judge(values, best, z, self.plan.get("test", "normal"))

    def _confirm(self, entry: dict, best: dict) -> chk.Verdict:
        """Both checkpoints read on a stream of their own (this stage and part) and on the confirmation's
        prompts (``confirm_on``), judged as the screen was; the readings go into the part's record
        (``confirm``) and their seconds into its checks'."""
        stream = f"confirm:{self.m}:{entry['index']}"
        mine, s1 = self._measure(entry["checkpoint"], stream, self.confirm_sample)
        theirs, s2 = self._measure(best["checkpoint"], stream, self.confirm_sample)
        fresh = self._judge(mine, theirs)
        entry["confirm"] = fresh.record() | {"stream": stream, "on": self.opts.confirm_on,
                                             "prompts": self.confirm_sample.size(), "values": chk.as_lists(mine),
                                             "best_values": chk.as_lists(theirs), "best_part": best["part"],
                                             "best_stage": best.get("stage", self.m)}
        entry["check_s"] = round(entry["check_s"] + s1 + s2, 3)
        return fresh

    def _current(self) -> dict:
        return self.record["start"]["current"]

    def _best(self) -> dict:
        return self.record["start"]["best"]

    def _spent(self) -> int:
        return self.record["start"]["spent"] + sum(e["steps"] for e in self._spent_parts())

    def _spent_parts(self) -> list[dict]:
        """Every part trained once, in the order its steps were spent: the arms' race's (its winner's part is also the
        first of ``parts``), the rest, and the widening races' (a winner is also a part of ``parts``)."""
        parts = [e for e in self.record["parts"][1 if self.races else 0:] if "widen_race" not in e]
        raced = [e for r in self.record.get("widen_races", []) for e in r["entries"]]
        return sorted([*self.record.get("race", []), *self.record.get("race_on", []), *parts, *raced],
                      key=lambda e: e["spent_start"])

    def _measure(self, checkpoint: str, stream: str = "", sample: chk.ValidationSample | None = None):
        return (sample or self.sample).measure(checkpoint, device=_device(self.config), stream=stream,
                                               **self.sampling)

    def _subset(self, arm: str, fraction: float) -> Path:
        stage = self.state.stage(self.m)
        if arm == self.config.selector and fraction == self.config.select_fraction and "selected" in stage:
            return Path(stage["selected"]["subset"])
        path = self.paths.stage(self.m) / "subsets" / f"{arm}-{fraction:g}.parquet"
        if not path.is_file():
            ids = self.selector(_MIXED_SELECTOR if arm == MIXED else arm, fraction)
            path.parent.mkdir(parents=True, exist_ok=True)
            batch, widened, own = steps.batch_of(self.trainer), self._fills(arm, fraction), len(ids)
            if widened or own < batch:  # its count first: a kill before the subset is written leaves none to reuse
                note = {}
                if widened:  # filled to its share of the pool (and to a batch, should that share be smaller)
                    harm = self._harmful()  # no_harm: of the pool less its prompts of negative gain
                    if harm:
                        ids, note = [p for p in ids if p not in harm], {"negative": len(harm)}
                        own = len(ids)
                    ids = filled(ids, [p for p in self.pool if p not in harm], None,
                                 steps.fill_stream(self.config, self.m, arm, fraction),
                                 at_least=max(batch, fraction_count(fraction, len(self.pool))))
                else:  # short of one batch: the stage subset's own fill, and its warning
                    ids, fill = steps.to_a_batch(self.config, self.m, self.pool, ids, arm, fraction, batch)
                    note = {"warnings": [fill["warning"]]}
                write_json_atomic(*resolve(str(path.with_suffix(".json"))),
                                  {"selected": own, "filled": len(ids) - own} | note)
            write_verl_parquet([self.pool[p] for p in ids], str(path), split="train")
        return path

    def _fills(self, arm: str, fraction: float) -> bool:
        """Whether ``arm``'s subset at ``fraction`` is filled up to its share of the pool (revision 11): a widened one,
        under a plan that says so (a stage planned before revision 11 resumes as it began), but never the mixed draw
        (``no_gain_draw: mixed``), which is informative's every candidate and nothing from the rest of the pool."""
        return (arm != MIXED and self.plan.get("widened", "selection") in ("filled", "no_harm")
                and fraction > self.config.select_fraction)

    def _harmful(self) -> frozenset[str]:
        """``widened: no_harm``: the pool prompts a widened subset leaves out, those of negative gain at the stage's
        ranking (``steps.harmful``); none under ``filled``."""
        if self.plan.get("widened") != "no_harm":
            return frozenset()
        return steps.harmful(self.state.stage(self.m).get("scored") or {})

    @staticmethod
    def _fill_record(subset: Path) -> dict:
        """How many of a subset's prompts the fill drew (``filled``, None: not filled), and what the fill of one short
        of a batch warns of (``warnings``, only then; the primary's own subset carries it in the stage's selection)."""
        side = subset.with_suffix(".json")
        doc = json.loads(side.read_text()) if side.is_file() else {}
        return ({"filled": doc.get("filled")} | ({"warnings": doc["warnings"]} if doc.get("warnings") else {})
                | ({"negative": doc["negative"]} if "negative" in doc else {}))

    def _lineage_end(self, checkpoint: str) -> int:
        """The trainer's step at ``checkpoint``: a part of this stage, or of an earlier one (a restored best)."""
        records = [self.record] + [self.state.stage(k).get("check") or {} for k in range(self.m - 1, -1, -1)]
        for e in (e for r in records for e in _entries(r)):
            if e["checkpoint"] == checkpoint:
                return e["lineage_start"] + e["steps"]
        return 0

    def _merge_metrics(self, parts: list[dict]) -> str:
        """The stage's rows with every step the curriculum's spent step (the race's loser: its steps and
        its step-0 evaluation only)."""
        rows = []
        for e in parts:
            offset = e["spent_start"] - e["lineage_start"]
            for line in Path(e["metrics_path"]).read_text().splitlines():
                if not line:
                    continue
                row = json.loads(line)
                if (e.get("race") == "lost" and "eval" in row
                        and (row["step"] != e["lineage_start"] or e.get("leg") == "on")):  # the loser's other half
                    continue                                            # starts from the loser's own checkpoint
                rows.append(row | {"step": row["step"] + offset, "lineage_step": row["step"], "arm": e["arm"]})
        out = self.paths.stage(self.m) / "metrics.jsonl"
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(out)
        return str(out)


def carried_best(stage: dict) -> set[str]:
    """The checkpoint a later stage may restore from this one's record: its end's best (``best_of: run``)."""
    best = ((stage.get("check") or {}).get("end") or {}).get("best")
    return {best["checkpoint"]} if best else set()


def checkpoints(stage: dict) -> list[str]:
    """Every checkpoint a checked stage's parts made (the race's included); none for an unchecked stage."""
    return [e["checkpoint"] for e in _entries(stage.get("check") or {})]


def _entries(record: dict) -> list[dict]:
    """A checked stage record's part entries: the arms' race's (both halves of a sequential one), the parts', then the
    widening races'."""
    return [*record.get("race", []), *record.get("race_on", []), *record.get("parts", []),
            *(e for r in record.get("widen_races", []) for e in r["entries"])]


def _tell_the_ranking(stage: dict, record: dict) -> None:
    """What the check saw, where the stage's selection is read: the ranking's meta (``check``) and each
    ``concentrated_selection`` warning of the stage record (``observed``): a concentrated subset is a risk,
    and whether it moved the targets the right way is what the check measured."""
    from cropi.scoring.diagnostics import CONCENTRATED
    from cropi.store.rankings import read_ranking, write_ranking
    from cropi.utils.fsio import resolve

    end = record["end"]
    seen = (f"the stage's check measured the validation objective {record['start']['objective']:.3f} -> "
            f"{end['objective']:.3f} (margin {end['margin']:.3f}): {', '.join(end['cases'])}")
    for w in stage.get("selected", {}).get("diagnostics", {}).get("warnings", []):
        if w.get("code") == CONCENTRATED:
            w["observed"] = seen
    path = stage.get("scored", {}).get("ranking")
    if path and path.endswith(".parquet"):
        from cropi.pipeline.curriculum.state import check_summary

        fs, p = resolve(path)
        try:
            table, meta = read_ranking(fs, p)
        except Exception:  # noqa: BLE001 - a pass-rate table or a ranking moved away: the stage record has it all
            return
        write_ranking(fs, p, table, meta | {"check": check_summary(stage | {"trained": {"checked": True}})})


def _unchecked(config, paths, state, m, pool, trainer, selector, record) -> dict:
    """A stage that cannot be checked: trained whole on the primary's subset, the reason recorded."""
    from cropi.pipeline.curriculum import steps

    return steps.train(config, paths, m, state.stage_model(m), state.stage(m)["selected"]["subset"], trainer) | {
        "checked": False, "unchecked": record["unchecked"]}


def _widen(entry: dict, fraction: float, why: str, to: float | None = None) -> float:
    """The doubled fraction (at most the whole pool; ``to``: that fraction instead), recorded in the part's entry
    with its reason."""
    wider = min(1.0, 2 * fraction) if to is None else to
    entry["widened"], entry["widened_by"] = wider, why
    return wider


def _split(steps: int, parts: int) -> list[int]:
    n = max(1, min(parts, steps))
    return [steps // n + (1 if i < steps % n else 0) for i in range(n)]


MIXED = "mixed"  # the no-gain action's draw under no_gain_draw: mixed, as a stage's arm
_MIXED_SELECTOR = "informative"  # whose candidates are exactly the pool's prompts with mixed groups

_RACE_ON = 99  # the part index a sequential race's other halves are seeded as: no part's (a stage has at most 64)


def _part_seed(seed: int, m: int, j: int, arm: int) -> int:
    from cropi.pipeline.curriculum.steps import stage_seed

    return stage_seed(seed, m) * 1000 + arm * 100 + j


def _device(config: CurriculumConfig) -> str:
    return "cuda" if getattr(config, "device", "cpu") == "cuda" else "cpu"


def _rewards(trajectories: str) -> list[list[float]]:
    from cropi.store import TrajectoryStore

    return [list(t.rewards) for t in TrajectoryStore.open(trajectories).iter_prompts()]


def _pool_flat_share(trajectories: str | None, rollouts: int) -> float | None:
    if not trajectories:
        return None
    groups = _rewards(trajectories)
    k = min(len(g) for g in groups) if groups else 0
    if k < 2:
        return None
    return chk.flat_share([sum(1 for x in g[:k] if x and x > 0) for g in groups], k, rollouts)
