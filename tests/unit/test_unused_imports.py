"""A worker's start imports transformers without scikit-learn, which stays importable after it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.worker  # transformers' layout differs between the laptop's and the image's pins

CHECK = """
import sys
from autoslm.engine.unused_imports import import_transformers_without_sklearn
import_transformers_without_sklearn()
import autoslm.engine.train.trainer, autoslm.engine.train.sft, autoslm.engine.train.grpo  # what the worker builds
print("sklearn" in sys.modules)
import sklearn.metrics  # put back: a reward or lm-eval's metrics import it as ever
print(sklearn.metrics.f1_score([1, 0], [1, 0]))
"""


def test_the_workers_imports_leave_sklearn_out_and_importable():
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["False", "1.0"], p.stdout
