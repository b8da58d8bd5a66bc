"""servelab: a workflow-orchestrated testbed for controlled comparisons of LLM serving engines."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servelab")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
