"""The wrapper under test: every test here runs against both execve wrappers, the Python reference
client (``execgate.wrapper.client``) and the native one (``execgate-wrapper-native``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from execgate.wrapper.artifacts import native_wrapper_path


@pytest.fixture(params=["python", "native"])
def wrapper_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def wrapper_path(wrapper_kind: str, tmp_path: Path) -> str:
    """Absolute path of an executable that behaves as ``EXEC_WRAPPER``."""
    if wrapper_kind == "native":
        return str(native_wrapper_path())
    if importlib.util.find_spec("execgate.wrapper.client") is None:
        pytest.skip("the Python reference wrapper (execgate.wrapper.client) is not in this tree")
    path = tmp_path / "execgate-wrapper"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom execgate.wrapper.client import main\nsys.exit(main())\n")
    path.chmod(0o755)
    return str(path)
