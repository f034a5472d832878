"""Status objects (autoslm/controller/status.py) with neutral defaults, for view tests that start from
how a run looks rather than from its records: give only the fields the test is about."""

from __future__ import annotations

from autoslm.controller.state import EndReason, RunState
from autoslm.controller.status import RunStatus, SeedStatus


def _typed(fields: dict) -> dict:
    """States and end reasons as the SDK gives them (enums), from their words."""
    reason = fields.get("end_reason")
    return {**fields, "state": RunState(fields["state"]), "end_reason": EndReason(reason) if reason else None}


def seed_status(**fields) -> SeedStatus:
    base = dict(
        seed=0,
        state="running",
        step=0,
        total_steps=0,
        provider=None,
        pod_id=None,
        gpu=None,
        restarts=0,
        attempt=1,
        cost_usd=0.0,
        stage=None,
        message=None,
        loss=None,
        last_heartbeat_age_s=None,
        error=None,
        end_reason=None,
    )
    return SeedStatus(**_typed({**base, **fields}))


def run_status(*, seeds=(), **fields) -> RunStatus:
    base = dict(
        run_id="r",
        state="running",
        phase="sft",
        step=0,
        total_steps=0,
        provider=None,
        pod_id=None,
        restarts=0,
        cost_usd=None,
        last_heartbeat_age_s=None,
        adapter=None,
        error=None,
        store="file:///x",
    )
    return RunStatus(**_typed({**base, **fields}), seeds=tuple(seed_status(**s) if isinstance(s, dict) else s for s in seeds))
