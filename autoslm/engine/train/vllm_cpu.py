"""Colocated vLLM on a CPU host (vLLM's CPU build, ``train.vllm.enabled = true``): what differs from a GPU.

vLLM 0.31's CPU backend packs every linear layer's weight into a oneDNN (or sgl) kernel handle once the
model is loaded and drops the original parameter (``layers/utils.dispatch_cpu_unquantized_gemm``,
``remove_weight=True``). TRL's colocated weight sync calls ``model.load_weights`` on that model, which
then finds a parameter without a weight loader, and even a successful copy would not reach the packed
kernels. vLLM's own in-place reload (``model_runner.reload_weights``) brackets the load with
``initialize_layerwise_reload`` / ``finalize_layerwise_reload``: the layers get their loadable parameters
back, take the new weights, and are packed again. ``layerwise_reload`` is that bracket;
``engine.train.trainer.CpuVLLMGeneration`` puts TRL's sync inside it. On a GPU none of this applies (the
weights stay plain parameters) and nothing here is used. This module never touches a TRL object.

``CPU_ENGINE_ARGS`` start the engine eager (no torch.compile): on a CPU vLLM compiles the model with
inductor's C++ backend at start-up, minutes of compiler work on a small machine for a model whose
generation is dominated by per-token overhead, not kernels.
"""

from __future__ import annotations

from contextlib import contextmanager

# The colocated engine's extra arguments on a CPU host (engine.train.trainer passes them to vLLM's LLM).
CPU_ENGINE_ARGS = {"enforce_eager": True}


@contextmanager
def layerwise_reload(runner):
    """vLLM's reload bracket around new weights loaded into ``runner``'s (a vLLM model runner's) model."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    model = runner.model
    initialize_layerwise_reload(model)
    try:
        yield
    finally:
        finalize_layerwise_reload(model, runner.model_config)
