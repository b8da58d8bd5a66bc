"""Shared fixtures: the repository root and the study configuration."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def _study_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.fixture
def study_config(_study_config: dict) -> dict:
    """A fresh, mutable copy of config/config.yaml."""
    return copy.deepcopy(_study_config)
