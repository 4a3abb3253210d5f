"""The README's pipeline and service examples run as written.

Every fenced ``cropi`` and ``curl`` line of the README's "The pipeline" and "The service"
sections is read from the README itself and run, in order, against real processes: the
`cropi` console script of this environment and a real `cropi serve`. Only what a reader fills in
for their own machine is replaced: the checkpoint (``CKPT``, ``CKPT2``: the golden case's tiny
model), the data root (``/data``), the port (``8000``: a free one), and the ``<...>`` ids each
earlier answer gave. Each command must exit 0; each ``curl`` must get a 2xx answer; a ``cropi
serve`` must answer ``/healthz``. The examples collect with vLLM as written: needs vLLM (its CPU
build here) and minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.golden import GOLDEN, MODEL
from support.service import wait_until
from support.service_e2e import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
httpx = pytest.importorskip("httpx")

SECTIONS = ("The pipeline", "The service")
PROMPTS = {"pool": "pool", "gsm8k": "val_a", "math": "val_b"}  # the README's prompt files <- the golden case's
CROPI = str(Path(sys.executable).with_name("cropi"))  # this environment's console script, as a reader runs it


def readme_examples(section: str) -> list[str]:
    """The ``cropi`` and ``curl`` lines of the fenced blocks in one ``## `` section, in order."""
    text = (REPO / "README.md").read_text()
    found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert found, f"README.md has no section '## {section}'"
    blocks = re.findall(r"^```\w*\n(.*?)^```", found.group(1), re.S | re.M)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip().startswith(("cropi ", "curl "))]


def test_the_readme_sections_hold_the_examples_this_test_runs():
    """The extraction itself: if the README's layout changed, this says so instead of running nothing."""
    pipeline, service = (readme_examples(s) for s in SECTIONS)
    assert [c.split()[1] for c in pipeline] == ["collect"] * 3 + ["gradients"] * 3 + ["rank", "refresh", "serve"]
    assert service[0].startswith("cropi serve") and sum(c.startswith("curl ") for c in service) == 7
    # every POST says its body is JSON (curl's -d alone sends a form type, which the service answers 422)
    assert all("Content-Type: application/json" in c for c in service if "-d " in c)


@pytest.fixture
def place(tmp_path):
    """The reader's machine: the README's prompt files and checkpoints in one folder, the data root."""
    import pyarrow.parquet as pq

    from cropi.data import load_prompts, write_parquet

    data = tmp_path / "data"
    data.mkdir()
    for name, golden in PROMPTS.items():
        write_parquet(load_prompts(str(GOLDEN / f"{golden}.jsonl")), str(data / f"{name}.parquet"))
        assert pq.read_table(data / f"{name}.parquet").num_rows > 0
    for ckpt in ("ckpt", "ckpt2"):
        shutil.copytree(MODEL, data / ckpt)
    return data


def fit(command: str, data: Path, port: int, ids: dict[str, str]) -> list[str]:
    """The README's line with the reader's own values filled in, as argv."""
    command = re.sub(r"\bCKPT_NAME\b", "ckpt", command)  # the gradients' default name: the folder's
    command = re.sub(r"\bCKPT2\b", "ckpt2", command)
    command = re.sub(r"\bCKPT\b", "ckpt", command)
    command = re.sub(r"(?<![\w./])/data(?=[/\s'\"]|$)", str(data), command)
    command = command.replace("localhost:8000", f"127.0.0.1:{port}")
    for placeholder, value in ids.items():
        command = command.replace(f"<{placeholder}>", value)
    assert "<" not in command, f"a README placeholder this test cannot fill: {command}"
    argv = shlex.split(command, comments=True)
    if argv[:2] == ["cropi", "serve"]:
        argv += ["--port", str(port)]  # the README's default port may be taken on a shared machine
    return [CROPI, *argv[1:]] if argv[0] == "cropi" else argv


def run_command(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def curl(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run a README curl as written, plus flags that only report: no progress meter, the status last."""
    proc = run_command([*argv, "--silent", "--show-error", "--write-out", "\n%{http_code}"], cwd)
    body, _, status = proc.stdout.rpartition("\n")
    return int(status), body


class Serve:
    """A README ``cropi serve`` line run as a server, until the block's examples are done."""

    def __init__(self, argv: list[str], cwd: Path, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.log = cwd / f"serve-{port}.log"
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)

    def healthy(self) -> bool:
        assert self.proc.poll() is None, f"cropi serve exited: {self.log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def test_the_pipeline_examples_run_as_written(place):
    port = free_port()
    servers = []
    try:
        for line in readme_examples("The pipeline"):
            argv = fit(line, place, port, {})
            if argv[1] == "serve":
                servers.append(Serve(argv, place, port))
                wait_until(servers[-1].healthy, 60, "the README's `cropi serve` to answer /healthz")
                continue
            run_command(argv, place)
    finally:
        for s in servers:
            s.stop()
    ranking = json.loads(run_command(fit("cropi rank --store runs/store --name CKPT_NAME --pool pool --validation "
                                         "gsm8k,math --json", place, port, {}), place).stdout.splitlines()[-1])
    assert ranking["rows"], "the pipeline's examples ranked nothing"
    assert servers, "the pipeline section starts the service"


def test_the_service_examples_run_as_written(place):
    port = free_port()
    ids: dict[str, str] = {}
    lines = readme_examples("The service")
    server = Serve(fit(lines[0], place, port, ids), place, port)
    try:
        wait_until(server.healthy, 60, "the README's `cropi serve` to answer /healthz")
        for line in lines[1:]:
            if "<checkpoint id>/ranking" in line:  # the reader polls the job (the line before) until it is done
                wait_until(lambda: httpx.get(f"{server.url}/v1/jobs/{ids['job id']}").json()["state"]
                           in ("succeeded", "failed", "cancelled"), 900, "the scoring job")
                job = httpx.get(f"{server.url}/v1/jobs/{ids['job id']}").json()
                assert job["state"] == "succeeded", job
            status, body = curl(fit(line, place, port, ids), place)
            assert 200 <= status < 300, f"{line}\n-> {status} {body[-2000:]}"
            answer = json.loads(body) if body.startswith("{") else {}
            if "/v1/datasets" in line:
                ids[f"{json.loads(line.split(' -d ', 1)[1].strip(chr(39)))['name']} id"] = answer["id"]
            elif "/v1/checkpoints -H" in line:
                ids["checkpoint id"], ids["job id"] = answer["id"], answer["job_id"]
            elif "/ranking" in line:
                assert answer["items"], answer
                ids["prompt id"] = answer["items"][0]["prompt_id"]
        import pyarrow as pa

        record = pa.ipc.open_stream(pa.OSFile(str(place / "record.arrow"))).read_all()  # the -o of the last example
        assert record.num_rows == 1 and record["prompt_id"][0].as_py() == ids["prompt id"]
    finally:
        server.stop()
