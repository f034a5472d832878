"""Reading a JobSpec: a file, its TOML, or a dict, into a ``JobSpec``, with every problem found at
once in one ``SpecError`` (pydantic's errors as file/field/what-to-do lines, a secret written into
the file, and the cross-section checks of checks.py). Relative paths (a ``jsonl:`` dataset, a reward
file, an lm-eval task file) are made absolute from the spec's folder.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoslm.errors import SpecError, SpecIssue
from autoslm.secrets import looks_secret
from autoslm.spec.checks import semantic_issues
from autoslm.spec.models import JobSpec
from autoslm.vendors.table import VENDORS
from autoslm.vendors.vendor import Vendor


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a JobSpec file. Raises SpecError listing every problem found."""
    path = Path(path)
    fname = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([SpecIssue(fname, "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([SpecIssue(fname, "", f"cannot read: {e}")]) from None
    return parse_spec(text, fname, base_dir=path.parent)


def parse_spec(text: str, fname: str = "<spec>", base_dir: Path | None = None) -> JobSpec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError([SpecIssue(fname, "", f"invalid TOML: {e}")]) from None
    return validate_dict(raw, fname, base_dir)


def validate_dict(
    raw: dict, fname: str = "<spec>", base_dir: Path | None = None, *, vendors: Mapping[str, Vendor] | None = None
) -> JobSpec:
    """``raw`` as a JobSpec, every problem in one SpecError. ``vendors``: the vendor table it is checked
    against (default: every registered vendor, ``VENDORS``)."""
    if isinstance(raw.get("sweep"), dict):  # not one run: the CLI and autoslm.sweep() expand it (autoslm/sweep.py)
        raise SpecError(
            [
                SpecIssue(
                    fname,
                    "sweep",
                    "this file is a sweep, not one run: `autoslm launch` runs it as a "
                    "sweep, and from Python autoslm.sweep(path) does",
                )
            ]
        )
    if raw.get("kind") == "serve":  # a serve's JobSpec (spec/serve.py) is built from a trained run, not written
        raise SpecError(
            [
                SpecIssue(
                    fname, "kind", "a serve is started from a trained run: `autoslm serve RUN[@STEP]`, not launched from a file"
                )
            ]
        )
    issues = _secret_issues(raw, fname)
    spec = None
    try:
        spec = JobSpec.model_validate(_resolve_paths(raw, base_dir), context={"vendors": vendors} if vendors else None)
    except ValidationError as e:
        issues += [_issue(fname, err) for err in e.errors()]
    if spec is not None:
        issues += semantic_issues(spec, fname, base_dir)
    if issues:
        raise SpecError(issues)
    return spec


def _issue(fname: str, err: dict) -> SpecIssue:
    # Drop the discriminator tag pydantic puts in the path ("train.sft.batch_size" -> "train.batch_size").
    loc = [str(p) for p in err["loc"] if p not in ("sft", "grpo", "str", "list[str]", "int", "list[int]")]
    field = ".".join(loc)
    kind, msg = err["type"], err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "extra_forbidden":
        msg = "unknown key: remove it or check its spelling (autoslm validate lists the fields)"
    elif kind == "missing":
        msg = "required field is missing"
    elif kind == "union_tag_invalid":
        msg = (
            f'method must be "sft" or "grpo", got {err.get("input", {}).get("method")!r}'
            if isinstance(err.get("input"), dict)
            else msg
        )
    elif "input" in err and kind not in ("value_error", "assertion_error") and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    return SpecIssue(fname, field, msg)


def _secret_issues(raw: Any, fname: str, path: str = "") -> list[SpecIssue]:
    out = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            here = f"{path}.{key}" if path else str(key)
            if looks_secret(str(key)) and not str(key).endswith("_env"):
                out.append(
                    SpecIssue(fname, here, f"secrets do not belong in a JobSpec: remove it and {_where_secret_goes(here)}")
                )
            else:
                out += _secret_issues(value, fname, here)
    return out


def _where_secret_goes(field: str) -> str:
    if field.startswith("artifacts"):
        return "set HF_TOKEN in the environment (or run `hf auth login`)"
    if field.startswith("compute"):
        return f"set {' or '.join(v.key_env for v in VENDORS.values() if v.key_env)} in the environment"
    if field.startswith("environment.judge"):
        return 'put the key in an environment variable and name it with api_key_env = "JUDGE_API_KEY"'
    return "pass it through an environment variable"


def _resolve_paths(raw: dict, base_dir: Path | None) -> dict:
    """Fill the default method (so its recipe applies) and make a relative ``jsonl:`` dataset path
    relative to the spec file, not to the current directory (also the data an "autoslm/critique" wraps)."""
    train = raw.get("train")
    if isinstance(train, dict) and "method" not in train:
        raw = {**raw, "train": {"method": "sft", **train}}
    ev = raw.get("eval")
    if base_dir is not None and isinstance(ev, dict) and isinstance(ev.get("lm_eval"), list):
        raw = {**raw, "eval": {**ev, "lm_eval": [_task_file_path(t, base_dir) for t in ev["lm_eval"]]}}
    env = raw.get("environment")
    if base_dir is None or not isinstance(env, dict):
        return raw
    if isinstance(env.get("rewards"), list):
        env = {**env, "rewards": [_reward_path(r, base_dir) for r in env["rewards"]]}
    env = _resolve_data(env, base_dir)
    params = env.get("params")
    if env.get("id") == "autoslm/critique" and isinstance(params, dict) and isinstance(params.get("data"), str):
        inner = _resolve_data({"id": params["data"], "params": params.get("data_params")}, base_dir)
        env = {
            **env,
            "params": {**params, "data": inner["id"], **({"data_params": inner["params"]} if "data_params" in params else {})},
        }
    return {**raw, "environment": env}


def _resolve_data(env: dict, base_dir: Path) -> dict:
    """``{"id": "jsonl:path", "params": {...}}`` with its paths made absolute from ``base_dir``."""
    if not (
        isinstance(env.get("id"), str) and env["id"].startswith("jsonl:") and not env["id"].startswith("jsonl:store:")
    ):  # a file already shipped into the store
        return env
    p = Path(env["id"][len("jsonl:") :]).expanduser()
    if not p.is_absolute():
        p = (base_dir / p).resolve()
    env = {**env, "id": f"jsonl:{p}"}
    params = env.get("params")
    if isinstance(params, dict) and isinstance(params.get("eval_path"), str) and not params["eval_path"].startswith("store:"):
        e = Path(params["eval_path"]).expanduser()
        env["params"] = {**params, "eval_path": str(e if e.is_absolute() else (base_dir / e).resolve())}
    return env


def _task_file_path(text, base_dir: Path):
    """An lm-eval task YAML made absolute from the spec's folder; a task name as written."""
    from autoslm.recipes.harness import is_task_file

    if not isinstance(text, str) or not is_task_file(text) or text.startswith("store:"):
        return text
    p = Path(text).expanduser()
    return os.path.abspath(p if p.is_absolute() else base_dir / p)


def _reward_path(text, base_dir: Path):
    """A reward file's path made relative to the spec file ("rewards.py:fn" -> "/abs/dir/rewards.py:fn").
    Links are kept as written: the check that the file is inside the spec's folder follows them, and
    names the link the user wrote."""
    if not isinstance(text, str) or text == "env" or text.startswith(("trl:", "store:")) or ":" not in text:
        return text
    path, _, name = text.rpartition(":")
    p = Path(path).expanduser()
    return f"{os.path.abspath(p if p.is_absolute() else base_dir / p)}:{name}"
