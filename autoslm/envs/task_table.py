"""Environment ids -> tasks (``load_task``: a loader per kind of id, returning a ``LoadedTask``), and the
validation-time check of ``[environment]``.

``check_environment`` runs inside ``autoslm validate`` (no torch, no network): an unknown id, bad
params, a missing dataset file, a malformed ``hf:owner/name``, or a task that cannot serve the chosen
method is reported there, before anything is launched. Whether a Hub dataset exists and has usable
columns needs the network: ``autoslm.store.hub_check`` asks at plan and launch time.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import ValidationError

from autoslm.envs.base import Environment

if TYPE_CHECKING:
    from autoslm.envs.reward_refs import NamedReward

# Built-in tasks: id -> "module:Class". Each class takes (params, seed, thinking) and has a Params model.
BUILTIN = {
    "autoslm/arith": "autoslm.envs.arith:ArithEnv",
    "autoslm/calc-tool": "autoslm.envs.tools_task:CalcToolEnv",
    "autoslm/critique": "autoslm.envs.critique:CritiqueEnv",
    "autoslm/guess": "autoslm.envs.guess:GuessEnv",
}
# Built-ins that cannot give SFT targets (they exist to be explored with rewards).
GRPO_ONLY = {"autoslm/guess", "autoslm/critique"}
CRITIQUE = "autoslm/critique"


def _builtin_class(env_id: str):
    module, cls = BUILTIN[env_id].split(":")
    return getattr(importlib.import_module(module), cls)


def is_multi_turn(spec) -> bool:
    """Whether the task plays multi-turn episodes, where that is known without loading it (a built-in
    task's class says; other environments are known only once the pod loads them: False here)."""
    env_id = spec.environment.id
    return env_id in BUILTIN and bool(getattr(_builtin_class(env_id), "multi_turn", False))


@dataclass(frozen=True)
class LoadedTask:
    """A JobSpec's task as the worker uses it, loaded whole: nothing is attached to ``env`` afterwards.

    ``env`` is the environment (its judge wrapped around it when ``[environment.judge]`` is set);
    ``rewards`` the named reward functions of ``[environment] rewards`` (a shipped file fetched), or None;
    ``answer_format`` where a row's final answer sits; ``judge`` the judge's reward, or None."""

    env: Environment
    rewards: tuple[NamedReward, ...] | None = None
    answer_format: str | None = None
    judge: Any = None


@dataclass(frozen=True)
class _Request:
    """What a loader gets: the spec, its task id and params, the data files (``DataFiles`` or None), and
    the judge's client when ``[environment.judge]`` is set (one client: a task may ask it for more)."""

    spec: Any
    env_id: str
    params: dict
    files: Any
    judge_client: Any = None

    @property
    def seed(self) -> int:
        return self.spec.seeds[0]


def _load_builtin(req: _Request) -> Environment:
    return _builtin_class(req.env_id)(req.params, seed=req.seed, thinking=req.spec.thinking)


def _load_jsonl(req: _Request) -> Environment:
    from autoslm.envs.jsonl import JsonlEnv

    env = req.spec.environment
    return JsonlEnv(
        req.env_id[len("jsonl:") :],
        req.params,
        seed=req.seed,
        thinking=req.spec.thinking,
        files=req.files,
        answer_format=env.answer_format,
        scored_by_rewards=_scored_by_rewards(req.spec),
    )


def _load_hub(req: _Request) -> Environment:
    from autoslm.envs.hub_dataset import HubDatasetEnv

    env = req.spec.environment
    return HubDatasetEnv(
        req.env_id,
        req.params,
        seed=req.seed,
        thinking=req.spec.thinking,
        cache_dir=req.files.workdir / "hf-datasets" if req.files is not None else None,
        judged=env.judge is not None,
        answer_format=env.answer_format,
        scored_by_rewards=_scored_by_rewards(req.spec),
    )


def _load_verifiers(req: _Request) -> Environment:
    from autoslm.envs.verifiers_adapter import VerifiersEnv

    return VerifiersEnv(req.env_id, req.params, seed=req.seed, thinking=req.spec.thinking)


def _load_critique(req: _Request) -> Environment:
    """The critique task around its data, loaded as that data's own task; with a judge and ``critic =
    "judge"``, the judge writes the challenges too."""
    from autoslm.envs.critique import CritiqueEnv, CritiqueParams

    p = CritiqueParams.model_validate(req.params)
    inner = load_task(_data_spec(req.spec, p.data, p.data_params), req.files).env
    env = CritiqueEnv(req.params, seed=req.seed, thinking=req.spec.thinking, inner=inner)
    if req.judge_client is not None and p.critic == "judge":
        env.use_judge(req.judge_client)  # the judge writes the challenges and scores the final answers
    return env


# How each kind of task id loads: an exact id first, then the longest prefix; anything else with an
# owner/name shape is a verifiers environment. One row per kind, as ``vendors/table.VENDORS`` is.
EXACT_LOADERS: dict[str, Callable[[_Request], Environment]] = {
    CRITIQUE: _load_critique,
    **{env_id: _load_builtin for env_id in BUILTIN if env_id != CRITIQUE},
}
PREFIX_LOADERS: dict[str, Callable[[_Request], Environment]] = {"jsonl:": _load_jsonl, "hf:": _load_hub}


def _loader(env_id: str) -> Callable[[_Request], Environment]:
    if env_id in EXACT_LOADERS:
        return EXACT_LOADERS[env_id]
    for prefix in sorted(PREFIX_LOADERS, key=len, reverse=True):
        if env_id.startswith(prefix):
            return PREFIX_LOADERS[prefix]
    return _load_verifiers


def load_task(spec, files=None) -> LoadedTask:
    """Build the task a JobSpec names, whole. Raises FatalWorkerError for data problems.

    ``files`` (``autoslm.store.shipping.DataFiles``) fetches the data and reward files shipped with the run."""
    environment = spec.environment
    client = None
    if environment.judge is not None:
        from autoslm.envs.judge import JudgeClient

        client = JudgeClient.from_spec(environment.judge)
    env = _loader(environment.id)(_Request(spec, environment.id, dict(environment.params), files, client))
    judge = None
    if client is not None:
        from autoslm.envs.judge import JudgedEnvironment, JudgeReward

        judge = JudgeReward(client, environment.judge.weight)
        env = JudgedEnvironment(env, judge)
    rewards = None
    if environment.rewards:
        from autoslm.envs.reward_refs import named_rewards

        rewards = tuple(named_rewards(spec, files))  # a shipped reward file is fetched here, like data
    return LoadedTask(env, rewards, environment.answer_format, judge)


def load_environment(spec, files=None) -> Environment:
    """The environment alone (``load_task(spec, files).env``): for what needs only its examples."""
    return load_task(spec, files).env


def _data_spec(spec, data: str, data_params: dict):
    """``spec`` naming ``data`` as its environment (no judge): how a wrapping task loads its data."""
    env = spec.environment.model_copy(update={"id": data, "params": dict(data_params), "judge": None, "rewards": []})
    return spec.model_copy(update={"environment": env})


def _critique_issues(spec, params: dict) -> list[tuple[str, str]]:
    """The critique task's own params, then its data's, checked as that data's would be."""
    from autoslm.envs.critique import CritiqueParams

    issues = _params_issues(CritiqueParams, params)
    if issues:
        return issues
    p = CritiqueParams.model_validate(params)
    if p.data == CRITIQUE:
        return [
            (
                "environment.params.data",
                'a critique cannot wrap itself: name prompt + answer data (a built-in task, "jsonl:path" or "hf:owner/name")',
            )
        ]
    if spec.environment.rewards:
        issues.append(
            (
                "environment.rewards",
                f"{CRITIQUE} rewards an episode by its outcome (the bonuses in its params); "
                "remove rewards, or give the data's answers a format with environment.answer_format",
            )
        )
    if p.critic == "judge" and spec.environment.judge is None:
        issues.append(
            (
                "environment.params.critic",
                '"judge" needs an [environment.judge] endpoint to write the challenges; add one, or use "templates"',
            )
        )
    inner = _data_spec(spec, p.data, p.data_params)
    for field, message in check_environment(inner):
        field = field.replace("environment.params", "environment.params.data_params").replace(
            "environment.id", "environment.params.data"
        )
        issues.append((field, message))
    return issues


def _scored_by_rewards(spec) -> bool:
    """``[environment] rewards`` without "env": the rows need no answer of their own."""
    return bool(spec.environment.rewards) and "env" not in spec.environment.rewards


def check_environment(spec) -> list[tuple[str, str]]:
    """(field, message) for each problem with ``[environment]``; [] when it is fine."""
    env_id, params = spec.environment.id, spec.environment.params
    method = spec.train.method
    if env_id == CRITIQUE:
        issues = _critique_issues(spec, params)
        if method == "sft":
            issues.append(("environment.id", f'{env_id} has no SFT targets: use method = "grpo", or another task'))
        return issues
    if env_id in BUILTIN:
        try:
            params_model = _builtin_class(env_id).Params
        except (ImportError, AttributeError) as e:
            return [("environment.id", f"built-in task {env_id!r} is unavailable in this install ({e})")]
        issues = _params_issues(params_model, params)
        if method == "sft" and env_id in GRPO_ONLY:
            issues.append(("environment.id", f'{env_id} has no SFT targets: use method = "grpo", or another task'))
        return issues
    if env_id.startswith("jsonl:"):
        from autoslm.envs.jsonl import JsonlParams
        from autoslm.layout import is_store_ref

        ref = env_id[len("jsonl:") :]
        issues = _params_issues(JsonlParams, params)
        if not is_store_ref(ref) and not Path(ref).is_file():
            issues.append(("environment.id", f"dataset file not found: {ref} (paths are relative to the spec file)"))
        eval_path = params.get("eval_path")
        if isinstance(eval_path, str) and not is_store_ref(eval_path) and not Path(eval_path).expanduser().is_file():
            issues.append(("environment.params.eval_path", f"file not found: {eval_path}"))
        return issues
    if env_id.startswith("hf:"):
        from autoslm.envs.hub_dataset import HubDatasetParams, dataset_id_problem

        problem = dataset_id_problem(env_id)
        return ([("environment.id", problem)] if problem else []) + _params_issues(HubDatasetParams, params)
    if env_id.startswith("autoslm/"):
        return [("environment.id", f"unknown built-in task {env_id!r}; built-in tasks: {', '.join(sorted(BUILTIN))}")]
    if "/" in env_id:
        from autoslm.envs.verifiers_adapter import check_verifiers

        problem = check_verifiers(env_id, on_pod=not spec.compute.is_local)
        return [("environment.id", problem)] if problem else []
    return [
        (
            "environment.id",
            f'{env_id!r} is not a task: use a built-in ({", ".join(sorted(BUILTIN))}), "jsonl:path", a Hub dataset "hf:owner/name", or a verifiers "owner/name"',
        )
    ]


def _params_issues(model, params: dict) -> list[tuple[str, str]]:
    try:
        model.model_validate(params)
    except ValidationError as e:
        out = []
        for err in e.errors():
            field = ".".join(["environment", "params", *map(str, err["loc"])])
            msg = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"]
            if "input" in err and err["type"] != "extra_forbidden":
                msg += f" (got {err['input']!r})"
            out.append((field, msg))
        return out
    return []


def sample_row(spec):
    """(prompt, the row's columns, True) of the first training row when it can be read offline (a
    built-in task, a local jsonl file), for ``validate`` to call a reward file's functions on; else a
    placeholder row with the columns every row has (and False: signature checks only)."""
    from autoslm.envs.reward_refs import placeholder_row, row_columns

    env = spec.environment
    example = None
    try:
        if env.id.startswith("jsonl:"):
            from autoslm.envs.jsonl import JsonlParams, first_example

            example = first_example(env.id[len("jsonl:") :], JsonlParams.model_validate(env.params))
        elif env.id in BUILTIN:
            example = _builtin_class(env.id)(dict(env.params), seed=spec.seeds[0], thinking=spec.thinking).train_examples()[0]
    except Exception:  # noqa: BLE001 - the data's own problems are reported by check_environment
        example = None
    if example is None:
        return placeholder_row(env.answer_format)
    return list(example.prompt), row_columns(example.answer, example.info, env.answer_format), True


def check_rewards(spec, root=None) -> list[tuple[str, str]]:
    """``[environment] rewards``' problems (``envs.reward_check.reward_issues``), reward files called on
    the first row of the data; ``root``: the folder holding the spec file, where reward files must be."""
    from autoslm.envs.reward_check import reward_issues

    return reward_issues(spec, sample=lambda: sample_row(spec), root=root)
