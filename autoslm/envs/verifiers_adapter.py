"""Environments from the ``verifiers`` library ("owner/name", e.g. from the Prime Intellect hub).

``check_verifiers(env_id)`` runs at validation time without importing anything heavy: it only looks
for the ``verifiers`` package and the environment's module, and returns one line saying what to
install when either is missing. ``VerifiersEnv`` loads the environment with
``verifiers.load_environment(name, **params)`` and adapts it to autoslm's ``Environment``:

- examples: rows of ``get_dataset()`` / ``get_eval_dataset()`` (the train rows when there is no eval
  split). A row's ``prompt`` (chat messages) is used as is; rows with only ``question`` get
  ``[system_prompt?, few_shot?, {"role": "user", "content": question}]``. ``answer`` becomes
  ``Example.answer``; ``info`` and ``task`` travel in ``Example.info``. Rows have no SFT target unless
  they carry a ``completion``/``target`` text.
- rewards: each function of the rubric (``rubric.funcs`` and ``rubric.weights``), called the way
  verifiers calls them: with the keyword arguments it names among ``prompt``, ``completion`` (a
  message list), ``answer``, ``info``, ``task``, ``state``, ``parser`` and the rubric's class objects;
  coroutines are awaited. A reward function that raises scores 0 and is logged, as in verifiers.
  Group-level functions (plural arguments such as ``completions``) cannot be adapted and are skipped
  with a warning.
- tools: a ``ToolEnv``'s ``tools`` list is handed to TRL (``GRPOTrainer(tools=...)``).
- other multi-turn environments (a custom ``env_response``) are refused with a clear message.

Nothing here installs packages or touches the network by itself; the environment's own code may.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from autoslm.envs.base import Environment, Example, Messages
from autoslm.errors import FatalWorkerError

log = logging.getLogger("autoslm.envs.verifiers")

_GROUP_ARGS = {"states", "prompts", "completions", "answers", "tasks", "infos"}
_SINGLE_TURN_CLASSES = {"SingleTurnEnv"}
_TOOL_CLASSES = {"ToolEnv", "StatefulToolEnv", "PythonEnv"}
# The parts of "owner/name@version". The id becomes a pip requirement on the pod ("name==version",
# worker_image/boot_rules.py), so it may hold nothing pip would read as an option, a path or a URL.
_ID_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A version as PEP 440 writes one ("0.1.9", "1.0rc1", "2!1.0.post1+local"): never an option ("--pre") or a word.
_VERSION = re.compile(
    r"^v?(\d+!)?\d+(\.\d+)*([-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"([-_.]?(post|rev|r)[-_.]?\d*)?([-_.]?dev[-_.]?\d*)?(\+[a-z0-9]+([-_.][a-z0-9]+)*)?$",
    re.IGNORECASE,
)


def split_version(env_id: str) -> tuple[str, str | None]:
    """("owner/name", "version") from "owner/name@version" (how Prime's Environments Hub pins one), else (id, None)."""
    name, _, version = env_id.partition("@")
    return name, version or None


def module_name(env_id: str) -> str:
    """The Python module an environment id installs as (verifiers' own rule: last part, '-' -> '_')."""
    return split_version(env_id)[0].split("/")[-1].replace("-", "_")


def install_hint(env_id: str) -> str:
    return f"pip install verifiers, then install the environment: prime env install {env_id} (or pip install {env_id.split('/')[-1]})"


def check_verifiers(
    env_id: str, find_spec: Callable[[str], Any] = importlib.util.find_spec, *, on_pod: bool = False
) -> str | None:
    """None when ``env_id`` can be loaded here (``on_pod``: a rented pod, which installs a pinned
    "owner/name@version" itself: worker_image/boot.py); otherwise one line saying what to install."""
    if any(c.isspace() for c in env_id):
        return (
            f'{env_id!r} carries spaces or pip options: a verifiers environment id is "owner/name" or '
            '"owner/name@version" alone (an extra package index goes in environment.index_url)'
        )
    name, _, version = env_id.partition("@")
    owner, _, short = name.partition("/")
    if not (_ID_PART.match(owner) and _ID_PART.match(short)):
        return f'a verifiers environment id looks like "owner/name" or "owner/name@version", got {env_id!r}'
    if "@" in env_id and not _VERSION.match(version):
        return (
            f'{env_id!r}: {version!r} is not a version; a verifiers environment id looks like "owner/name" or '
            '"owner/name@version", e.g. "owner/name@0.1.9"'
        )
    version = version or None
    if on_pod and version:
        return None
    if _spec(find_spec, "verifiers") is None:
        return f"{env_id} is a verifiers environment, but the verifiers package is not installed: {install_hint(env_id)}"
    mod = module_name(env_id)
    if _spec(find_spec, mod) is None:
        return f"the verifiers environment {env_id} is not installed (no module {mod!r}): {install_hint(env_id)}"
    return None


def _spec(find_spec, name: str):
    try:
        return find_spec(name)
    except (ImportError, ValueError):
        return None


def _default_loader(env_id: str, params: dict) -> Any:
    verifiers = importlib.import_module("verifiers")
    return verifiers.load_environment(module_name(env_id), **params)


def _run(value: Any) -> Any:
    if inspect.isawaitable(value):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_await(value))
        # Called from inside a running loop (a notebook): run the coroutine on a fresh loop elsewhere.
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, _await(value)).result()
    return value


