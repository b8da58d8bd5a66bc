"""The live tier: runs against a real cluster only when `--kubeconfig` is given.

    pytest tests/live --kubeconfig ~/.kube/config [--kube-context CTX] [--live-deploy]

Without --kubeconfig every test here is skipped with a reason. Each session works in a fresh
namespace `servelab-live-<8 hex>`, deleted at the end (also after a failure). `--live-deploy`
additionally brings a real engine up on the GPU node in `--live-namespace` (default `servelab`,
which must already hold the hf-token Secret: the tests never read or copy it), runs one restart
and tears the engine down again; it takes several minutes of GPU time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("servelab live tier")
    group.addoption(
        "--kubeconfig", default=None, help="kubeconfig of a real cluster: enables tests/live"
    )
    group.addoption(
        "--kube-context", default=None, help="context in that kubeconfig (default: current)"
    )
    group.addoption(
        "--live-deploy",
        action="store_true",
        default=False,
        help="also deploy a real engine on the GPU node (minutes; needs the hf-token Secret)",
    )
    group.addoption(
        "--live-namespace",
        default="servelab",
        help="existing namespace with the hf-token Secret, used by --live-deploy",
    )


def _option(config: pytest.Config, name: str, default: object = None) -> object:
    try:
        return config.getoption(name)
    except ValueError:  # the option is registered only when tests/live is on the command line
        return default


@pytest.fixture(scope="session")
def kubeconfig(pytestconfig: pytest.Config) -> str:
    path = _option(pytestconfig, "--kubeconfig")
    if not path:
        pytest.skip("live tier: no --kubeconfig given (run: pytest tests/live --kubeconfig PATH)")
    return str(path)


@pytest.fixture(scope="session")
def live_settings(pytestconfig: pytest.Config, kubeconfig: str) -> Iterator[dict]:
    """Settings for a fresh namespace, created here and deleted at the end of the session."""
    from kubernetes import client
    from kubernetes import config as kconfig

    context = _option(pytestconfig, "--kube-context")
    api = kconfig.new_client_from_config(config_file=kubeconfig, context=context)
    core = client.CoreV1Api(api)
    namespace = f"servelab-live-{uuid.uuid4().hex[:8]}"
    core.create_namespace(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {
                    "app.kubernetes.io/part-of": "servelab",
                    "servelab.dev/live-test": "true",
                },
            },
        }
    )
    try:
        yield {
            "kubeconfig": kubeconfig,
            "context": context,
            "namespace": namespace,
            "run_label": "live-test",
            "timeouts": {"ready_s": 2400, "delete_s": 300, "poll_s": 5, "request_s": 30},
        }
    finally:
        core.delete_namespace(namespace, propagation_policy="Foreground")


@pytest.fixture(scope="session")
def deploy_settings(pytestconfig: pytest.Config, kubeconfig: str) -> dict:
    """Settings for --live-deploy: the existing namespace that holds the token Secret."""
    if not _option(pytestconfig, "--live-deploy", False):
        pytest.skip("live tier: engine deployment not requested (--live-deploy)")
    return {
        "kubeconfig": kubeconfig,
        "context": _option(pytestconfig, "--kube-context"),
        "namespace": _option(pytestconfig, "--live-namespace", "servelab"),
        "run_label": "live-test",
        "timeouts": {"ready_s": 2400, "delete_s": 300, "poll_s": 5, "request_s": 30},
    }
