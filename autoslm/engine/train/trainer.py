"""The one seam into TRL's private names: autoslm's ``GRPOTrainer`` subclass and the TRL insides it relies
on. (The ``SFTTrainer`` subclass, which overrides nothing private, is ``engine.train.sft_trainer``: an SFT
run never imports TRL's GRPO trainer, nor the experiment trackers TRL's profiling imports with it.)

What autoslm does differently from TRL's trainers is written here as overrides, nowhere else as a
patched instance: the generation batch's steps (``AutoslmGRPOTrainer._generate_and_score_completions``,
in the order its docstring gives), the weights pushed into colocated vLLM (``ExactSyncVLLMGeneration``:
merged out of place, ``engine.train.vllm_sync``) and, on a CPU host, vLLM's layerwise reload around the
push (``CpuVLLMGeneration``, ``engine.train.vllm_cpu``), chosen once by the device, and the colocated
engine let go once training is over (``AutoslmGRPOTrainer.release_generation``). The steps' own logic
lives in the modules that own it (``engine.rollout.turns``, ``engine.train.dynamic_sampling``,
``engine.train.grpo_progress``); they get the trainer's public attributes and hand back numbers, which
only this module writes into TRL's metrics.

``TRL_INSIDES`` lists every private TRL name used here; ``trl_changes`` says which of them the installed
TRL lacks or has changed, and a trainer is not built on such a TRL (its private walk would go on
merging in place, unseen). Nothing outside this module may assign into a TRL object or module.
Torch, TRL and vLLM are imported by the worker only: this module is never imported on the laptop.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from trl import GRPOTrainer
from trl.generation.vllm_generation import VLLMGeneration

from autoslm.engine.train.models import keep_adapter_fp32
from autoslm.errors import FatalWorkerError


@dataclass(frozen=True)
class Inside:
    """One private thing of TRL's: ``module``'s ``name`` (``Class.member`` or a module global). ``params``:
    a method's parameter names, in order, as the pinned TRL has them; ``assigned_in``: for an attribute,
    the class's method that assigns it (``self.<attr> =``); ``needs``: a package without which TRL lacks it."""

    module: str
    name: str
    params: tuple[str, ...] | None = None
    assigned_in: str | None = None
    needs: str | None = None

    def problem(self) -> str | None:
        """None when the installed TRL has this as pinned; else one line naming what changed."""
        if self.needs is not None and importlib.util.find_spec(self.needs) is None:
            return None
        try:
            obj = importlib.import_module(self.module)
        except ImportError as e:
            return f"{self.module}: does not import ({e})"
        owner, _, member = self.name.rpartition(".")
        for part in [owner] if owner else []:
            obj = getattr(obj, part, None)
            if obj is None:
                return f"{self.module}.{self.name}: {self.module} has no {part}"
        if self.assigned_in is not None:
            method = getattr(obj, self.assigned_in, None)
            if method is None or f"self.{member} =" not in inspect.getsource(method):
                return f"{self.module}.{self.name}: {owner}.{self.assigned_in} no longer sets it"
            return None
        target = getattr(obj, member, None)
        if target is None:
            return f"{self.module}.{self.name}: missing"
        if self.params is not None:
            have = tuple(inspect.signature(target).parameters)
            if have != self.params:
                return f"{self.module}.{self.name}: parameters are ({', '.join(have)}), pinned ({', '.join(self.params)})"
        return None


_GRPO, _VG = "trl.trainer.grpo_trainer", "trl.generation.vllm_generation"
# Every private TRL name (and the module globals) this module overrides, calls, reads or replaces.
TRL_INSIDES = (
    Inside(_GRPO, "GRPOTrainer._generate_and_score_completions", ("self", "inputs")),
    Inside(_GRPO, "GRPOTrainer._metrics", assigned_in="__init__"),
    Inside(_GRPO, "GRPOTrainer._logs", assigned_in="__init__"),
    Inside(_GRPO, "GRPOTrainer._last_loaded_step", assigned_in="__init__"),
    Inside(_GRPO, "GRPOTrainer._tokenizer", assigned_in="__init__"),
    Inside(_GRPO, "GRPOTrainer.vllm_generation", assigned_in="__init__"),
    Inside(_GRPO, "VLLMGeneration"),  # the class GRPOTrainer.__init__ builds: ours while it runs
    Inside(_VG, "VLLMGeneration._iter_named_params", ("self",)),
    Inside(_VG, "VLLMGeneration._fix_param_name_to_vllm", ("self", "name", "extra_prefixes")),
    Inside(_VG, "VLLMGeneration.sync_weights", ("self",)),
    Inside(_VG, "VLLMGeneration.generate", ("self", "prompts", "images", "num_generations", "profiler")),
    Inside(_VG, "VLLMGeneration._dist", assigned_in="__init__"),
    Inside(_VG, "VLLMGeneration.llm", assigned_in="_init_vllm"),
    Inside(_VG, "LLM", needs="vllm"),  # the engine class VLLMGeneration starts: extra arguments while it runs
)


