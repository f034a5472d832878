"""A generation batch that runs out of GPU memory is generated again in halves (engine/rollout/halving.py)."""

from __future__ import annotations

import pytest

from autoslm.engine.rollout.halving import HalvingGeneration


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError (recognised by its class name)."""


class Generator:
    """Generates (echoes) up to ``fits`` inputs at once; more raises OutOfMemoryError. Records each call."""

    def __init__(self, fits: int):
        self.fits, self.calls = fits, []

    def __call__(self, inputs):
        self.calls.append(len(inputs))
        if len(inputs) > self.fits:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return list(inputs)


def halving(gen, group=4, **kw):
    said, freed = [], []
    h = HalvingGeneration(
        gen,
        lambda parts: [x for p in parts for x in p],
        group,
        on_halve=lambda old, new: said.append((old, new)),
        free=lambda: freed.append(1),
        **kw,
    )
    return h, said, freed


def test_an_oom_halves_the_batch_in_whole_groups_keeps_the_size_and_says_so_once():
    gen = Generator(fits=20)
    h, said, freed = halving(gen)
    batch = list(range(64))
    assert h(batch) == batch  # every completion, in order
    assert gen.calls == [64, 32, 16, 16, 16, 16] and said == [(64, 32)] and len(freed) == 2 and h.size == 16
    gen.calls.clear()
    assert h(batch) == batch and gen.calls == [16] * 4  # the next step starts at the size that fits
    assert said == [(64, 32)]


def test_sizes_stay_whole_groups():
    gen = Generator(fits=14)
    h, said, _ = halving(gen, group=3)
    assert h(list(range(30))) == list(range(30))
    assert gen.calls == [30, 15, 6, 6, 6, 6, 6] and said == [(30, 15)]


def test_no_split_below_a_group_across_processes_or_for_other_errors():
    h, said, _ = halving(Generator(fits=2), group=4)
    with pytest.raises(OutOfMemoryError):
        h(list(range(16)))
    assert said == [(16, 8)]
    gen = Generator(fits=8)
    h, said, _ = halving(gen, group=4, can_split=False)
    with pytest.raises(OutOfMemoryError):
        h(list(range(16)))
    assert gen.calls == [16] and not said

    def broken(inputs):
        raise ValueError("not memory")

    h, said, _ = halving(broken)
    with pytest.raises(ValueError):
        h(list(range(16)))
    assert not said


def test_the_trainer_generates_in_halves_and_merges_its_outputs(tmp_path):
    """Through the GRPO trainer's halving step (``generation_steps``): TRL-shaped outputs (left-padded
    prompts, right-padded completions) merged back into one batch, the halving said once as an event."""
    import torch

    from autoslm.engine.train.grpo import generation_steps
    from autoslm.engine.train.print_config import pod_device
    from autoslm.recipes.batching import plan_grpo_batches
    from tests.unit.test_memory_agree import _no_vllm_spec

    spec = _no_vllm_spec(tmp_path)
    device = pod_device(spec, "cuda", "RTX 4090", vllm=False)
    plan = plan_grpo_batches(spec.train.model_copy(update={"micro_batch_size": 8}), 1, 2)
    group = plan.group_size
    events = []

    class Reporter:
        def event(self, kind, **data):
            events.append((kind, data))

    class Trainer:
        def __init__(self):
            self.calls = []

        def _generate_and_score_completions(self, inputs):
            self.calls.append(len(inputs))
            if len(inputs) > 2 * group:
                raise OutOfMemoryError("CUDA out of memory")
            n, width = len(inputs), 3 + len(self.calls)  # each part pads to its own width
            return {
                "prompt_ids": torch.full((n, 2), 7),
                "completion_ids": torch.arange(n).unsqueeze(1).repeat(1, width),
                "completion_mask": torch.ones(n, width, dtype=torch.long),
                "advantages": torch.tensor(inputs, dtype=torch.float),
            }

    trainer = Trainer()
    steps = generation_steps(spec, device, plan, "transformers", Reporter(), rollout=None, drop_over_length=False)
    out = steps.halving(trainer._generate_and_score_completions)(list(range(4 * group)))
    assert out["advantages"].tolist() == list(range(4 * group))
    assert out["completion_ids"].shape[0] == 4 * group and out["prompt_ids"].shape == (4 * group, 2)
    assert [k for k, _ in events] == ["generation_batch_halved"] and events[0][1]["now"] == 2 * group
