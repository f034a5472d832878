"""Colocated vLLM on a CPU host (vLLM's CPU build, ``train.vllm.enabled = true``): what differs from a GPU.

vLLM 0.31's CPU backend packs every linear layer's weight into a oneDNN (or sgl) kernel handle once the
model is loaded and drops the original parameter (``layers/utils.dispatch_cpu_unquantized_gemm``,
``remove_weight=True``). TRL's colocated weight sync calls ``model.load_weights`` on that model, which
then finds a parameter without a weight loader, and even a successful copy would not reach the packed
kernels. vLLM's own in-place reload (``model_runner.reload_weights``) brackets the load with
``initialize_layerwise_reload`` / ``finalize_layerwise_reload``: the layers get their loadable parameters
back, take the new weights, and are packed again. ``cpu_weight_sync`` puts TRL's sync inside that bracket.
On a GPU none of this applies (the weights stay plain parameters) and nothing here is used.

``cpu_engine`` starts the engine eager (no torch.compile): on a CPU vLLM compiles the model with
inductor's C++ backend at start-up, minutes of compiler work on a small machine for a model whose
generation is dominated by per-token overhead, not kernels.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager


@contextmanager
def cpu_engine(enabled: bool):
    """While the trainer is built (and only then), TRL's colocated ``LLM`` starts with
    ``enforce_eager=True``: TRL 1.16 passes a fixed list of engine arguments and has no way to add one."""
    if not enabled:
        yield
        return
    from trl.generation import vllm_generation as vg

    original = vg.LLM
    vg.LLM = functools.partial(original, enforce_eager=True)
    try:
        yield
    finally:
        vg.LLM = original


def cpu_weight_sync(trainer) -> None:
    """Make the trainer's colocated vLLM take pushed weights on a CPU host (see the module docstring)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    vg = trainer.vllm_generation
    original = vg.sync_weights
    if getattr(original, "autoslm_cpu_sync", False):
        return

    @functools.wraps(original)
    def sync_weights():
        runner = vg.llm.llm_engine.model_executor.driver_worker.model_runner
        model = runner.model
        initialize_layerwise_reload(model)
        try:
            original()
        finally:
            finalize_layerwise_reload(model, runner.model_config)
        vg.llm.reset_prefix_cache()  # after the repack: nothing cached from the old weights is reused

    sync_weights.autoslm_cpu_sync = True
    vg.sync_weights = sync_weights
