"""RulesStore: reload keeps the last good rules, watch() and SIGHUP pick up good changes."""

from __future__ import annotations

import logging
import os
import signal

import anyio
import pytest

from execgate.policy_service.rules import RulesError, RulesStore

RUN = '[[rule]]\nid = "make"\nprogram = "make"\ndecision = "run"\nmatch = ["make"]\n'
DENY = RUN.replace('"run"', '"deny"')
BAD = RUN + 'match = ["cmake"]\n'  # duplicate key: TOML error


def _decide(store: RulesStore) -> str:
    return store.current.evaluate("/usr/bin/make", ["make", "all"]).decision


def _write(path, text: str) -> None:
    """Replace the file's content and make sure its mtime changes even on coarse clocks."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_store_loads_now_and_raises_on_bad_files(tmp_path):
    (tmp_path / "bad.toml").write_text(BAD)
    with pytest.raises(RulesError, match="bad.toml"):
        RulesStore([tmp_path / "bad.toml"])
    (tmp_path / "r.toml").write_text(RUN)
    assert _decide(RulesStore(tmp_path / "r.toml")) == "run"


def test_reload_keeps_last_good_rules_and_picks_up_good_change(tmp_path, caplog):
    path = tmp_path / "r.toml"
    path.write_text(RUN)
    store = RulesStore([path])
    _write(path, BAD)
    with caplog.at_level(logging.ERROR):
        assert store.reload() is False
    assert _decide(store) == "run"
    assert "keeping the last good rules" in caplog.text and "r.toml" in caplog.text
    path.unlink()
    assert store.reload() is False
    assert _decide(store) == "run"
    _write(path, DENY)
    assert store.reload() is True
    assert _decide(store) == "deny"
    assert store.generation == 2


async def _wait_for(store: RulesStore, decision: str) -> None:
    with anyio.fail_after(10):
        while _decide(store) != decision:
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_watch_reloads_on_change_and_ignores_bad_files(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(RUN)
    store = RulesStore([path])
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.watch, 0.01)
        _write(path, DENY)
        await _wait_for(store, "deny")
        _write(path, BAD)
        generation = store.generation
        await anyio.sleep(0.1)  # many polls: the bad file must not replace the good rules
        assert _decide(store) == "deny" and store.generation == generation
        _write(path, RUN)
        await _wait_for(store, "run")
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_watch_sees_new_files_in_a_directory(tmp_path):
    (tmp_path / "a.toml").write_text(RUN)
    store = RulesStore(tmp_path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.watch, 0.01)
        (tmp_path / "b.toml").write_text(DENY.replace('"make"', '"make2"', 1))
        await _wait_for(store, "deny")
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_sighup_reloads(tmp_path):
    import asyncio

    path = tmp_path / "r.toml"
    path.write_text(RUN)
    store = RulesStore([path])
    loop = asyncio.get_running_loop()
    store.install_sighup(loop)
    try:
        _write(path, DENY)
        os.kill(os.getpid(), signal.SIGHUP)
        await _wait_for(store, "deny")
    finally:
        store.remove_sighup(loop)
