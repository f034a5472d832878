"""Several training processes per pod: which rank does what, the few collectives, and how the Trainer
runs over the ranks (DDP or FSDP, the adapter gathered and saved once).

With ``compute.gpu_count = N > 1`` the worker the provider started becomes a launcher
(engine/rank_launcher.py): it starts N copies of itself, one rank per GPU, or N CPU processes over
gloo on a machine without CUDA. Inside the ranks,
transformers' Trainer trains data parallel through accelerate: DDP, or FSDP when
``compute.strategy = "fsdp"``. With ``compute.nodes = K > 1`` each pod's worker launches its own
ranks and the K launchers meet at the primary (engine/nodes.py, engine/rank_launcher.py); an outside
``torchrun`` can start the same ranks. A worker that finds RANK/WORLD_SIZE in its environment is a rank.

Who does what:
- Only rank 0 talks to the store: heartbeats, events, checkpoints, adapter, metrics, DONE. The other
  ranks get a ``NullUploader``. What the store says (DONE, the newest checkpoint, an earlier run's
  adapter, train_meta) is read on rank 0 and broadcast (``Ranks.on_main``), so every rank resumes from
  the same checkpoint, which rank 0 fetched into the ranks' shared working directory; on several pods
  each pod's local rank 0 fetches that same step into its own (``Ranks.on_each_node``).
- Each rank leaves its RNG state in each checkpoint; on several pods rank 0 gathers the other pods'
  (``gather_rng_states``) before the checkpoint goes to the store, so a resumed run on other machines
  continues as it would have.
- Every rank evaluates its share of the held-out rows (rows rank, rank + N, ...; under FSDP the forward
  passes are collective), and every rank gathers the whole result (``Ranks.gather``).
- The launcher writes a heartbeat before the ranks start and, when one fails, the error: the elastic
  agent stops every other rank, and the error names the first rank that failed and its message, which
  each rank leaves in its elastic error file (``rank_launcher.record_failure``).
- A rank dies with its launcher (parent-death signal, and a watchdog thread where there is none), so a
  killed pod process never leaves ranks writing to the store.

It must never read a training knob from the environment (RANK, WORLD_SIZE and friends only say which
rank this is), and nothing the launcher imports from here may import transformers.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from autoslm.errors import FatalWorkerError, WorkerError

T = TypeVar("T")


class FollowerError(WorkerError):
    """A rank failed only because rank 0 did (rank 0 reports the cause)."""


@dataclass(frozen=True)
class Ranks:
    """Which training process this is. ``Ranks()`` is the single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 0  # ranks on this pod; 0: all of them (one pod)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Ranks":
        try:
            world = int(env.get("WORLD_SIZE") or 1)
            if world <= 1 or "RANK" not in env:
                return cls()
            rank = int(env["RANK"])
            local_world = int(env.get("LOCAL_WORLD_SIZE") or world)
            return cls(rank, world, int(env.get("LOCAL_RANK") or rank), 0 if local_world >= world else local_world)
        except ValueError:
            raise FatalWorkerError(
                f"bad RANK/WORLD_SIZE/LOCAL_RANK in the environment: {env.get('RANK')!r}/{env.get('WORLD_SIZE')!r}"
            ) from None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def several_nodes(self) -> bool:
        """The ranks span several pods, each with its own disk."""
        return 0 < self.local_world_size < self.world_size

    @property
    def is_local_main(self) -> bool:
        """This pod's first rank: it fetches what its pod's ranks read from disk."""
        return self.local_rank == 0

    def __str__(self) -> str:
        return f"rank {self.rank}/{self.world_size}"

    # -- collectives (no-ops in a single process) -------------------------------------------------
    def join(self, cuda: bool) -> str | None:
        """Join the process group through accelerate's PartialState (the state the Trainer then uses);
        returns the backend ("gloo" on CPU, "nccl" on CUDA), None for a single process."""
        if not self.distributed:
            return None
        import torch.distributed as td
        from accelerate import PartialState

        state = PartialState(cpu=not cuda)
        return td.get_backend() if td.is_initialized() else str(state.backend)

    def on_main(self, fn: Callable[[], T]) -> T:
        """``fn()`` on rank 0 only (a store read), its result broadcast to every rank."""
        if not self.distributed:
            return fn()
        import torch.distributed as td

        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn())
            except BaseException as e:
                box[0] = ("error", type(e).__name__)
                td.broadcast_object_list(box, src=0)  # the others must not wait for an answer that never comes
                raise
        td.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise FollowerError(f"rank 0 failed ({value}); it reports why")
        return value

    def on_each_node(self, decide: Callable[[], T], fetch: Callable[[T], None]) -> T:
        """``decide()`` on rank 0 (a store read that may write this pod's disk), broadcast; then, on
        several pods, ``fetch(decided)`` on every other pod's local rank 0, so each pod's disk holds
        what rank 0's does, before any rank goes on."""
        decided = self.on_main(decide)
        if not self.several_nodes:
            return decided
        failed: BaseException | None = None
        if self.is_local_main and not self.is_main and decided is not None:
            try:
                fetch(decided)
            except BaseException as e:  # noqa: BLE001 - raised below, once every rank knows
                failed = e
        if self.any(failed is not None):
            if failed is not None:
                raise failed
            raise FollowerError("a node could not fetch what rank 0 decided; it reports why")
        return decided

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value``, by rank, on every rank (a split evaluation's rows)."""
        if not self.distributed:
            return [value]
        import torch.distributed as td

        out: list[Any] = [None] * self.world_size
        td.all_gather_object(out, value)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any (so all ranks stop at the same step)."""
        if not self.distributed:
            return bool(flag)
        return self.sum(int(bool(flag))) > 0

    def sum(self, value: int) -> int:
        if not self.distributed:
            return int(value)
        import torch
        import torch.distributed as td

        device = torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([int(value)], dtype=torch.long, device=device)
        td.all_reduce(t)
        return int(t.item())

    def leave(self) -> None:
        """Leave the process group before exit (gloo torn down at interpreter exit can abort the process)."""
        if not self.distributed:
            return
        try:
            import torch.distributed as td

            if "vllm" in sys.modules:
                # Colocated vLLM keeps groups built on this process group, and its exit hook destroys
                # them: let it go first, or that hook fails on a group already gone.
                from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

                destroy_model_parallel()
                destroy_distributed_environment()
            if td.is_initialized():
                td.destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as td

            td.barrier()


def gather_rng_states(ranks: Ranks, ckpt: Path) -> None:
    """On several pods: every rank's ``rng_state_<rank>.pth`` (transformers writes each rank's into its
    own pod's copy of the checkpoint) into rank 0's copy, the one uploaded, so a run resumed on other
    machines draws as it would have. Every rank calls it; on one pod the ranks share the folder."""
    if not ranks.several_nodes:
        return
    import torch.distributed as td

    own = ckpt / f"rng_state_{ranks.rank}.pth"
    # Rank 0's pod holds ranks 0..local_world_size-1 (global rank = node x ranks per pod + local rank).
    mine = own.read_bytes() if ranks.rank >= ranks.local_world_size and own.is_file() else None
    states: list[Any] | None = [None] * ranks.world_size if ranks.is_main else None
    td.gather_object(mine, states, dst=0)
    if states is None:
        return
    for rank, data in enumerate(states):
        if data is not None:
            (ckpt / f"rng_state_{rank}.pth").write_bytes(data)


def world_size(spec) -> int:
    """Training processes of one replica: one per GPU of each of its pods (``compute.nodes x gpu_count``)."""
    return int(spec.compute.ranks)


def process_count(spec) -> int:
    """Processes that share each step: the world size when this is a rank (an outside ``torchrun`` over
    several nodes makes it nodes x gpu_count), else compute.gpu_count."""
    # Ranks.from_env, not WORLD_SIZE alone: RunPod's Instant Clusters set WORLD_SIZE in every container.
    ranks = Ranks.from_env(dict(os.environ))
    return ranks.world_size if ranks.distributed else world_size(spec)


def should_launch(spec, ranks: Ranks) -> bool:
    """This process starts the ranks (it is not one itself) when the spec asks for several."""
    return spec is not None and world_size(spec) > 1 and not ranks.distributed


# ---------------------------------------------------------------------------------------------------
# Inside a rank


class NullUploader:
    """What a rank other than 0 has instead of an uploader: it writes nothing anywhere."""

    lost: list[str] = []

    def start(self) -> "NullUploader":
        return self

    def heartbeat(self, hb) -> None:
        pass

    def event(self, ev) -> None:
        pass

    def checkpoint(self, step, local_dir, keep=2, *, final=False) -> None:
        pass

    def best(self, step, local_dir, record) -> None:
        pass

    def required(self, fn, what, timeout) -> None:
        pass

    def close(self, timeout: float) -> bool:
        return True


def die_with_launcher(poll_s: float = 1.0) -> None:
    """Make this rank die when the process that started it does (a killed pod process, SIGKILL)."""
    parent = os.getppid()
    try:  # Linux: the kernel sends SIGKILL the moment the parent dies
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the signal was armed (never test for pid 1: a launcher may be it)
        os.kill(os.getpid(), signal.SIGKILL)

    def watch():  # everywhere else (and belt and braces): poll
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="autoslm-parent-watch", daemon=True).start()


def probe_device(index: int) -> None:
    """Run one kernel on this rank's own GPU (probing every GPU from every rank would leave a CUDA
    context, hundreds of MB, on each GPU per rank)."""
    import torch

    with torch.cuda.device(index):
        x = torch.ones(256, 256, device=f"cuda:{index}")
        if float((x @ x).sum()) != 256.0**3:
            raise RuntimeError(f"cuda:{index} computed a wrong result")


def plain_cpu_device(trainer) -> None:
    """On CPU ranks accelerate's device is ``cpu:0``; transformers 5.17 (the worker image's) loads a
    resumed optimizer with ``map_location=args.device``, and torch.load cannot restore to "cpu:0".
    Plain "cpu" is the same place, so the resumed run loads (5.24 maps to "cpu" itself)."""
    import torch

    device = trainer.args.device
    if device.type == "cpu" and device.index is not None:
        trainer.args.__dict__["_setup_devices"] = torch.device("cpu")  # TrainingArguments caches it there


def trainable_state_dict(trainer) -> dict:
    """The trainable (LoRA) weights, whole, on the CPU: under FSDP every rank must call it (it gathers
    their shards); the frozen base weights are never gathered."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(trainer.model_wrapped, options=options)


