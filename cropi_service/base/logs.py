"""Structured logs: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time

# LogRecord attributes that are not caller-supplied ``extra`` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", ...extra}``; exceptions under ``"exc"``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: int | str = logging.INFO) -> None:
    """Send the root logger (and uvicorn's) to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # the service logs each request itself, with route and latency
    logging.getLogger("uvicorn.access").disabled = True
