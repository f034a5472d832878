"""The JobSpec: one TOML file that says everything about a run. The single source of truth.

Loading collects every problem at once (bad TOML, unknown key, wrong type, out-of-range value,
missing field, a secret written into the file) and raises one ``SpecError`` whose lines each name the
file, the field path and what to do. Nothing here touches the network, torch or the filesystem beyond
reading the spec and checking that local dataset files exist.

The package, by job: models.py (the JobSpec and its sections: fields, ranges, one-field checks),
serve.py (a serve's JobSpec, ``kind = "serve"``, written by `autoslm serve`), kinds.py (a run's recorded
spec of either kind, one discriminated union), checks.py (the checks across sections, and what `validate` and `plan` ask of a spec), loading.py
(a file, TOML or dict into a JobSpec, every problem as one file/field/what-to-do line).
"""

from __future__ import annotations

from autoslm.spec.checks import min_heartbeat_timeout_s, semantic_issues, unused_fields, worker_may_have_vllm
from autoslm.spec.kinds import RunSpec, run_spec, spec_from_json
from autoslm.spec.loading import load_spec, parse_spec, validate_dict
from autoslm.spec.models import (
    BUILTIN_MODEL_PREFIX,
    ArtifactsSpec,
    ComputeSpec,
    EnvironmentSpec,
    ExportSpec,
    JobSpec,
    JudgeSpec,
    LimitsSpec,
    TrainSpec,
)
from autoslm.spec.serve import ServedAdapter, ServeLimits, ServeSpec

__all__ = [
    "BUILTIN_MODEL_PREFIX",
    "ArtifactsSpec",
    "ComputeSpec",
    "EnvironmentSpec",
    "JobSpec",
    "JudgeSpec",
    "LimitsSpec",
    "RunSpec",
    "ServeLimits",
    "ServeSpec",
    "ServedAdapter",
    "ExportSpec",
    "TrainSpec",
    "load_spec",
    "min_heartbeat_timeout_s",
    "parse_spec",
    "run_spec",
    "semantic_issues",
    "spec_from_json",
    "unused_fields",
    "validate_dict",
    "worker_may_have_vllm",
]
