"""The approval page in a real browser: ``execgate policy serve`` (a ``prompt`` rule),
``execgate approve --web`` and ``execgate run --sandbox bwrap`` as processes, and Debian's headless
Chromium driven by Selenium through chromedriver.

The prompted program is ``touch OUTSIDE``: the session's private /tmp hides OUTSIDE, so the marker
appears only when the command escalates — that is, only when someone approved it on the page.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from execgate.v1 import approvals_pb2 as apb
from run_support import CLI, audit_records, write_rules
from test_run_approve import _stop, _wait_healthy

pytestmark = pytest.mark.e2e

RULES = """
[[rule]]
id = "ask-touch"
program = "touch"
decision = "prompt"
execution = "unsandboxed"
justification = "touching files needs a person"
match = ["touch x"]
"""

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 90  # an upper bound for slow machines, never a measured time


@dataclass
class Stack:
    """The processes of one test: policy service, web approver; the page's base URL and token."""

    address: str
    url: str
    token: str
    work: Path
    audit_log: Path


@contextlib.contextmanager
def _running_stack(tmp: Path, *, approver_wait: str = "30") -> Iterator[Stack]:
    """``policy serve`` with the prompt rule and ``approve --web`` on a free port, stopped after."""
    rules = write_rules(tmp / "rules.toml", RULES)
    address = f"unix://{tmp}/policy.sock"
    (tmp / "work").mkdir()
    token_file = tmp / "web-token"
    token_file.write_text("correct-horse-battery-staple\n")
    with (tmp / "serve.log").open("w") as serve_log:
        serve = subprocess.Popen(
            [*CLI, "policy", "serve", "--listen", address, "--rules", str(rules), "--audit-log",
             str(tmp / "audit.jsonl"), "--approval-timeout", "60", "--approver-wait", approver_wait],
            stdout=subprocess.DEVNULL, stderr=serve_log, text=True,
        )
    web = None
    try:
        _wait_healthy(address, serve)
        with (tmp / "web.log").open("w") as web_log:
            web = subprocess.Popen(
                [*CLI, "approve", "--web", "127.0.0.1:0", "--policy", address, "--name", "e2e-browser",
                 "--web-token-file", str(token_file)],
                stdout=subprocess.PIPE, stderr=web_log, text=True,
            )
        assert web.stdout is not None
        line = web.stdout.readline()  # EOF ("") if it exits: no hang
        assert line.startswith("execgate approve: approval page at http://127.0.0.1:"), (tmp / "web.log").read_text()
        url = line.split(" at ", 1)[1].strip()
        assert "token" not in url  # the token came from the file: it is not printed
        yield Stack(address, url, "correct-horse-battery-staple", tmp / "work", tmp / "audit.jsonl")
    finally:
        for proc in (web, serve):
            if proc is not None:
                _stop(proc)


@pytest.fixture
def stack(short_tmp: Path) -> Iterator[Stack]:
    with _running_stack(short_tmp) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _session(stack: Stack, marker: Path, *, times: int = 1) -> subprocess.Popen[str]:
    """``execgate run`` whose script asks ``times`` times to touch ``marker`` (a prompt each, unless
    approved for the session) and prints the last status."""
    script = "; ".join([shlex.join(["touch", str(marker)])] * times) + "; echo status=$?"
    return subprocess.Popen(
        [*CLI, "run", "--policy", stack.address, "--sandbox", "bwrap", "--cwd", str(stack.work), "-q",
         "--label", "agent=reviewer", "--", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _finish(session: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return session.communicate(timeout=WAIT_S)
    finally:
        if session.poll() is None:
            session.kill()
            session.communicate()


def _log_in(browser: webdriver.Chrome, stack: Stack) -> None:
    """Log in through the form, as a person would."""
    browser.delete_all_cookies()
    browser.get(stack.url)
    browser.find_element(By.ID, "token").send_keys(stack.token)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, WAIT_S).until(lambda b: b.find_element(By.ID, "status").text == "connected")


def _pending_card(browser: webdriver.Chrome, marker: Path) -> WebElement:
    card = WebDriverWait(browser, WAIT_S).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "article.request[data-request-id]"))
    )
    assert card.find_element(By.CSS_SELECTOR, ".command").text == shlex.join(["touch", str(marker)])
    return card


