"""A scratch working directory with a tiny grid, for running the real workflow on the sim backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from campaigns import Workdir, study_config, tiny_config


@pytest.fixture
def workdir(tmp_path: Path) -> Workdir:
    return Workdir(tmp_path, tiny_config(study_config()))
