"""Fixtures for the policy service tests: rules files and a real service on a Unix socket."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

import pytest

from execgate.policy_service.server import PolicyServer, running_service

try:  # the real engine once branch `rules` is merged into main
    from execgate.policy_service import rules as rules_api
except ImportError:  # pragma: no cover - TEMPORARY, see _rules_standin.py
    import _rules_standin as rules_api  # type: ignore[no-redef]

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
