"""Non-UTF-8 bytes through the whole gRPC path: the policy sees them as ``\\xNN`` text (proto strings
must be UTF-8), a Run keeps the caller's bytes, and an escalated command gets the exact bytes back."""

from __future__ import annotations

import pytest

from run_support import audit_records, execgate, write_rules

pytestmark = pytest.mark.e2e

# By absolute path: a root session with --sandbox none can rewrite /usr/bin itself, so no
# basename rule trusts what it runs (docs/DESIGN.md §5).
RULES = """
[[rule]]
id = "od-escalates"
program = "/usr/bin/od"
decision = "escalate"
execution = "unsandboxed"
match = ["/usr/bin/od -c"]
"""


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_non_utf8_arguments_run_and_escalate_with_exact_bytes(tmp_path, wrapper):
    rules = write_rules(tmp_path / "rules.toml", RULES)
    log = tmp_path / "audit.jsonl"
    script = (
        "/usr/bin/printf '%s' $'caf\\351' > run.out; echo \"run=$?\"; "
        "/usr/bin/od -An -c $'caf\\351'-missing 2>/dev/null; echo \"escalated-missing=$?\"; "
        "printf 'x' > $'in\\351'; /usr/bin/od -An -tx1 $'in\\351'; echo \"escalated=$?\""
    )
    done = execgate("run", "-q", "--sandbox", "none", "--wrapper", wrapper, "--rules", str(rules),
                    "--audit-log", str(log), "--cwd", str(tmp_path), "--", script)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run.out").read_bytes() == b"caf\xe9"
    # od was escalated and opened the file named with the exact byte 0xE9 (it holds "x" = 78).
    assert done.stdout.split("\n") == ["run=0", "escalated-missing=1", " 78", "escalated=0", ""]
    records = audit_records(log)
    assert ["/usr/bin/printf", "%s", "caf\\xe9"] in [r["argv"] for r in records]
    escalated = [r for r in records if r["decision"] == "escalate"]
    assert [r["argv"] for r in escalated] == [["/usr/bin/od", "-An", "-c", "caf\\xe9-missing"], ["/usr/bin/od", "-An", "-tx1", "in\\xe9"]]
    assert not any(r["error"] for r in records)
