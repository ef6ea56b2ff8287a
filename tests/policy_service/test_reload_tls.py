"""Rules reload through a running service, and TLS over TCP with a bearer token."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from execgate.policy_service.transport import TlsFiles
from execgate.server.grpc_policy import GrpcPolicy
from execgate.server.policy import SessionContext
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

from policy_fixtures import RULES, rules_api, rules_file, release_grpc_objects, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio

REQUEST = pb.DetermineActionRequest(
    session=pb.SessionContext(session_id="s"),
    target=pb.ExecTarget(program="/usr/bin/echo", argv=["echo", "hi"], workdir="/tmp"),
)


async def action(stub: policy_pb2_grpc.EscalationPolicyStub, **kw) -> str:
    return (await stub.DetermineAction(REQUEST, timeout=5, **kw)).decision.WhichOneof("action")


async def test_reload_good_and_bad_rules(service, rules_file: Path) -> None:
    store = rules_api.RulesStore([rules_file])
    async with service(rules=store, rules_poll_s=0.05) as server, grpc.aio.insecure_channel(server.addresses[0]) as ch:
        stub = policy_pb2_grpc.EscalationPolicyStub(ch)
        assert await action(stub) == "run"

        rules_file.write_text(RULES.replace('id = "echo-run"\nprogram = "echo"\ndecision = "run"',
                                            'id = "echo-run"\nprogram = "echo"\ndecision = "deny"'))
        os.utime(rules_file, ns=(1, 10**18))  # a distinct mtime even on coarse-grained filesystems
        for _ in range(100):
            if await action(stub) == "deny":
                break
            await asyncio.sleep(0.05)
        assert await action(stub) == "deny"

        rules_file.write_text('[[rule]]\nid = "x"\nprogram = "echo"\ndecision = "sometimes"\n')
        os.utime(rules_file, ns=(1, 2 * 10**18))
        await asyncio.sleep(0.5)  # ten polls: the broken file was seen and rejected
        assert await action(stub) == "deny"  # the last good rules still decide
        assert store.reload() is False


def make_cert(directory: Path) -> TlsFiles:
    """A self-signed certificate for 127.0.0.1 (it is its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "execgate-test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return TlsFiles(str(directory / "cert.pem"), str(directory / "key.pem"))


async def test_tls_and_token(service, short_tmp: Path) -> None:
    tls = make_cert(short_tmp)
    async with service(address="127.0.0.1:0", tls=tls, token="s3cret") as server:
        address = server.addresses[0]
        assert address.startswith("127.0.0.1:") and not address.endswith(":0")
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls.cert).read_bytes())
        async with grpc.aio.secure_channel(address, creds) as channel:
            stub = policy_pb2_grpc.EscalationPolicyStub(channel)
            for metadata, words in (((), "missing"), ((("authorization", "Bearer nope"),), "wrong")):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await action(stub, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and words in info.value.details()
            assert await action(stub, metadata=(("authorization", "Bearer s3cret"),)) == "run"
            # Health checks need no token.
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        # The escalation server's client, over TLS with the token (and with a wrong one).
        good = GrpcPolicy(address, tls=creds, token="s3cret", timeout_s=2)
        bad = GrpcPolicy(address, tls=creds, token="guess", timeout_s=2)
        session = SessionContext("s")
        ok = await good.determine_action("/usr/bin/echo", ["echo"], "/tmp", session)
        refused = await bad.determine_action("/usr/bin/echo", ["echo"], "/tmp", session)
        await good.aclose()
        await bad.aclose()
        assert ok.action == "run" and not ok.error
        assert refused.action == "deny" and refused.error and "UNAUTHENTICATED" in refused.reason
        # Plaintext to the TLS port does not get through.
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await action(policy_pb2_grpc.EscalationPolicyStub(channel), metadata=(("authorization", "Bearer s3cret"),))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_client_certificates(service, short_tmp: Path) -> None:
    server_dir, client_dir = short_tmp / "s", short_tmp / "c"
    server_dir.mkdir(), client_dir.mkdir()
    tls, client = make_cert(server_dir), make_cert(client_dir)
    server_tls = TlsFiles(tls.cert, tls.key, ca=client.cert)
    async with service(address="127.0.0.1:0", tls=server_tls) as server:
        root = Path(tls.cert).read_bytes()
        with_cert = grpc.ssl_channel_credentials(root, Path(client.key).read_bytes(), Path(client.cert).read_bytes())
        async with grpc.aio.secure_channel(server.addresses[0], with_cert) as channel:
            assert await action(policy_pb2_grpc.EscalationPolicyStub(channel)) == "run"
        async with grpc.aio.secure_channel(server.addresses[0], grpc.ssl_channel_credentials(root)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await action(policy_pb2_grpc.EscalationPolicyStub(channel))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_execgate_run_reaches_a_tls_service_with_a_token(short_tmp: Path) -> None:
    """`execgate policy serve` on 127.0.0.1 with TLS and a token, and `execgate run --policy` with
    --tls-ca and --token-file, as real processes: the default rules decide over TLS; without the
    CA, or with the wrong token, every exec fails closed."""
    files = make_cert(short_tmp)
    (short_tmp / "token").write_text("s3cret\n")
    (short_tmp / "wrong").write_text("nope\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cli = [sys.executable, "-m", "execgate.server.cli"]
    serve = subprocess.Popen(
        [*cli, "policy", "serve", "--listen", f"127.0.0.1:{port}", "--tls-cert", files.cert, "--tls-key", files.key,
         "--token-file", str(short_tmp / "token")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        health = [*cli, "policy", "health", "--policy", f"127.0.0.1:{port}", "--tls-ca", files.cert]
        deadline = time.monotonic() + 30
        while subprocess.run(health, capture_output=True, timeout=30).returncode != 0:
            assert time.monotonic() < deadline and serve.poll() is None, "the service did not come up"
            time.sleep(0.2)

        def run(*opts: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*cli, "run", "-q", "--sandbox", "none", "--policy", f"127.0.0.1:{port}", *opts, "--",
                 "/bin/echo ran; su -c id; echo st=$?"],
                capture_output=True, text=True, timeout=60, cwd=short_tmp,
            )

        good = run("--tls-ca", files.cert, "--token-file", str(short_tmp / "token"))
        wrong_token = run("--tls-ca", files.cert, "--token-file", str(short_tmp / "wrong"))
        no_tls = run("--token-file", str(short_tmp / "token"))
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert (good.returncode, good.stdout) == (0, "ran\nst=1\n"), good.stderr
    assert "Execution denied: privilege escalation is not allowed" in good.stderr
    for failed in (wrong_token, no_tls):
        assert failed.stdout == "st=1\n"  # even /bin/echo's exec is refused: fail closed
        assert "Execution denied: policy service error" in failed.stderr
    assert "UNAUTHENTICATED" in wrong_token.stderr or "token" in wrong_token.stderr.lower(), wrong_token.stderr