def _check_env_shown(browser: webdriver.Chrome, stack: Stack, card: WebElement) -> None:
    """The page shows the variables that reach the command exactly when the service sends them
    (``PendingApproval.env``, in protos whose version has it)."""
    cookie = f"execgate_web={browser.get_cookie('execgate_web')['value']}"
    status, body = _http(stack.url + "api/pending", cookie=cookie)
    assert status == 200
    env = json.loads(body)["pending"][0]["env"]
    rows = card.find_elements(By.CSS_SELECTOR, "table.env tr")
    if "env" in apb.PendingApproval.DESCRIPTOR.fields_by_name:
        assert isinstance(env, dict)
        assert [tuple(r.find_elements(By.TAG_NAME, "td")[i].text for i in (0, 1)) for r in rows] == list(env.items())
    else:
        assert env is None and rows == [] and card.find_elements(By.CSS_SELECTOR, ".env-title") == []


def _save_screenshot(browser: webdriver.Chrome, tmp_path: Path) -> None:
    shot = tmp_path / "web_approver.png"
    assert browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    if os.environ.get("EXECGATE_ARTIFACTS"):
        kept = REPO / "tests" / "artifacts" / "web_approver.png"
        kept.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, kept)
        print(f"screenshot kept: {kept}")


def test_a_click_approves_and_the_command_escalates(stack: Stack, browser: webdriver.Chrome, tmp_path: Path):
    marker = Path(f"{stack.work.parent}/outside-approved")
    _log_in(browser, stack)
    session = _session(stack, marker)
    try:
        card = _pending_card(browser, marker)
        assert card.find_element(By.CSS_SELECTOR, ".cwd").text == str(stack.work)
        assert card.find_element(By.CSS_SELECTOR, ".rule").text == "ask-touch"
        assert card.find_element(By.CSS_SELECTOR, ".justification").text == "touching files needs a person"
        assert card.find_element(By.CSS_SELECTOR, ".execution").text == "unsandboxed"
        assert card.find_element(By.CSS_SELECTOR, ".labels").text == "(agent=reviewer)"
        _check_env_shown(browser, stack, card)
        _save_screenshot(browser, tmp_path)
        card.find_element(By.CSS_SELECTOR, "button.approve-once").click()
    finally:
        out, err = _finish(session)
    assert out == "status=0\n", err
    assert marker.exists()
    WebDriverWait(browser, WAIT_S).until(ec.text_to_be_present_in_element((By.ID, "history"), "approved once"))
    assert browser.find_elements(By.CSS_SELECTOR, "article.request") == []
    touches = [r for r in audit_records(stack.audit_log) if r["argv"][0] == "touch"]
    assert [(r["decision"], r["approver"]) for r in touches] == [("escalate", "e2e-browser (web)")]


def test_deny_with_a_reason_reaches_the_session(stack: Stack, browser: webdriver.Chrome):
    marker = Path(f"{stack.work.parent}/outside-denied")
    _log_in(browser, stack)
    session = _session(stack, marker)
    try:
        card = _pending_card(browser, marker)
        card.find_element(By.CSS_SELECTOR, "input.reason").send_keys("not from a browser on a friday")
        card.find_element(By.CSS_SELECTOR, "button.deny").click()
    finally:
        out, err = _finish(session)
    assert out == "status=1\n"
    assert err == "Execution denied: not from a browser on a friday\n"
    assert not marker.exists()


def test_approve_for_the_session_covers_the_identical_request_after(stack: Stack, browser: webdriver.Chrome):
    marker = Path(f"{stack.work.parent}/outside-session")
    _log_in(browser, stack)
    session = _session(stack, marker, times=2)
    try:
        _pending_card(browser, marker).find_element(By.CSS_SELECTOR, "button.approve-session").click()
    finally:
        out, err = _finish(session)
    assert out == "status=0\n", err
    assert marker.exists()
    touches = [r for r in audit_records(stack.audit_log) if r["argv"][0] == "touch"]
    assert [(r["decision"], r["approver"]) for r in touches] == [("escalate", "e2e-browser (web)")] * 2
    assert touches[1]["reason"] == "approved earlier for this session"


