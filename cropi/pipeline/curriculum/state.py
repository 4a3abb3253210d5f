"""Where a curriculum's files go and its ``state.json``: progress, written atomically after every step."""

from __future__ import annotations

import time
from pathlib import Path

from cropi.errors import ConflictError
from cropi.pipeline.curriculum.check import from_lists, objective
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.requests import store_path
from cropi.utils.fsio import read_json, resolve, write_json_atomic

STATE_VERSION = 1


class CurriculumConflictError(ConflictError):
    """A curriculum of this name exists under the root with another config."""


class CurriculumPaths:
    """Where a curriculum's files go under ``root``."""

    def __init__(self, root: str | Path, name: str):
        self.root = Path(root).resolve()
        self.dir = self.root / "curricula" / name
        self.state = self.dir / "state.json"
        self.store = store_path(self.root)

    def stage(self, m: int) -> Path:
        return self.dir / f"stage-{m}"


class StageState:
    """``state.json``: the config it belongs to and, per stage, the finished steps."""

    def __init__(self, paths: CurriculumPaths, doc: dict):
        self.paths = paths
        self.doc = doc

    @classmethod
    def open(cls, paths: CurriculumPaths, config: CurriculumConfig) -> "StageState":
        """The stored state, or a fresh one; refuses a state made under another config."""
        if paths.state.is_file():
            fs, path = resolve(str(paths.state))
            doc = read_json(fs, path)
            if doc.get("resume_key") not in config.resume_keys():
                raise CurriculumConflictError(
                    f"curriculum {config.name!r} under {paths.root} was started with another config "
                    f"(see {paths.state}); rerun it with that config (only 'stages' may grow), pick another "
                    "name, or delete its folder to start over")
            doc["config"] = config.model_dump(mode="json")
            return cls(paths, doc)
        now = time.time()
        return cls(paths, {"version": STATE_VERSION, "name": config.name, "resume_key": config.resume_key(),
                           "config": config.model_dump(mode="json"), "created": now, "stages": []})

    def stage(self, m: int) -> dict:
        while len(self.doc["stages"]) <= m:
            self.doc["stages"].append({"index": len(self.doc["stages"])})
        return self.doc["stages"][m]

    def finish(self, m: int, step: str, record: dict) -> None:
        """Mark ``step`` of stage ``m`` done with its ``record``, and save atomically."""
        self.stage(m)[step] = {**record, "at": time.time()}
        self.save()

    def save(self) -> None:
        self.doc["updated"] = time.time()
        self.paths.dir.mkdir(parents=True, exist_ok=True)
        fs, path = resolve(str(self.paths.state))
        write_json_atomic(fs, path, self.doc)

    def stage_model(self, m: int) -> str:
        """``theta_m``: the initial model at stage 0, else the checkpoint stage ``m - 1`` trained."""
        if m == 0:
            return self.doc["initial_model"]["path"]
        return self.stage(m - 1)["trained"]["checkpoint"]


def load_state(root: str | Path, name: str) -> dict:
    """The stored state of a curriculum (raises NotFoundError when there is none)."""
    fs, path = resolve(str(CurriculumPaths(root, name).state))
    return read_json(fs, path)


def summary(doc: dict, stages: int | None = None) -> dict:
    """The job result: per stage its subset, size, checkpoint and metrics (the service lists these)."""
    rows = []
    for s in doc["stages"][:stages]:
        selected, trained = s.get("selected", {}), s.get("trained", {})
        rows.append({"index": s["index"], "model": s.get("scored", {}).get("model"),
                     "ranking": s.get("scored", {}).get("ranking"), "subset": selected.get("subset"),
                     "n_prompts": selected.get("n_prompts"), "checkpoint": trained.get("checkpoint"),
                     "steps_done": trained.get("steps_done"), "global_step": trained.get("global_step"),
                     "metrics": trained.get("metrics", {}), "metrics_path": trained.get("metrics_path"),
                     "passes": trained.get("passes"),
                     "score_s": s.get("scored", {}).get("seconds"), "selection": selected.get("diagnostics"),
                     "refreshed": s.get("scored", {}).get("refreshed"), "checks": check_summary(s),
                     "cost_s": stage_cost(s)})
    done = [r for r in rows if r["checkpoint"]]
    return {"name": doc["name"], "method": doc["config"].get("selector", doc["config"].get("method")), "finished": bool(doc.get("finished")),
            "stages": rows, "final_checkpoint": done[-1]["checkpoint"] if done else None}


def _best_summary(best: dict | None) -> dict | None:
    """The best checkpoint at a stage's end (the curriculum's so far with ``best_of: run``, else the stage's):
    its stage, part (-1: that stage's start) and objective."""
    if not best:
        return None
    return {"stage": best.get("stage"), "part": best.get("part"),
            "objective": round(objective(from_lists(best["values"])), 6)}


