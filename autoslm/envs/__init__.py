"""Environments: where examples come from and how a completion is scored.

``task_table.load_task(spec)`` loads ``[environment]`` whole, as a ``LoadedTask`` (the environment, its
judge, the named reward functions, the answer format): a built-in task ("autoslm/arith"), a ``jsonl:``
dataset, a Hub dataset ("hf:owner/name"), or a verifiers environment ("owner/name"), each through its
loader in the task table (``task_table.py``).
"""

from autoslm.envs.base import Environment, Example

__all__ = ["Environment", "Example"]
