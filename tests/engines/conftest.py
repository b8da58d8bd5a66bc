"""Fixtures the engines tier's modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import llama_server


@pytest.fixture(scope="module")
def llama(llama_server_program: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on the shared tiny model (GGUF), one per module that asks; yields its URL."""
    with llama_server(llama_server_program, tmp_path_factory.mktemp("llama-wire")) as url:
        yield url
