"""`autoslm chat`'s refusals, said in one line before anything heavy happens: a model too big for
this machine's memory, a Python without the worker extra.

    .venv/bin/python -m pytest tests/unit/test_chat.py -q
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from autoslm.errors import UsageError
from tests.conftest import REPO


def test_a_model_that_cannot_fit_is_refused_in_one_line():
    torch = pytest.importorskip("torch")
    from autoslm.views.chat_model import check_fits

    cpu = torch.device("cpu")
    with pytest.raises(
        UsageError, match=r"Qwen/Qwen3-14B needs about \d+\.\d GB in float32 on cpu; this machine has 8\.0 GB free"
    ):
        check_fits("Qwen/Qwen3-14B", cpu, torch.float32, 8.0)
    check_fits("Qwen/Qwen3-0.6B", cpu, torch.float32, 8.0)  # ~3 GB: fits
    check_fits("someone/unknown-model", cpu, torch.float32, 0.1)  # size unknown: not refused on a guess


def test_without_the_worker_extra_chat_says_what_to_install(tmp_path):
    # A Python where torch cannot be imported (None in sys.modules is how Python blocks an import):
    # the refusal comes before any run is looked up.
    code = (
        "import sys; sys.modules['torch'] = None; "
        "sys.argv = ['autoslm', 'chat', 'some-run', '--prompt', 'hi']; "
        "from autoslm.cli import main; main()"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env={"AUTOSLM_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        "error: autoslm chat runs the model here and needs the worker extra (torch missing) (pip install 'autoslm[worker]')"
    ]