def save_adapter(trainer, adapter_dir: Path, ranks: Ranks, strategy: str = "ddp") -> None:
    """The trained adapter, written once (rank 0). Under FSDP every rank joins in gathering the LoRA
    weights (only those: a 32B model's base would be ~65 GB on rank 0)."""
    if strategy == "fsdp" and ranks.distributed:
        state = trainable_state_dict(trainer)
        if ranks.is_main:
            trainer.model.save_pretrained(str(adapter_dir), state_dict=state)
    elif ranks.is_main:
        save_trained_adapter(trainer.model, adapter_dir)
    ranks.barrier()


def save_trained_adapter(model, adapter_dir: Path) -> None:
    """The PEFT model's trained adapter, from one process."""
    # GRPO with beta > 0 on a continued adapter trains beside a frozen copy of it (TRL's "ref"
    # adapter, the KL anchor): only the trained one is handed back.
    peft_config = getattr(model, "peft_config", None) or {}
    only = {"selected_adapters": ["default"]} if "default" in peft_config and len(peft_config) > 1 else {}
    model.save_pretrained(str(adapter_dir), **only)


def fsdp_adapter_callback(ranks: Ranks):
    """Under FSDP the Trainer's checkpoints hold sharded LoRA state (``SHARDED_STATE_DICT``: nothing whole
    is gathered); this writes the whole adapter (``adapter_model.safetensors``) into each checkpoint too,
    gathered from the trainable weights only, so a checkpoint can be read without the ranks. It must come
    before the callback that uploads the checkpoint."""
    from transformers import TrainerCallback

    class FSDPAdapter(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_save(self, args, state, control, **kw):
            if self.trainer is None:
                return
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            state_dict = trainable_state_dict(self.trainer)
            if ranks.is_main:
                out = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
                self.trainer.model.save_pretrained(str(out), state_dict=state_dict)
            ranks.barrier()

    return FSDPAdapter()


def on_prepared_model(run: Callable[[Any], None]):
    """A callback that calls ``run(model)`` once, when training begins, with the model the Trainer
    prepared. Several processes evaluate there, not before: under FSDP a rank holds only its shard once
    prepared, and before that rank 0 holds a CPU copy and the others empty weights (an evaluation then
    would be slow on rank 0 and meaningless elsewhere). Every rank calls it; ``run`` generates in step
    with the others (``synced``)."""
    from transformers import TrainerCallback

    class OnPreparedModel(TrainerCallback):
        def __init__(self):
            self.called = False

        def on_train_begin(self, args, state, control, model=None, **kw):
            if not self.called:
                self.called = True
                run(model)

    return OnPreparedModel()


def effective_strategy(spec, cuda: bool) -> str:
    """What several processes will run: FSDP needs GPUs (accelerate trains CPU processes with DDP
    whatever is asked, so the worker says so rather than pretend)."""
    return spec.compute.strategy if cuda else "ddp"


def uses_fsdp(spec, cuda: bool) -> bool:
    return process_count(spec) > 1 and effective_strategy(spec, cuda) == "fsdp"


def trainer_kwargs(spec, cuda: bool | None = None, *, checkpointing: bool = False) -> dict[str, Any]:
    """TrainingArguments for several processes (none for one): DDP, or FSDP for ``strategy = "fsdp"``.
    ``cuda``: whether the processes have GPUs (detected when None; ``--print-config`` says it).
    ``checkpointing``: the recipe's activation checkpointing, which FSDP does itself."""
    if process_count(spec) <= 1:
        return {}
    if cuda is None:
        from autoslm.engine.train.training_args import has_cuda

        cuda = has_cuda()
    if effective_strategy(spec, cuda) == "fsdp":
        # FSDP2 shards the frozen base weights and the LoRA weights alike; whole decoder layers are the
        # units (transformers reads them from the model's _no_split_modules). The boolean form of
        # ``fsdp`` (the string "full_shard auto_wrap" is deprecated, gone in transformers 5.20).
        # Activation checkpointing is FSDP's own (TrainingArguments' would add an all-gather per layer
        # in the backward pass; setting both raises). Checkpoints keep sharded state, never the whole
        # model gathered on rank 0; the loading is transformers' rank-0-reads-and-broadcasts
        # (engine/models.py sets what it reads).
        return {
            "fsdp": True,
            "fsdp_config": {
                "version": 2,
                "reshard_after_forward": True,
                "state_dict_type": "SHARDED_STATE_DICT",
                "cpu_ram_efficient_loading": True,
                "activation_checkpointing": bool(checkpointing),
            },
        }
    # LoRA uses every trainable parameter in each forward: skip DDP's search for unused ones.
    return {"ddp_find_unused_parameters": False}
