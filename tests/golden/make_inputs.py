"""Write the golden case's prompt files (run once; the files are committed).

40 arithmetic problems of the pool's mixture, split so that every set holds prompts the
shipped model gets right some of the time (mixed rewards: signal), as measured once with
the golden case's collection settings: pool 16, val_a 6 and val_b 6 prompts."""
from pathlib import Path

from cropi.data import write_jsonl
from cropi.tasks.arithmetic import make_task_splits

here = Path(__file__).parent
MIXED = {"651c497727db101d", "30012126e8652f18", "af1ea3f53f8bed2e", "40a2e70c2f43b418", "e003c9c850f4b55f",
         "aec64f24238e131b", "2264d6581b8c5820"}
rows = make_task_splits(seed=7, pool_size=40, val_size=1, test_size=1)["pool"]
mixed = [r for r in rows if r.prompt_id in MIXED]
flat = [r for r in rows if r.prompt_id not in MIXED]
write_jsonl(mixed[:3] + flat[:13], str(here / "pool.jsonl"))
write_jsonl(mixed[3:5] + flat[13:17], str(here / "val_a.jsonl"))
write_jsonl(mixed[5:7] + flat[17:21], str(here / "val_b.jsonl"))
