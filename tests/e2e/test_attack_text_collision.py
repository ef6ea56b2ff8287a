"""Attack: bytes that are not UTF-8 reach the policy as ``\\xNN`` text (server/wiretext.py), so the
byte 0xff and the four characters ``\\xff`` read the same there. The answer of
PrepareEscalatedExec is mapped back to the caller's bytes by value: with both forms in one
request (the literal in the working directory and an argument, the byte in an unrelated variable
and another argument), an escalated command started in the byte-named directory — one the
policy never judged — and got the byte form for both arguments (red-team finding, 2026-12-02).
Such a request is now refused; a request with only one of the forms runs with its exact bytes.
Both policy paths: the in-process service and the gRPC one (``--cache-ttl``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("mode", [(), ("--cache-ttl", "60")], ids=["inprocess", "grpc"])
def test_an_escalation_naming_a_byte_and_its_text_twin_is_refused(tmp_path: Path, mode: tuple[str, ...]) -> None:
    esc, out = tmp_path / "esc", tmp_path / "esc.out"
    esc.write_text(f'#!/bin/sh\n{{ pwd; for a in "$@"; do printf "%s" "$a" | od -An -c; done; }} >> {out}\n')
    esc.chmod(0o755)
    (tmp_path / "rules.toml").write_text(f'[[rule]]\nid = "esc"\nprogram = "{esc}"\ndecision = "escalate"\n'
                                         'justification = "runs outside"\n')
    (tmp_path / "d\\xff").mkdir()
    (tmp_path / "d\\xff").chmod(0o755)
    os.mkdir(bytes(tmp_path) + b"/d\xff")
    twin = f"ZZ=$'{tmp_path}/d\\xff'"
    script = (f"cd '{tmp_path}/d\\xff' && {twin} {esc} 'lit\\xff' $'lit\\xff'; echo both=$?; "
              f"{esc} 'lit\\xff'; echo text=$?; {esc} $'lit\\xff'; echo byte=$?")
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none", *mode,
                           "--rules", str(tmp_path / "rules.toml"), "--cwd", str(tmp_path), "--", script],
                          capture_output=True, text=True, timeout=120, check=False)
    text = done.stdout + done.stderr
    assert "both=1" in done.stdout and "names two different byte strings" in done.stderr, text
    assert "text=0" in done.stdout and "byte=0" in done.stdout, text
    runs = out.read_bytes().decode("latin-1").split("\n")
    # Two runs, each in the literal directory, each with its exact argument.
    assert runs[0] == f"{tmp_path}/d\\xff" and "l   i   t   \\   x   f   f" in runs[1], runs
    assert runs[2] == f"{tmp_path}/d\\xff" and "l   i   t 377" in runs[3], runs
