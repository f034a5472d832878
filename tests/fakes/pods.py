"""Pod requests with neutral defaults for the providers' tests: what controller/podspec.py builds for an
attempt (``PodRequest``) and placement for a JobSpec's compute (``GpuWish``), with each vendor's options
written as a JobSpec writes them and validated by that vendor's own model."""

from __future__ import annotations

from autoslm.providers import VENDORS
from autoslm.providers.base import GpuWish, PodRequest


def gpu_wish(*, options: dict[str, dict] | None = None, **fields) -> GpuWish:
    """A wish; ``options``: vendor name -> its table, as ``[compute.options.<vendor>]`` says it."""
    validated = {name: VENDORS[name].options_type().model_validate(table) for name, table in (options or {}).items()}
    return GpuWish(options=validated, **fields)


def pod_request(
    name: str,
    command: list[str],
    env: dict[str, str] | None = None,
    *,
    image: str | None = "img:1",
    bootstrap: bool = False,
    deadline: float | None = None,
    serving=None,
    log_path: str | None = None,
    options: dict[str, dict] | None = None,
    **wish,
) -> PodRequest:
    """A request for one pod; every other keyword is the wish's (``gpu_types``, ``interruptible``, ...)."""
    return PodRequest(
        name=name,
        command=list(command),
        env=dict(env or {}),
        wish=gpu_wish(options=options, **wish),
        image=image,
        bootstrap=bootstrap,
        deadline=deadline,
        serving=serving,
        log_path=log_path,
    )
