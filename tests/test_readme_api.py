"""The README's Python API example runs as written (it is read from README.md, not copied): a
one-shot exec whose ``su`` is denied, then a long-lived session's shell (issue #12 item 7)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_api_example_runs_as_written(tmp_path):
    text = README.read_text()
    section = text[text.index("## The Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split("\n", 1)
    # exit_code, stdout, stderr, truncated of `echo hi; su -c id`: su is denied (status 1)
    assert first.startswith("1 'hi\\n' 'Execution denied: privilege escalation is not allowed"), done.stdout
    assert "git version" in rest and "status=1" in rest, done.stdout + done.stderr
