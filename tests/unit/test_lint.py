"""The code passes ruff's checks and is in ruff's format as pyproject.toml configures them, and `make test` /
`make test-fast` run both."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINTED = ["autoslm", "tests", "benchmarks", "worker_image"]


def test_ruff_finds_nothing_and_nothing_to_reformat():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *LINTED], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", *LINTED], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "run `make format`:\n" + r.stdout + r.stderr


def test_ruff_is_configured_installed_by_the_test_extra_and_run_by_make_test():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lint = project["tool"]["ruff"]["lint"]
    assert {"E", "F"} <= set(lint["select"]) and project["tool"]["ruff"]["line-length"] == 130
    assert any(dep.startswith("ruff") for dep in project["project"]["optional-dependencies"]["test"])
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^LINTED := " + " ".join(LINTED) + "$", make, re.M)
    assert re.search(
        r"^lint:.*\n\t\$\(PY\) -m ruff check \$\(LINTED\)\n\t\$\(PY\) -m ruff format --check \$\(LINTED\)$", make, re.M
    ), "make lint runs ruff check and ruff format --check"
    for target in ("test", "test-fast"):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", make, re.M).group(1)
        assert "$(MAKE) --no-print-directory lint" in recipe.splitlines()[0], f"make {target} runs make lint first"


def test_ruff_sees_an_unused_import(tmp_path):
    """The check can fail: ruff, as configured here, flags a file with an unused import."""
    (tmp_path / "bad.py").write_text("import os\n")
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(tmp_path / "bad.py")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "F401" in r.stdout, r.stdout + r.stderr


def test_ruff_format_sees_a_file_out_of_its_format(tmp_path):
    """The format check can fail: a file written by hand out of ruff's format is flagged."""
    (tmp_path / "bad.py").write_text("x = {  'a':1 }\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--check",
            "--no-cache",
            "--config",
            str(ROOT / "pyproject.toml"),
            str(tmp_path / "bad.py"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "bad.py" in r.stdout + r.stderr, r.stdout + r.stderr
