"""Escalation server: wire protocol, fd passing, sessions, escalated spawning, CLI."""
