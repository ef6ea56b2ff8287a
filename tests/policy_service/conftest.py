"""Fixtures for the policy service tests: rules files and a real service on a Unix socket."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

import pytest

from execgate.policy_service.server import PolicyServer, running_service

from policy_fixtures import RULES, rules_api


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
