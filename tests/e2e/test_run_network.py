"""Network under ``execgate run --sandbox bwrap``: a client that stays in the sandbox cannot reach
an HTTP server on the host's loopback; escalated (network on, or unsandboxed), it fetches the page."""

from __future__ import annotations

import http.server
import os
import shutil
import threading

import pytest

from run_support import audit_records, execgate, write_rules

pytestmark = pytest.mark.e2e

BODY = b"hello from the host\n"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


#: program (the rule's basename), command. The Debian python3 by its path: a ``python3`` found on
#: PATH may be a pyenv shim under a root session's private HOME, a caller-writable tmpfs, whose
#: files no basename rule trusts (docs/DESIGN.md §5).
CLIENTS = {
    "curl": ("curl", "curl -sS --max-time 10 {url}"),
    "python": ("python3", "/usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' {url}"),
}
EXECUTIONS = {
    "run": 'decision = "run"',
    "network": 'decision = "escalate"\nexecution = { network = true }',
    "unsandboxed": 'decision = "escalate"\nexecution = "unsandboxed"',
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("how", sorted(EXECUTIONS))
def test_network_only_when_escalated(tmp_path, http_url, client, how):
    program, command = CLIENTS[client]
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    rules = write_rules(tmp_path / "rules.toml", f'[[rule]]\nid = "net"\nprogram = "{program}"\n{EXECUTIONS[how]}\n')
    log = tmp_path / "audit.jsonl"
    done = execgate("run", "--sandbox", "bwrap", "--rules", str(rules), "--audit-log", str(log),
                    "--cwd", str(tmp_path), "--", command.format(url=http_url) + '; echo "status=$?"')
    fetched = [r for r in audit_records(log) if os.path.basename(r["argv"][0]) == program]
    assert [(r["decision"], r["rule_id"]) for r in fetched] == [("run" if how == "run" else "escalate", "net")]
    if how == "run":
        assert BODY.decode() not in done.stdout
        assert "status=0" not in done.stdout, done.stderr
    else:
        assert done.stdout == BODY.decode() + "status=0\n", done.stderr
    assert done.returncode == 0
