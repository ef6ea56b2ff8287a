"""execgate's rules engine: the default policy (docs/DESIGN.md §5). Import from here.

Rules live in TOML files (schema in :mod:`execgate.policy_service.rules_toml` and
``examples/README.md``) or in OpenAI Codex ``.rules`` files
(:mod:`execgate.policy_service.codex_rules`, parsed, never executed). Each rule names a program
and an argv prefix and decides ``run`` (stay in the sandbox), ``escalate`` (run outside it, with
an execution), ``prompt`` (ask an approver; approval escalates) or ``deny``. The strictest
matching rule wins (deny > prompt > run > escalate); no match gets the configured default.
Basename rules that loosen (run, escalate) apply only to trusted program paths; rules that
tighten (prompt, deny) apply to every path (:mod:`execgate.policy_service.rules_engine`).

Typical use::

    store = RulesStore([DEFAULT_RULES_PATH, "/etc/execgate/rules.toml"])
    task = asyncio.create_task(store.watch(1.0))
    ev = store.current.evaluate("/usr/bin/git", ["git", "push", "origin", "main"])
    ev.decision, ev.rule.id   # "escalate", "git-network"
    ev.execution              # Execution("permissions", Permissions(network=True))

Modules: :mod:`.rules_model` (values), :mod:`.rules_toml` and :mod:`.codex_rules` (loaders),
:mod:`.rules_engine` (RuleSet), :mod:`.rules_store` (reloading).
"""

from __future__ import annotations

from .codex_rules import CODEX_DECISIONS, load_codex
from .rules_engine import DEFAULT_RULES_PATH, RuleSet
from .rules_model import DECISIONS, RESTRICTIVE, STRICTNESS, Evaluation, Rule, RulesError
from .rules_store import DEFAULT_RULES_NAME, RulesStore, describe_paths, layered_paths
from .rules_toml import load_toml

__all__ = [
    "CODEX_DECISIONS",
    "DECISIONS",
    "DEFAULT_RULES_NAME",
    "DEFAULT_RULES_PATH",
    "Evaluation",
    "RESTRICTIVE",
    "Rule",
    "RuleSet",
    "RulesError",
    "RulesStore",
    "STRICTNESS",
    "describe_paths",
    "layered_paths",
    "load_codex",
    "load_toml",
]
