"""Helpers for the Snakemake adapters in workflow/scripts: route logging to the rule's log."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

__all__ = ["log_to"]


@contextlib.contextmanager
def log_to(path: str) -> Iterator[logging.Logger]:
    """Send logging, warnings and any uncaught exception's traceback to the rule's log file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("a", encoding="utf-8", buffering=1) as log_file:
        handler = logging.StreamHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.getLogger("fontTools").setLevel(logging.WARNING)  # PDF font subsetting chatter
        logging.captureWarnings(True)
        try:
            yield logging.getLogger("servelab")
        except BaseException:
            log_file.write(traceback.format_exc())
            raise
        finally:
            root.removeHandler(handler)
            sys.stderr.flush()
