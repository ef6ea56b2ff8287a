"""Escalation server: wire protocol, fd passing, sessions, escalated spawning, CLI.

This package re-exports nothing on purpose: the per-exec wrapper imports
:mod:`execgate.server.protocol` and :mod:`execgate.server.fdpass`, and importing the package must
not pull in asyncio. Import the API from :mod:`execgate.server.escalate_server`.
"""
