"""Service configuration (pydantic-settings: arguments, or ``CROPI_SERVICE_*`` environment variables)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cropi.pipeline.requests import store_path

from .errors import ServiceConfigError

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class ServiceSettings(BaseSettings):
    """Everything the service needs to know at start.

    ``root`` holds the service state (``root/service/``: SQLite job table, worker logs) and the
    library's store (``root/store``). ``data_roots`` are the only directories callers' paths may
    point into; they default to ``[root]``.
    """

    model_config = SettingsConfigDict(env_prefix="CROPI_SERVICE_", extra="forbid")

    root: Path
    data_roots: list[Path] = Field(default_factory=list)
    token: str | None = Field(default=None, repr=False)
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    ray_address: str | None = None
    ray_num_gpus: float = Field(default=0.0, ge=0, description="GPUs each Ray job task asks for")
    workers: int = Field(default=1, ge=0, description="local worker processes (0: leave jobs to external workers)")
    runner_name: str = Field(default="service", description="owner name of the jobs this process runs")
    max_attempts: int = Field(default=3, ge=1, description="starts of one job before it is marked failed")
    heartbeat_s: float = Field(default=2.0, gt=0)
    stale_after_s: float = Field(default=30.0, gt=0, description="a running job whose runner was silent this long is requeued")
    poll_s: float = Field(default=0.2, gt=0)
    version_ttl_s: float = Field(default=1.0, ge=0, description="how long a stored file's version stamp is "
                                 "trusted before the file is looked at again (0: every request)")
    fast_path: bool = Field(default=True, description="answer ranking pages and single gradient lookups whose "
                            "stored result is already loaded and fresh without the FastAPI request machinery "
                            "(same bodies; anything else goes through the full route). A read whose version "
                            "stamp is due for a look (version_ttl_s) takes the full route, so with "
                            "version_ttl_s=0 none is fast")
    render_cache_mb: float = Field(default=64.0, ge=0, description="memory for rendered JSON gradient records, "
                                   "all splits together (0: render every request)")
    # 768: a 1M-prompt order encoded is 162 MB; the serving benchmark pages through four (three
    # checkpoints' fused orders and one validation set's) at random offsets
    ranking_cache_mb: float = Field(default=768.0, ge=0, description="memory for ranking pages encoded as "
                                    "JSON, all checkpoints and orders together (an order is encoded at its "
                                    "first page, a million rows at a time, about 170 bytes a row). Give it room "
                                    "for the orders callers page through: an order that does not fit is "
                                    "encoded again for every page (0: always)")
    # 256: with 512 here and every ranking order encoded whole (before ranking_cache_mb) the server
    # measured 2,065 MB at 1M prompts x 3 checkpoints (benchmarks/results/service_1m_reduced.json)
    gradient_cache_mb: float = Field(default=256.0, ge=0, description="memory for verified record batches of "
                                     "stored gradients, all splits together (a lookup reads the 256 KB batch "
                                     "holding its prompt)")
    max_response_mb: float = Field(default=64.0, gt=0, description="largest gradients response (JSON or Arrow, "
                                   "estimated before anything is read); a larger batch is refused with 413 "
                                   "saying how many ids fit")
    # 1: a batch is made mostly in Python under the GIL, so batches made side by side only contend (with
    # each other and with the event loop). 60 clients sending 3k-id Arrow batches at k=2048, two runs
    # each on a loaded 2-core machine: /healthz p99 90-164 ms and 69-104 batches served with 1, against
    # 300-760 ms and 32-61 with 4 (benchmarks/service_bounds.py --server-env CROPI_SERVICE_HEAVY_REQUESTS=N)
    heavy_requests: int = Field(default=1, ge=1, description="gradient batches made at once; more wait their "
                                "turn (at most heavy_wait_s, then 429). A waiting batch holds no request thread")
    heavy_wait_s: float = Field(default=10.0, ge=0, description="how long a gradient batch waits for its turn")
    heavy_queue: int = Field(default=64, ge=0, description="gradient batches waiting for their turn at once; "
                             "past it a batch is answered 429 with Retry-After at once (each waiting batch "
                             "holds its request body, up to max_body_bytes)")
    # 1024 / 256: at the benchmark's 100k prompts x k=2048, a 10k-id Arrow batch is 41 MB, so one caller
    # holds at most six unread ones and four such callers fill the server (benchmarks/service_bounds.py)
    answer_memory_mb: float = Field(default=1024.0, gt=0, description="memory for answers made and not yet "
                                    "handed to the network, all callers together. An answer counts until its "
                                    "last byte is written to its connection or the connection is gone (a "
                                    "gradient batch from before it is made, at its size bound); past it new "
                                    "requests are answered 503 with Retry-After")
    answer_memory_mb_per_caller: float = Field(default=256.0, gt=0, description="the same for one caller "
                                               "(token; without tokens every caller is one); past it that "
                                               "caller's requests are answered 429 with Retry-After")
    max_connections: int = Field(default=1000, ge=1, description="open HTTP connections; a connection past it "
                                 "gets 503 with Retry-After to its first request and is closed (cropi serve "
                                 "only: the server's protocol counts them)")
    stall_timeout_s: float = Field(default=30.0, gt=0, description="a connection whose client neither reads "
                                   "its answer nor sends its request for this long is closed, and the answer's "
                                   "memory freed (a request body that stops arriving: 408)")
    idle_timeout_s: float = Field(default=5.0, gt=0, description="a kept-alive connection with no request for "
                                  "this long is closed")
    # 0.5: the request threads making batches hold the GIL in Python steps; at CPython's 5 ms the event
    # loop, which answers /healthz, waited for it 80 ms at the median beside four busy threads, 21 ms at 0.5
    switch_interval_ms: float = Field(default=0.5, gt=0, description="how often a thread holding the GIL hands "
                                      "it over (sys.setswitchinterval; cropi serve only): shorter keeps the "
                                      "event loop, and with it health checks and the hot reads, answering "
                                      "while request threads compute")
    # True: a full pass of the cyclic garbage collector holds the GIL while it walks every tracked object,
    # about 85k after startup: 60-90 ms for each, in whichever thread triggers it (making a 10k-id batch
    # does, a few times a minute), and the event loop, with /healthz, waits it out. Frozen, the startup
    # objects are never walked again; a full pass over the rest took 2-4 ms (issue 31)
    freeze_startup_heap: bool = Field(default=True, description="move every object that exists when the "
                                      "server starts to the collector's permanent generation (gc.freeze; "
                                      "cropi serve only), so its full passes walk only what came later")
    max_queued_per_caller: int = Field(default=16, ge=1, description="queued jobs one caller (token) may have; "
                                       "past it a submission is answered 429 with Retry-After")
    max_queued: int = Field(default=256, ge=1, description="queued jobs in all; past it, 429 with Retry-After")
    max_registrations: int = Field(default=2, ge=1, description="dataset registrations (each reads its prompt "
                                   "file) in progress at once; more are answered 429 at once")
    max_datasets: int = Field(default=1000, ge=1, description="datasets registered at once; past it a "
                              "registration is refused (409 registry_full) until some are removed with "
                              "DELETE /v1/datasets/{id}")
    max_checkpoints: int = Field(default=10000, ge=1, description="checkpoints registered at once; past it a "
                                 "registration is refused (409 registry_full) until some are removed with "
                                 "DELETE /v1/checkpoints/{id} (their stored results stay)")
    # 512: a ranking loaded is about 60 bytes a prompt with two validation sets (6.0 MB at 100k prompts,
    # benchmarks/results/service_bounds.json), so 85 of them at 100k, 8 at 1M
    ranking_views_mb: float = Field(default=512.0, ge=0, description="memory for loaded rankings (each "
                                    "checkpoint's ranked table, read at its first page), all checkpoints "
                                    "together, least recently used dropped first. A ranking larger than it is "
                                    "read from the store for every page")
    # 128: a loaded split is its key index, 16 bytes a prompt (16 MB at 1M prompts)
    gradient_views_mb: float = Field(default=128.0, ge=0, description="memory for loaded gradient splits "
                                     "(their key index, 16 bytes a prompt), all checkpoints together, least "
                                     "recently used dropped first. A split larger than it is indexed again "
                                     "for every request")
    # Extra or replacement job kinds: kind -> "module:function". For plugins and tests.
    job_kinds: dict[str, str] = Field(default_factory=dict)

    @field_validator("root", mode="after")
    @classmethod
    def _absolute_root(cls, v: Path) -> Path:
        return Path(os.path.realpath(v))

    @field_validator("token", mode="after")
    @classmethod
    def _nonempty_token(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("the token is empty: put a long random string in the token file")
        return v.strip() if v is not None else None

    @model_validator(mode="after")
    def _answer_bounds(self) -> "ServiceSettings":
        if not self.max_response_mb <= self.answer_memory_mb_per_caller <= self.answer_memory_mb:
            raise ValueError(f"need max_response_mb ({self.max_response_mb:g}) <= answer_memory_mb_per_caller "
                             f"({self.answer_memory_mb_per_caller:g}) <= answer_memory_mb "
                             f"({self.answer_memory_mb:g}): otherwise a legal answer could never be made")
        return self

    @model_validator(mode="after")
    def _default_roots(self) -> "ServiceSettings":
        roots = self.data_roots or [self.root]
        self.data_roots = [Path(os.path.realpath(r)) for r in roots]
        return self

    @property
    def tokens(self) -> list[str]:
        """The accepted tokens: one per line of the token (each line is one caller)."""
        return [t.strip() for t in (self.token or "").splitlines() if t.strip()]

    @property
    def state_dir(self) -> Path:
        """Where the service keeps its own files."""
        return self.root / "service"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "jobs.sqlite"

    @property
    def store(self) -> Path:
        """The library's store under ``root`` (gradients, rankings, curriculum stages)."""
        return Path(store_path(self.root))

    def check_bind(self) -> None:
        """Refuse to listen beyond loopback without a token."""
        if self.token is None and self.host not in LOOPBACK_HOSTS:
            raise ServiceConfigError(
                f"refusing to bind {self.host!r} without a token: anyone who can reach the port could "
                "read your data and start jobs. Pass --token-file FILE (a long random string), "
                "or bind 127.0.0.1.")


def read_token_file(path: str | os.PathLike) -> str:
    """The token in ``path`` (surrounding whitespace dropped)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ServiceConfigError(f"cannot read the token file {path}: {e.strerror}; create it "
                                 "(for example `openssl rand -hex 32 > token`)") from e
    if not text.strip():
        raise ServiceConfigError(f"the token file {path} is empty: put a long random string in it")
    return text.strip()
