"""What users see: no Dagster warning walls when the code location loads."""

from __future__ import annotations

import os
import subprocess
import sys


def python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that shows every warning every time (`-W always`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env["EAGLE_DATA_PROFILE"] = "demo"
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def test_importing_the_definitions_prints_no_warning():
    out = python("import eagle_data.definitions")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr == "", f"{out.stderr.count('Warning')} warning(s):\n{out.stderr[:2000]}"


def test_only_the_known_dagster_warnings_are_filtered():
    out = python("import warnings, dagster, eagle_data.defs\n"
                 "for category in (dagster.BetaWarning, dagster.PreviewWarning):\n"
                 "    warnings.warn('a new feature', category)")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BetaWarning: a new feature" in out.stderr and "PreviewWarning: a new feature" in out.stderr
