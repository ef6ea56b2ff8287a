"""``execgate run --metrics`` as a real process: its ``/metrics`` (the policy client's and the embedded
service's counters on one page) scraped over HTTP while the script waits on a FIFO, the counts
equal to the audit log's; traces exported over OTLP (``OTEL_EXPORTER_OTLP_ENDPOINT``) to a real
receiver; a non-loopback ``--metrics`` refused."""

from __future__ import annotations

import collections
import os
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otlp_support import otlp_receiver
from run_support import CLI, audit_records, execgate

pytestmark = pytest.mark.e2e


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counts(page: dict, name: str) -> dict[tuple[str, ...], float]:
    """The non-zero samples of ``name``: label values (in label-name order) → value."""
    return {tuple(v for k, v in labels): value for (n, labels), value in page.items() if n == name and value}


def test_run_metrics_scraped_while_the_script_waits(tmp_path):
    fifo, log = tmp_path / "go", tmp_path / "audit.jsonl"
    os.mkfifo(fifo)
    script = f'/bin/true; chroot / true; read line < {fifo}; echo "got $line"'
    with otlp_receiver() as (receiver, endpoint):
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        proc = subprocess.Popen([*CLI, "run", "-q", "--sandbox", "none", "--metrics", "127.0.0.1:0",
                                 "--audit-log", str(log), "--cwd", str(tmp_path), "--", script],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            url = None
            while url is None:
                line = proc.stderr.readline()
                assert line, "execgate run ended before printing its metrics address"
                if line.startswith("execgate: metrics: "):
                    url = line.split(": ", 2)[2].strip()
            # The script now blocks in `read` (a builtin: no exec) until the FIFO is opened.
            while not (log.exists() and len(log.read_text().splitlines()) >= 2):  # true and chroot decided
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.05)
            page = scrape(url)
            with open(fifo, "w") as writer:
                writer.write("go\n")
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert out == "got go\n"
        audited = audit_records(log)
    by_rule = collections.Counter((r["decision"], r["rule_id"]) for r in audited)
    by_outcome = collections.Counter(r["decision"] for r in audited)
    assert by_rule[("deny", "privilege-tools")] == 1
    assert counts(page, "execgate_decisions_total") == {k: float(v) for k, v in by_rule.items()}
    assert counts(page, "execgate_policy_decisions_total") == {(k,): float(v) for k, v in by_outcome.items()}
    assert counts(page, "execgate_policy_failures_total") == {}
    assert counts(page, "execgate_decision_errors_total") == {}
    # Spans were exported at exit, one per decision on each side, with the audit log's ids.
    ids = sorted(r["decision_id"] for r in audited)
    assert sorted(a["execgate.decision_id"] for a in receiver.named("execgate.policy.decide")) == ids
    assert sorted(a["execgate.decision_id"] for a in receiver.named("execgate.server.decide")) == ids


@pytest.mark.parametrize("address", ["0.0.0.0:0", "192.0.2.1:9464"])
def test_run_refuses_metrics_beyond_loopback(tmp_path, address):
    done = execgate("run", "-q", "--sandbox", "none", "--metrics", address, "--cwd", str(tmp_path), "--", "true")
    assert done.returncode == 2
    assert f"--metrics {address}: not a loopback address" in done.stderr
