"""The stdlib-only runner that waits inside every sandbox (see `_runner.py`)."""

from pathlib import Path

RUNNER_PATH = Path(__file__).with_name("_runner.py")
"""The runner program; sandboxes run it with their own interpreter."""
