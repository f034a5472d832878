"""A worker's start imports transformers without scikit-learn and SciPy, which stay importable after it,
and bitsandbytes (where installed, without CUDA) without torch's compiler, its kernels working uncompiled;
an SFT run's trainer without TRL's GRPO trainer (and the trackers that one imports)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.worker  # transformers' layout differs between the laptop's and the image's pins

CHECK = """
import sys
from autoslm.engine.unused_imports import import_transformers_without_unused
import_transformers_without_unused()
import autoslm.engine.train.sft, autoslm.engine.train.sft_trainer  # what an SFT run builds
print("trl.trainer.grpo_trainer" in sys.modules)
import autoslm.engine.train.trainer, autoslm.engine.train.grpo  # and a GRPO run
print("sklearn" in sys.modules, "scipy" in sys.modules)
import sklearn.metrics  # put back: a reward or lm-eval's metrics import them as ever
print(sklearn.metrics.f1_score([1, 0], [1, 0]))
from scipy.optimize import linear_sum_assignment
print(linear_sum_assignment([[1, 0], [0, 1]])[1].tolist())
"""


def test_a_workers_start_leaves_out_sklearn_scipy_and_for_sft_the_grpo_trainer():
    # As a worker whose run does not report to MLflow (engine/pod/trackers.py): MLflow imports SciPy itself.
    env = {**os.environ, "DISABLE_MLFLOW_INTEGRATION": "TRUE"}
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["False", "False", "False", "1.0", "[1,", "0]"], p.stdout


BNB_CHECK = """
import sys
import torch
from autoslm.engine.unused_imports import import_bitsandbytes_eager, import_transformers_without_unused
compile_ = torch.compile
import_transformers_without_unused()
import_bitsandbytes_eager()
import peft, autoslm.engine.train.trainer, autoslm.engine.train.sft, autoslm.engine.train.grpo  # what the worker builds
print("bitsandbytes" in sys.modules, "torch._inductor.compile_fx" in sys.modules, torch.compile is compile_)
import bitsandbytes.functional as F
w = torch.randn(64, 64)
q, state = F.quantize_4bit(w, blocksize=64)  # bitsandbytes' default CPU kernels, uncompiled
print(float((F.dequantize_4bit(q, state) - w).abs().mean()) < 0.2)
"""


def test_bitsandbytes_is_imported_without_torchs_compiler_and_its_kernels_work():
    pytest.importorskip("bitsandbytes")  # the image's pins (QLoRA)
    p = subprocess.run([sys.executable, "-c", BNB_CHECK], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["True", "False", "True", "True"], p.stdout