def trl_changes() -> list[str]:
    """One line per private TRL name that the installed TRL lacks or has changed."""
    return [p for p in (inside.problem() for inside in TRL_INSIDES) if p is not None]


def refuse_changed_trl() -> None:
    """Stop before a trainer is built on a TRL whose private names are not the pinned ones."""
    changes = trl_changes()
    if changes:
        raise FatalWorkerError(
            "this TRL is not the one autoslm's trainer was written against: " + "; ".join(changes),
            hint="install the worker's pinned trl (worker_image/requirements-gpu.txt)",
        )


class ExactSyncVLLMGeneration(VLLMGeneration):
    """TRL's colocated vLLM, pushing each LoRA layer's weight merged out of place (``engine.train.vllm_sync``):
    the base weights are never written. TRL's own walk stays for a model without LoRA or sharded weights."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prepare_exact_sync()

    def prepare_exact_sync(self) -> bool:
        """Decide once which walk pushes the weights; True when the out-of-place merge does."""
        from autoslm.engine.train.vllm_sync import exact_layers

        self.autoslm_layers = exact_layers(self.model, sharded=self._dist.is_fsdp or self._dist.is_zero3)
        return self.autoslm_layers is not None

    def _iter_named_params(self):
        if self.autoslm_layers is None:
            yield from super()._iter_named_params()
            return
        from autoslm.engine.train.vllm_sync import merged_named_params

        yield from merged_named_params(self.model, self._fix_param_name_to_vllm, self.autoslm_layers)


class CpuVLLMGeneration(ExactSyncVLLMGeneration):
    """On a CPU host the push runs inside vLLM's layerwise reload (``engine.train.vllm_cpu``)."""

    def sync_weights(self):
        from autoslm.engine.train.vllm_cpu import layerwise_reload

        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        with layerwise_reload(runner):
            super().sync_weights()
        self.llm.reset_prefix_cache()  # after the repack: nothing cached from the old weights is reused


@contextmanager
def _trl_builds(generation: type, llm_kwargs: dict):
    """While GRPOTrainer.__init__ runs (and only then): it builds ``generation`` instead of TRL's
    VLLMGeneration, whose colocated ``LLM`` gets ``llm_kwargs`` (TRL 1.16 passes a fixed list of engine
    arguments and has no way to add one)."""
    grpo_module = importlib.import_module(_GRPO)
    vg_module = importlib.import_module(_VG)
    saved = grpo_module.VLLMGeneration, getattr(vg_module, "LLM", None)
    grpo_module.VLLMGeneration = generation
    if llm_kwargs:
        vg_module.LLM = functools.partial(saved[1], **llm_kwargs)
    try:
        yield
    finally:
        grpo_module.VLLMGeneration = saved[0]
        if llm_kwargs:
            vg_module.LLM = saved[1]