def test_request_data_is_shown_as_text_never_as_html(stack: Stack, browser: webdriver.Chrome):
    """The hostile script chooses argv: markup in it must not become elements of the approver's page."""
    marker = Path(f"{stack.work.parent}/<img id=xss src=x onerror=alert(1)><b class=xss>bold</b>")
    _log_in(browser, stack)
    session = _session(stack, marker)
    try:
        card = _pending_card(browser, marker)  # the markup is there, verbatim, as text
        assert browser.find_elements(By.ID, "xss") == [] and browser.find_elements(By.CSS_SELECTOR, "b.xss") == []
        card.find_element(By.CSS_SELECTOR, "button.deny").click()
    finally:
        out, err = _finish(session)
    assert out == "status=1\n" and err == "Execution denied: denied by approver\n"
    assert not marker.exists()


def _http(url: str, *, cookie: str = "", data: bytes | None = None, headers: dict[str, str] | None = None
          ) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, headers={**(headers or {}), **({"Cookie": cookie} if cookie else {})})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as reply:
            streaming = reply.headers.get("Content-Type", "").startswith("text/event-stream")
            return reply.status, (reply.read1(65536) if streaming else reply.read()).decode()  # a stream never ends
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # the 303 after login carries the cookie: keep it
        return None


def test_a_wrong_token_gets_401_and_no_request_data(stack: Stack, browser: webdriver.Chrome):
    marker = Path(f"{stack.work.parent}/outside-secret")
    session = _session(stack, marker)
    try:
        # Control: logged in with the right token, the page shows the request.
        _log_in(browser, stack)
        request_id = _pending_card(browser, marker).get_attribute("data-request-id")
        assert request_id

        browser.delete_all_cookies()
        browser.get(stack.url + "?token=wrong")
        assert browser.find_element(By.ID, "login-error").text == "Wrong token."
        assert str(marker) not in browser.page_source and request_id not in browser.page_source

        status, body = _http(stack.url + "?token=wrong")
        assert status == 401 and str(marker) not in body
        status, body = _http(stack.url + "login", data=b"token=correct-horse-battery-stapl")
        assert status == 401 and str(marker) not in body
        forged = "execgate_web=" + "0" * 64
        for path in ("events", "api/pending"):
            for cookie in ("", forged):
                status, body = _http(stack.url + path, cookie=cookie)
                assert (status, str(marker) in body, request_id in body) == (401, False, False), (path, cookie)
        answer = json.dumps({"id": request_id, "verdict": "once"}).encode()
        status, _ = _http(stack.url + "api/resolve", cookie=forged, data=answer,
                          headers={"Content-Type": "application/json", "X-Execgate": "1"})
        assert status == 401

        # The request is still pending (the control login still sees it); deny it to end the session.
        _log_in(browser, stack)
        _pending_card(browser, marker).find_element(By.CSS_SELECTOR, "button.deny").click()
    finally:
        out, err = _finish(session)
    assert out == "status=1\n" and err == "Execution denied: denied by approver\n"
    assert not marker.exists()


def test_with_no_page_open_the_web_approver_is_not_an_approver(short_tmp: Path):
    """No page listening: the prompt is denied as unattended at once, not left waiting for nobody."""
    marker = Path(f"{short_tmp}/outside-unattended")
    with _running_stack(short_tmp, approver_wait="0") as running:
        out, err = _finish(_session(running, marker))
    assert out == "status=1\n"
    assert err == "Execution denied: approval required but no approver is connected\n"
    assert not marker.exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--web", "localhost"], "--web wants HOST:PORT, not 'localhost'"),
    (["--web", "127.0.0.1:0", "--web-token-file", "/nonexistent/token"], "No such file or directory"),
    (["--web", "127.0.0.1:0", "--web-token-file", "SHORT"], "the web login token must have at least 16 characters"),
    (["--web", "0.0.0.0:0"], "a plain HTTP page beyond loopback would send the login token in clear"),
    (["--web", "[::]:0"], "pass --web-insecure"),
])
def test_bad_web_options_exit_2_with_a_message(options: list[str], message: str, short_tmp: Path):
    (short_tmp / "SHORT").write_text("hunter2\n")
    done = subprocess.run([*CLI, "approve", "--policy", "unix:///nonexistent.sock", *options], capture_output=True,
                          text=True, timeout=60, check=False, cwd=short_tmp)
    assert done.returncode == 2 and message in done.stderr and done.stdout == ""
