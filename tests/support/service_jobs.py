"""Trivial job kinds for the service tests, imported by the worker processes (no tests here).

Each follows the worker's calling convention ``fn(params, *, root, progress) -> dict`` and,
like the real job functions, is resumable: ``steps_job`` keeps its completed steps in a file
and continues after the last one when run again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cropi.errors import InvalidInputError


def steps_job(params: dict, *, root: str, progress) -> dict:
    """``steps`` steps of ``sleep`` seconds; each completed step is appended to ``dir/done``."""
    folder = Path(params["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "starts", "a") as f:
        f.write(f"{os.getpid()}\n")
    done_file = folder / "done"
    done = len(done_file.read_text().splitlines()) if done_file.exists() else 0
    total = int(params["steps"])
    progress("steps", done, total)
    for i in range(done, total):
        time.sleep(float(params.get("sleep", 0.1)))
        with open(done_file, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
        progress("steps", i + 1, total)
    return {"steps": total, "prompts_scored": int(params.get("prompts_scored", 0))}


POOL_SIZE = 237  # prompts a fake scoring job reports scored


def wait_job(params: dict, *, root: str, progress) -> dict:
    """Reports progress until the file ``<root>/../release/<name>`` exists (or 60 s pass)."""
    release = Path(root).parent / "release" / params["name"]
    deadline = time.monotonic() + float(params.get("timeout", 60))
    n = 0
    while not release.exists() and time.monotonic() < deadline:
        n += 1
        progress("waiting", n, n + 1)
        time.sleep(0.05)
    return {"prompts_scored": POOL_SIZE}


def instant_job(params: dict, *, root: str, progress) -> dict:
    """Succeeds at once with ``params['result']`` (a scoring job: the prompts it scored)."""
    progress("instant", 1, 1)
    return dict(params.get("result") or {"prompts_scored": POOL_SIZE})


def fail_job(params: dict, *, root: str, progress) -> dict:
    raise InvalidInputError("the test job refuses its input: fix the input")


def crash_job(params: dict, *, root: str, progress) -> dict:
    os._exit(7)


def curriculum_job(params: dict, *, root: str, progress) -> dict:
    """Writes one small parquet per stage under root and lists them as a curriculum result."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(root) / "store" / "curricula" / params["name"]
    out.mkdir(parents=True, exist_ok=True)
    stages = []
    for m in range(int(params["stages"])):
        path = out / f"stage{m}.parquet"
        pq.write_table(pa.table({"data_source": ["test"] * (m + 1), "prompt": [f"stage {m} q{i}" for i in range(m + 1)]}),
                       path)
        warned = [{"code": "filled_to_batch", "message": "stage 0 filled"}] if m == 0 else []
        change = {"ranking_change": {"prompts": 10, "spearman": 0.1 * m}} if m else {}
        stages.append({"index": m, "subset": str(path), "n_prompts": m + 1, "selection": {"warnings": warned, **change}})
        progress("stages", m + 1, int(params["stages"]))
    return {"stages": stages}