@contextmanager
def generation_oom_fatal(error: Callable[[int], Exception] | None, batch: int) -> Iterator[None]:
    """A CUDA out-of-memory error (recognised by its class name) while a batch of ``batch`` completions is
    generated becomes ``error(batch)``; anything else passes through as it was."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only CUDA's out-of-memory error is turned fatal
        if error is None or not any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__):
            raise
        raise error(batch) from None


@dataclass(frozen=True)
class GenerationSteps:
    """What autoslm does around TRL's generation batch; None: that step is off.

    ``shaping(trainer, batch) -> metrics``: the multi-turn shaping (``turns.TurnShaping``), in place.
    ``sampling(trainer, inputs, generate) -> batch``: dynamic sampling (``dynamic_sampling.DynamicSampling``), which
    calls ``generate`` for the step's batch and for each fresh draw.
    ``halving(generate) -> generate``: the batch generated again in halves after an out-of-memory error
    (``engine.rollout.halving``), made once per trainer around steps 3-4 (it keeps the smaller size).
    ``oom(batch_size) -> exception``: what a CUDA out-of-memory error while generating ends the run with.
    ``advantages(batch) -> metrics``: the advantage numbers TRL does not log."""

    shaping: Callable | None = None
    sampling: Callable | None = None
    halving: Callable[[Callable], Callable] | None = None
    oom: Callable[[int], Exception] | None = None
    advantages: Callable | None = None


class AutoslmGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with autoslm's generation steps and weight push (see the module docstring).

    ``steps``: the generation batch's steps; ``cuda``: the device, which chooses the vLLM class (a CPU
    host reloads layerwise); ``llm_kwargs``: extra arguments for the colocated engine; ``summary``: what
    ``autoslm_metrics`` reports from the trainer's log history."""

    def __init__(
        self,
        *,
        steps: GenerationSteps = GenerationSteps(),
        cuda: bool = True,
        llm_kwargs: dict | None = None,
        summary: Callable[[list[dict]], dict] | None = None,
        **kwargs,
    ):
        refuse_changed_trl()
        self.autoslm_steps = steps
        self.autoslm_rows: list | None = None
        self._autoslm_generate = steps.halving(self._autoslm_batch) if steps.halving else self._autoslm_batch
        self._autoslm_summary = summary
        generation = ExactSyncVLLMGeneration if cuda else CpuVLLMGeneration
        with _trl_builds(generation, dict(llm_kwargs or {})):
            super().__init__(**kwargs)
        keep_adapter_fp32(self.model)  # TRL casts a 4-bit model's LoRA weights to bf16

    def _generate_and_score_completions(self, inputs):
        """One generation batch, its steps in this order (each sees what the one before it made):

        1. TRL generates and scores the batch; the rows being generated are ``autoslm_rows`` meanwhile
           (a multi-turn rollout finds each prompt's example there);
        2. multi-turn shaping drops over-length episodes and weighs turns (``steps.shaping``);
        3. dynamic sampling replaces all-equal groups with fresh ones, running 1-2 for each draw
           (``steps.sampling``);
        4. the advantage numbers of the batch that trains are logged (``steps.advantages``);
        around 1-4, a batch that runs out of GPU memory is generated again in halves (``steps.halving``),
        and around all of them, an out-of-memory error that halving cannot help ends the run (``steps.oom``)."""
        with generation_oom_fatal(self.autoslm_steps.oom, len(inputs)):
            return self._autoslm_generate(inputs)

    def _autoslm_batch(self, inputs):
        """Steps 1-4 of ``_generate_and_score_completions`` for one batch (or one part of a halved one)."""
        steps = self.autoslm_steps
        batch = steps.sampling(self, inputs, self._shaped_batch) if steps.sampling else self._shaped_batch(inputs)
        if steps.advantages is not None:
            self.log_step_metrics(steps.advantages(batch))
        return batch

    def _shaped_batch(self, inputs):
        """Steps 1 and 2 of ``_generate_and_score_completions``."""
        self.autoslm_rows = list(inputs)
        try:
            batch = super()._generate_and_score_completions(inputs)
        finally:
            self.autoslm_rows = None
        if self.autoslm_steps.shaping is not None:
            self.log_step_metrics(self.autoslm_steps.shaping(self, batch))
        return batch

    def log_step_metrics(self, metrics: dict[str, float]) -> None:
        """Append to TRL's numbers for this step (its "train" or "eval" log, by the model's mode)."""
        store = self._metrics["train" if self.model.training else "eval"]
        for key, value in metrics.items():
            store[key].append(value)

    def recent_completions(self, window: int) -> dict[str, list]:
        """The latest ``window`` completions TRL kept for its completion log: {"completion": [...],
        "rewards": {name: [...]}, "extra": {key: [...]}} (empty when it kept none)."""
        logs = self._logs
        if not logs or not logs.get("completion"):
            return {}
        return {
            "completion": list(logs["completion"])[-window:],
            "rewards": {k: list(v)[-window:] for k, v in logs.get("rewards", {}).items()},
            "extra": {k: list(v)[-window:] for k, v in logs.get("extra", {}).items()},
        }

    def autoslm_metrics(self) -> dict:
        """The run's summary numbers from the trainer's log history (a resumed run restores it)."""
        return self._autoslm_summary(self.state.log_history) if self._autoslm_summary else {}

    def release_generation(self) -> None:
        """Let go of the colocated vLLM engine once training is over, so that its GPU memory can be given
        back (lm-evaluation-harness after the hand-back starts an engine of its own)."""
        vg = getattr(self, "vllm_generation", None)
        if vg is not None and getattr(vg, "llm", None) is not None:
            vg.llm = None


def vllm_generate(trainer, contexts: list[list[int]], max_new_tokens: int, temperature: float | None = None):
    """(token ids, per-token log-probs) per context from ``trainer``'s colocated vLLM, the policy's weights
    pushed first when a step has passed since the last push (TRL's own bookkeeping, ``_last_loaded_step``,
    so TRL does not push them again); TRL's budget and temperature are left as they were."""
    vg = trainer.vllm_generation
    step = trainer.state.global_step
    if getattr(trainer, "_last_loaded_step", None) != step:
        vg.sync_weights()
        trainer._last_loaded_step = step
    saved = (vg.max_completion_length, vg.temperature)
    vg.max_completion_length = max_new_tokens
    if temperature is not None:
        vg.temperature = temperature
    try:
        _, ids, logps, _ = vg.generate(prompts=[list(c) for c in contexts], images=None, num_generations=1)
    finally:
        vg.max_completion_length, vg.temperature = saved
    return ids, logps


def trainer_tokenizer(trainer):
    """The tokenizer ``trainer`` generates with: TRL's own (``_tokenizer``, a processor's tokenizer), else
    its ``processing_class`` (a stand-in trainer without TRL's attributes)."""
    return getattr(trainer, "_tokenizer", None) or trainer.processing_class


__all__ = [
    "TRL_INSIDES",
    "AutoslmGRPOTrainer",
    "CpuVLLMGeneration",
    "ExactSyncVLLMGeneration",
    "GenerationSteps",
    "generation_oom_fatal",
    "refuse_changed_trl",
    "trl_changes",
    "trainer_tokenizer",
    "vllm_generate",
]