def check_summary(stage: dict) -> dict:
    """A stage's checks as its answer shows them: per check the arm, fraction, objective, change against
    the best, its SE and margin, and the action; the best at the stage's end; the stage's case(s); or why it
    ran unchecked."""
    trained, record = stage.get("trained", {}), stage.get("check") or {}
    if not trained.get("checked"):
        return {"checked": False, "reason": trained.get("unchecked") or record.get("unchecked")}
    keys = ("index", "arm", "fraction", "steps", "objective", "change", "se", "margin", "action", "zero_share",
            "widened", "widened_by", "race", "n_prompts", "filled", "warnings", "saturated", "widen_race", "leg",
            "no_gain_draw")
    start, end = record.get("start", {}), record.get("end", {})

    fresh_keys = ("objective", "change", "se", "margin", "action", "stream", "on", "prompts", "best_part", "best_stage")

    def check(e: dict) -> dict:  # a screen's fresh reading, when it fired: its change, SE, margin, verdict
        fresh = e.get("confirm")  # and with widen_when: stalled a saturated part's rise and whether it is resolved
        return ({k: e.get(k) for k in keys} | ({"confirm": {k: fresh.get(k) for k in fresh_keys}} if fresh else {})
                | ({"rising": e["rising"]} if e.get("rising") else {})
                | ({"negative": e["negative"]} if e.get("negative") is not None else {})
                | ({k: e[k] for k in ("race_objective", "race_draws")} if "race_objective" in e else {}))

    return {"checked": True, "plan": {k: v for k, v in record.get("plan", {}).items() if k != "variance"},
            "start": {"arm": start.get("arm"), "fraction": start.get("fraction"), "objective": start.get("objective"),
                      **({"pool_flat": start["pool_flat"]} if start.get("pool_flat") else {})},
            "race": [check(e) for e in record.get("race", [])], "race_lead": record.get("race_lead"),
            **({"race_first_look": record["race_first_look"]} if record.get("race_first_look") else {}),
            **({"race_gain_look": record["race_gain_look"]} if record.get("race_gain_look") else {}),
            **({"race_unresolved": record["race_unresolved"]} if record.get("race_unresolved") else {}),
            **({"race_start": {k: record["race_start"].get(k) for k in ("objective", "draws", "gain", "no_gain")}
                               | ({"from_winner": record["race_start"]["from_winner"]}  # race_no_gain: higher
                                  if "from_winner" in record["race_start"] else {})}
               if record.get("race_start") else {}),
            **({"race_on": [check(e) for e in record["race_on"]]} if record.get("race_on") else {}),
            **({"revisit": record["revisit"]} if record.get("revisit") else {}),
            "parts": [check(e) for e in record.get("parts", [])],
            **({"widen_races": [{"part": r["part"], "arm": r["arm"], "fractions": r["fractions"],
                                 "winner": r.get("winner"), "lead": r.get("lead"),
                                 "entries": [check(e) for e in r["entries"]]} for r in record["widen_races"]]}
               if record.get("widen_races") else {}),
            "end": {k: end.get(k) for k in ("arm", "fraction", "objective", "change", "margin", "cases")} | (
                {"race_wider": end["race_wider"]} if end.get("race_wider") else {}) | (
                {"revisit": end["revisit"]} if end.get("revisit") else {}) | (
                {"best": _best_summary(start.get("best"))} if end else {})}


def race_sides(record: dict) -> tuple[dict, dict] | None:
    """A checked stage record's (or its ``check_summary``'s) race entries, the winner's and the loser's (a sequential
    race whose arms both trained on: their other halves, whose readings decided it; where the winner alone did,
    ``race_gain_length``, the halves); None where the stage ran no race."""
    on = record.get("race_on") or []
    entries = on if len(on) == 2 else record.get("race") or []
    if len(entries) != 2:
        return None
    won = next(e for e in entries if e["race"] == "won")
    return won, next(e for e in entries if e is not won)


def stage_cost(stage: dict) -> dict:
    """A stage's seconds: scoring (its ranking, and re-selections for the check), checks, training, and apart
    from them ``evaluation``: the trainer's evaluations of the test splits (``eval_files``: the demo's curves),
    which a run without them would not spend, so ``training`` leaves them out."""
    scored, metrics = stage.get("scored", {}), stage.get("trained", {}).get("metrics", {})
    evaluation = metrics.get("eval_s") or 0.0
    return {"scoring": round((scored.get("seconds") or 0.0) + (metrics.get("select_s") or 0.0), 3),
            "checks": metrics.get("check_s") or 0.0,
            "training": round((metrics.get("train_s", metrics.get("runtime_s")) or 0.0) - evaluation, 3),
            "evaluation": evaluation}
