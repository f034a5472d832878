"""Environments: where examples come from and how a completion is scored.

``load_environment(spec)`` builds one from ``[environment]``: a built-in task ("autoslm/arith"), a
``jsonl:`` dataset, a Hub dataset ("hf:owner/name"), or a verifiers environment ("owner/name").
"""

from autoslm.envs.base import Environment, Example

__all__ = ["Environment", "Example"]