async def _await(value):
    return await value


def _class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


class VerifiersEnv(Environment):
    """A verifiers environment seen through autoslm's ``Environment`` interface."""

    multi_turn = False
    max_turns = 1

    def __init__(
        self,
        env_id: str,
        params: dict | None = None,
        seed: int = 0,
        thinking: bool = False,
        *,
        loader: Callable[[str, dict], Any] | None = None,
        find_spec: Callable[[str], Any] = importlib.util.find_spec,
    ):
        self.name = env_id
        self.seed = seed
        self.thinking = thinking
        if loader is None:
            problem = check_verifiers(env_id, find_spec)
            if problem:
                raise FatalWorkerError(problem)
            loader = _default_loader
        try:
            self.vf = loader(env_id, dict(params or {}))
        except FatalWorkerError:
            raise
        except Exception as e:  # noqa: BLE001 - the environment's own code: report it as a config problem
            raise FatalWorkerError(f"could not load the verifiers environment {env_id}: {type(e).__name__}: {e}") from None
        names = _class_names(self.vf)
        self._tools = list(getattr(self.vf, "tools", None) or []) or None
        if not (names & _SINGLE_TURN_CLASSES) and not (names & _TOOL_CLASSES) and "MultiTurnEnv" in names:
            raise FatalWorkerError(
                f"{env_id} is a multi-turn verifiers environment ({type(self.vf).__name__}); autoslm trains single-turn "
                "and tool-calling verifiers environments"
            )
        self.rubric = getattr(self.vf, "rubric", None)
        self.parser = getattr(self.vf, "parser", None) or getattr(self.rubric, "parser", None)
        self._train: list[Example] | None = None
        self._eval: list[Example] | None = None

    # -- data --------------------------------------------------------------------------------------

    def _rows(self, which: str) -> Iterable[dict]:
        getter = getattr(self.vf, "get_dataset" if which == "train" else "get_eval_dataset", None)
        if getter is not None:
            try:
                return getter()
            except (ValueError, AttributeError):
                pass
        data = getattr(self.vf, "dataset" if which == "train" else "eval_dataset", None)
        return data if data is not None else []

    def _to_example(self, row: dict) -> Example:
        prompt = row.get("prompt")
        if not isinstance(prompt, list):
            text = row.get("question", prompt if isinstance(prompt, str) else "")
            prompt = []
            system = getattr(self.vf, "system_prompt", None)
            if system:
                prompt.append({"role": "system", "content": system})
            prompt += list(getattr(self.vf, "few_shot", None) or [])
            prompt.append({"role": "user", "content": str(text)})
        info = {"info": row.get("info") or {}, "task": row.get("task")}
        target = row.get("completion") if isinstance(row.get("completion"), str) else row.get("target")
        answer = row.get("answer")
        return Example(
            prompt=[dict(m) for m in prompt],
            answer=None if answer is None else str(answer),
            target=target if isinstance(target, str) else None,
            info=info,
        )

    def train_examples(self) -> list[Example]:
        if self._train is None:
            self._train = [self._to_example(dict(r)) for r in self._rows("train")]
        return self._train

    def eval_examples(self) -> list[Example]:
        if self._eval is None:
            self._eval = [self._to_example(dict(r)) for r in self._rows("eval")]
        return self._eval

    def tools(self):
        return self._tools

    # -- rewards -----------------------------------------------------------------------------------

    def _funcs(self) -> list[tuple[Callable, float]]:
        r = self.rubric
        if r is None:
            return []
        funcs = r._get_reward_funcs() if hasattr(r, "_get_reward_funcs") else list(getattr(r, "funcs", []) or [])
        weights = r._get_reward_weights() if hasattr(r, "_get_reward_weights") else list(getattr(r, "weights", []) or [])
        weights = list(weights) + [1.0] * (len(funcs) - len(weights))
        out = []
        for fn, w in zip(funcs, weights, strict=False):
            try:
                params = set(inspect.signature(fn).parameters)
            except (TypeError, ValueError):
                params = set()
            if params & _GROUP_ARGS:
                log.warning("verifiers reward %s scores whole groups; autoslm skips it", getattr(fn, "__name__", fn))
                continue
            out.append((fn, float(w)))
        return out

    def _objects(self, example: Example, completion: Messages) -> dict[str, Any]:
        info = example.info.get("info", {}) if isinstance(example.info, dict) else {}
        task = example.info.get("task") if isinstance(example.info, dict) else None
        state = {
            "prompt": example.prompt,
            "completion": completion,
            "answer": example.answer or "",
            "info": info,
            "task": task,
            "responses": [],
            "turn": 1,
        }
        objects = dict(getattr(self.rubric, "class_objects", None) or {})
        if self.parser is not None:
            objects.setdefault("parser", self.parser)
        objects.update(
            prompt=example.prompt, completion=completion, answer=example.answer or "", info=info, task=task, state=state
        )
        return objects

    def _call(self, fn: Callable, example: Example, completion: Messages) -> float:
        objects = self._objects(example, completion)
        try:
            sig = inspect.signature(fn)
            if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                kwargs = objects
            else:
                kwargs = {k: v for k, v in objects.items() if k in sig.parameters}
            return float(_run(fn(**kwargs)))
        except Exception as e:  # noqa: BLE001 - verifiers itself scores a failing reward function 0
            log.warning("verifiers reward %s failed (%s: %s); scored 0", getattr(fn, "__name__", fn), type(e).__name__, e)
            return 0.0

    def reward_functions(self):
        out = []
        for fn, weight in self._funcs():
            out.append((getattr(fn, "__name__", "reward"), self._wrap(fn), weight))
        return out

    def _wrap(self, fn: Callable) -> Callable:
        def score(example: Example, messages: Messages) -> float:
            tail = messages[len(example.prompt) :] if messages[: len(example.prompt)] == example.prompt else messages
            return self._call(fn, example, tail)

        score.takes_messages = True  # verifiers functions read the completion as messages
        score.__name__ = getattr(fn, "__name__", "reward")
        return score

    def reward(self, example: Example, completion: str) -> float:
        return self.reward_messages(example, [*example.prompt, {"role": "assistant", "content": completion}])

    def reward_messages(self, example: Example, messages: Messages) -> float:
        funcs = self._funcs()
        if not funcs:
            raise NotImplementedError(f"{self.name} has no reward functions")
        tail = messages[len(example.prompt) :] if messages[: len(example.prompt)] == example.prompt else messages
        total = sum(w for _, w in funcs) or 1.0
        return sum(w * self._call(fn, example, tail) for fn, w in funcs) / total
