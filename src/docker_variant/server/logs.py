"""JSON log lines, one object per line on stderr."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

__all__ = ["JsonFormatter", "configure_logging", "log_fields"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line; request fields come in through ``extra={"fields": ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            text = self.formatException(record.exc_info)
            entry["error"] = text.splitlines()[-1]
            entry["traceback"] = text  # still one line: JSON escapes the newlines
        return json.dumps(entry, sort_keys=True)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Nothing here logs the thread or process: not looking them up is cheaper (the logging
    # HOWTO's "Optimization"); the caller's file and line: see log_fields.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # httpx logs every upstream request at INFO; the access log already has one line each
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))


def log_fields(logger: logging.Logger, level: int, message: str, fields: dict[str, Any]) -> None:
    """Log ``fields`` (one JSON object's keys) at ``level``, as ``logger.log`` would, less
    its look-up of the caller's file and line (nothing here logs them): on a line per
    request (the access log) that look-up was a third of the cost. Public API only
    (``makeRecord``, ``handle``), where the logging HOWTO sets a private name of the
    logging module."""
    if logger.isEnabledFor(level):
        record = logger.makeRecord(
            logger.name, level, "(unknown file)", 0, message, (), None, extra={"fields": fields}
        )
        logger.handle(record)
