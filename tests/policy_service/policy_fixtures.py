"""Rules and fixtures shared by the policy service tests.

Not a ``conftest.py``: a second module named ``conftest`` would shadow ``tests/conftest.py`` for
tests that import helpers from it. Test modules import the fixtures they use from here.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import AsyncIterator

import pytest

from execgate.policy_service import rules as rules_api
from execgate.policy_service.server import PolicyServer, running_service

RULES = '''
[[rule]]
id = "echo-run"
program = "echo"
decision = "run"
justification = "echo is harmless"

[[rule]]
id = "env-escalate"
program = "env"
decision = "escalate"
justification = "env may print outside"
allow_env = ["LD_LIBRARY_PATH", "EXECGATE_KEEP_*"]

[[rule]]
id = "rm-deny"
program = "rm"
decision = "deny"
justification = "no deleting"

[[rule]]
id = "ls-prompt"
program = "ls"
decision = "prompt"
justification = "listing needs a look"
'''


@pytest.fixture
def rules_file(short_tmp: Path) -> Path:
    path = short_tmp / "rules.toml"
    path.write_text(RULES)
    return path


@pytest.fixture
def service(short_tmp: Path, rules_file: Path):
    """Factory: ``async with service(**running_service kwargs) as server`` on a Unix socket."""

    @contextlib.asynccontextmanager
    async def start(**kw) -> AsyncIterator[PolicyServer]:
        store = kw.pop("rules", None) or rules_api.RulesStore([rules_file])
        kw.setdefault("address", f"unix://{short_tmp / 'p.sock'}")
        async with running_service(store, **kw) as server:
            yield server

    return start


@pytest.fixture(autouse=True)
def release_grpc_objects():
    """Collect each test's grpc objects at once: their sockets close only when collected, and
    later tests (tests/server) count the process's open fds. Autouse where imported."""
    yield
    gc.collect()
