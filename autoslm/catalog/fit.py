"""Whether a run fits one GPU, and at what settings: the one function (``fit_report``) behind the memory
figures of ``autoslm plan``, ``autoslm validate``, ``python -m autoslm.engine --print-config`` and the
worker's own choices, so that all four say the same micro-batch, generation batch, vLLM share, decode
waves and peak. Arithmetic on ``catalog.memory``'s estimates; it never touches a device.

What it chooses, for one training process on a card of ``mem_gib`` (usable: 97% of it):

- the micro-batch: a divisor of the process's share of the step, at most ``MAX_TOKENS_PER_MICRO_BATCH``
  tokens; below ``MIN_TOKENS_PER_MICRO_BATCH`` tokens only when nothing larger fits (a forward pass that
  small leaves a GPU idle). SFT: the largest whose training peak fits 90% of the usable memory.
- GRPO with colocated vLLM: vLLM's share. A number in the spec is taken as it is. "auto" is vLLM's need
  before its KV cache plus KV room for as much of a step's rollouts as fits beside training (all of
  them at most), less ``vllm_headroom_gib``. Between micro-batches the fewer decode waves win, then one
  of at least ``MIN_TOKENS_PER_MICRO_BATCH`` tokens, then the larger. Below ``VLLM_KV_WARN`` of a step's rollouts the report warns with the waves;
  below ``VLLM_KV_MIN`` of them (or one ``max_model_len`` request, whichever is more) "auto" does not fit,
  and the reason says the least memory it would need. Sleep mode ("auto") where vLLM and training cannot
  be awake together at any micro-batch, or where it saves more than ``SLEEP_WAVES`` decode waves.
- GRPO with transformers' generate() (no vLLM on the pod, the 4-bit tier, ``enabled = false``): the
  generation batch, whose KV cache at full length sits beside the weights: the whole step if it fits,
  else split into rounds of whole groups (TRL's ``steps_per_generation``); each round is a decode wave.
- activation checkpointing ("auto"): off where the chosen micro-batch fits without it just as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from autoslm.catalog.gpus import GPUInfo, gpu_info
from autoslm.catalog.memory import (
    VLLM_KV_MIN,
    VLLM_KV_WARN,
    VLLM_MAX_AUTO_SHARE,
    VramEstimate,
    liger_applies,
    resolve_model,
    servable_by_vllm,
    vram_breakdown,
)
from autoslm.catalog.models import ModelInfo

USABLE = 0.97  # the driver and CUDA's own reservations leave about 97% of what the card reports
SFT_USABLE = 0.9  # SFT's micro-batch keeps a tenth of that for allocator fragmentation spikes
# Past ~64k tokens per forward pass a GPU is saturated: bigger micro-batches only cost memory.
MAX_TOKENS_PER_MICRO_BATCH = 65536
# Below ~4k tokens a forward pass of these models underfills the GPU: chosen only when nothing larger fits.
MIN_TOKENS_PER_MICRO_BATCH = 4096
# "auto" sleep mode counts as this many extra decode waves: each step it frees vLLM's weights and KV cache
# for training and makes them again (TRL pushes the weights every step anyway), so it is chosen where it
# saves more than that many waves, or where nothing fits awake.
SLEEP_WAVES = 1
# "auto" leaves this much of the card to nobody: the estimates' error and allocator spikes.
VLLM_HEADROOM = 0.04
VLLM_HEADROOM_MIN_GIB = 1.0


def vllm_headroom_gib(mem_gib: float) -> float:
    return max(VLLM_HEADROOM_MIN_GIB, VLLM_HEADROOM * mem_gib)


@dataclass(frozen=True)
class FitReport:
    """One process of a run on one GPU: does it fit, and the settings the pod runs at."""

    ok: bool | None  # None: the model or GPU is unknown, nobody can tell
    need_gb: float | None  # the peak the pod runs at, GiB
    vram_gb: float | None
    reason: str = ""  # why it does not fit
    sleep_mode: bool = False  # colocated vLLM sleeps while training
    note: str = ""  # a warning that does not stop it: decode waves, a split generation batch
    vllm_util: float | None = None  # the gpu_memory_utilization vLLM gets ("auto" resolved for this card)
    micro: int | None = None  # sequences (GRPO: completions) per forward pass per process
    checkpointing: bool | None = None
    engine: str = ""  # GRPO: "vllm" | "transformers"
    generation_batch: int | None = None  # completions per process per generation call
    generation_rounds: int = 1  # generation calls per optimizer step (transformers; vLLM: 1)
    waves: int = 0  # decode waves per step: vLLM's KV room, or the transformers rounds; 0 for SFT
    kv_fraction: float | None = None  # vLLM: share of a step's rollouts its KV room holds at full length
    share_gb: float = 0.0  # vLLM's share, GiB
    awake_waves: int | None = None  # with sleep mode: the waves without it (None: it would not fit awake)
    estimate: VramEstimate | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "fits": self.ok,
            "peak_gb": _r(self.need_gb),
            "sleep_mode": self.sleep_mode,
            "reason": self.reason,
            "micro_batch": self.micro,
            "checkpointing": self.checkpointing,
            "engine": self.engine,
            "generation_batch": self.generation_batch,
            "generation_rounds": self.generation_rounds,
            "waves": self.waves,
            "kv_fraction": _r(self.kv_fraction, 3),
            "vllm_util": self.vllm_util,
            "vllm_share_gb": _r(self.share_gb),
            **({"note": self.note} if self.note else {}),
        }


def _r(x, digits: int = 2):
    return None if x is None else round(x, digits)


@dataclass(frozen=True)
class _Try:
    """One (micro-batch, checkpointing, sleep) choice, judged."""

    micro: int
    ckpt: bool
    est: VramEstimate
    fits: bool
    peak: float
    sleep: bool = False
    util: float | None = None
    share: float = 0.0
    room: float = 0.0
    gen_batch: int | None = None
    rounds: int = 1
    waves: int = 1

    def key(self, per_process: int, max_length: int):
        small = self.micro * max_length < MIN_TOKENS_PER_MICRO_BATCH and self.micro < per_process
        # Decode waves first (generation is most of a GRPO step), then a micro-batch big enough to fill the GPU.
        return (self.waves + (SLEEP_WAVES if self.sleep else 0), small, self.sleep, -self.micro)


def kv_floor_gb(est: VramEstimate) -> float:
    """The least KV room vLLM may get: one max_model_len request (it refuses to start with less); for
    "auto" also ``VLLM_KV_MIN`` of a step's rollouts."""
    if est.vllm_fraction is not None:
        return est.vllm_kv_gb
    return max(est.vllm_kv_gb, VLLM_KV_MIN * est.vllm_kv_full_gb)


def vllm_share(est: VramEstimate, mem_gib: float, *, sleep: bool = False) -> tuple[float, float]:
    """(gpu_memory_utilization, its GiB) on a card of ``mem_gib``: the spec's fraction, or for "auto" vLLM's
    need before KV plus KV room for as much of a step's rollouts as fits beside training at ``est``'s
    micro-batch (beside the weights and LoRA state only, with ``sleep``), all of them at most, less the
    headroom; never under ``kv_floor_gb`` (then it does not fit, and the share says what it would need).
    Rounded to 0.01, at most ``VLLM_MAX_AUTO_SHARE``."""
    if est.vllm_fraction is not None:
        return est.vllm_fraction, mem_gib * est.vllm_fraction
    fixed = est.vllm_gb - est.vllm_kv_gb
    left = mem_gib * USABLE - vllm_headroom_gib(mem_gib) - (est.static_gb if sleep else est.train_gb)
    least = fixed + kv_floor_gb(est)
    want = max(min(fixed + est.vllm_kv_full_gb, left), least)
    util = _round_share(want, least, left, mem_gib)
    util = min(VLLM_MAX_AUTO_SHARE, max(0.01, util))
    return util, mem_gib * util


def _round_share(want: float, least: float, left: float, mem_gib: float) -> float:
    """``want`` GiB as a fraction of the card: to 0.01 where that stays between the floor and what the
    headroom leaves (up first), else to 0.001 (a share at its floor on a small card), else rounded up,
    past the headroom: such a share is judged as not fitting (``_Context.judge_vllm``), never run."""
    for step in (100, 1000):
        for util in (math.ceil(want / mem_gib * step) / step, math.floor(want / mem_gib * step) / step):
            if least - 1e-9 <= util * mem_gib <= left + 1e-9:
                return util
    return math.ceil(want / mem_gib * 100) / 100


def vllm_waves(est: VramEstimate, share_gb: float) -> int:
    """How many rounds vLLM generates a step's rollouts in with the KV room this share leaves (0: none fits)."""
    room = share_gb - (est.vllm_gb - est.vllm_kv_gb)
    if room < est.vllm_kv_gb or room <= 0:
        return 0
    return max(1, math.ceil(est.vllm_kv_full_gb / room))


def _candidates(train: Any, per_process: int) -> list[int]:
    if getattr(train, "micro_batch_size", None):
        return [int(train.micro_batch_size)]
    max_length = getattr(train, "max_length", 512)
    cap = max(1, MAX_TOKENS_PER_MICRO_BATCH // max(1, max_length))
    return [m for m in range(1, min(per_process, cap) + 1) if per_process % m == 0]


def fit_report(
    model: str | ModelInfo,
    gpu: str | GPUInfo | float,
    train: Any = None,
    *,
    processes: int = 1,
    strategy: str = "ddp",
    allow_sleep: bool = True,
    has_vllm: bool = True,
    liger: bool | None = None,
    checkpointing: bool | None = None,
) -> FitReport:
    """Whether one process of this run fits on one GPU of this type, with ``processes`` GPUs per pod under
    ``strategy``, and the settings it runs at there (see the module's docstring).

    ``gpu`` is a name, a GPUInfo, or a memory size in GiB (for a vendor's card this table lacks).
    ``has_vllm``: whether vllm is importable on the pod (its package set). ``allow_sleep`` False: "auto"
    never chooses sleep mode (multi-turn and dynamic sampling generate several times per step, and each
    wake-up re-pushes every weight). ``liger``/``checkpointing`` override what the spec implies.
    """
    from autoslm.recipes.sft import SFTTrain

    train = train if train is not None else SFTTrain()
    if isinstance(gpu, (int, float)):
        vram, gib, label = float(gpu), float(gpu), f"{gpu:g} GB GPU"
    else:
        g = gpu if isinstance(gpu, GPUInfo) else gpu_info(gpu)
        if g is None:
            return FitReport(None, None, None, f"unknown GPU {gpu!r}: its memory is not in the catalog")
        vram, gib, label = g.vram_gb, g.mem_gib, g.name
    info = resolve_model(model)
    if info is None:
        return FitReport(None, None, vram, f"unknown model {getattr(model, 'id', model)!r}: no size to estimate from")
    ctx = _Context(
        info,
        train,
        gib,
        label,
        max(1, processes),
        strategy,
        allow_sleep,
        has_vllm,
        liger_applies(info, train) if liger is None else liger,
        checkpointing,
    )
    report = ctx.decide()
    return replace(report, vram_gb=vram)


@dataclass
class _Context:
    info: ModelInfo
    train: Any
    gib: float
    label: str
    procs: int
    strategy: str
    allow_sleep: bool
    has_vllm: bool
    liger: bool
    ckpt_override: bool | None

    @property
    def have(self) -> float:
        return self.gib * USABLE

    @property
    def grpo(self) -> bool:
        return getattr(self.train, "method", "sft") == "grpo"

    @property
    def per_process(self) -> int:
        t = self.train
        total = t.prompts_per_step * t.group_size if self.grpo else getattr(t, "batch_size", 16)
        return max(1, total // self.procs)

    @property
    def use_vllm(self) -> bool:
        return self.grpo and self.has_vllm and servable_by_vllm(self.info, self.train)

    def ckpt_wanted(self) -> bool | str:
        if self.ckpt_override is not None:
            return self.ckpt_override
        wanted = getattr(self.train, "gradient_checkpointing", "auto")
        return "auto" if wanted == "auto" else bool(wanted)

    def estimate(self, micro: int, ckpt: bool, gen_batch: int | None = None) -> VramEstimate:
        return vram_breakdown(
            self.info,
            self.train,
            micro=micro,
            checkpointing=ckpt,
            liger=self.liger,
            processes=self.procs,
            strategy=self.strategy,
            vllm=self.use_vllm if self.grpo else None,
            generation_batch=gen_batch,
        )

    # -- one choice, judged -------------------------------------------------------------------------
    def judge(self, micro: int, ckpt: bool) -> list[_Try]:
        """Every way this micro-batch can run (sleep or not; generation batch sizes), fitting or not."""
        if not self.grpo:
            est = self.estimate(micro, ckpt)
            return [_Try(micro, ckpt, est, est.train_gb <= self.have * SFT_USABLE, est.train_gb)]
        if not self.use_vllm:
            return self.judge_generate(micro, ckpt)
        return self.judge_vllm(micro, ckpt)

    def judge_generate(self, micro: int, ckpt: bool) -> list[_Try]:
        """transformers generate(): generation batches of whole groups and whole micro-batches."""
        group = self.train.group_size
        unit = micro * group // math.gcd(micro, group)
        out = []
        for gb in sorted((b for b in range(unit, self.per_process + 1, unit) if self.per_process % b == 0), reverse=True):
            est = self.estimate(micro, ckpt, gb)
            rounds = self.per_process // gb
            out.append(_Try(micro, ckpt, est, est.train_gb <= self.have, est.train_gb, gen_batch=gb, rounds=rounds, waves=rounds))
        if not out:  # the micro-batch does not tile whole groups: generate the whole step at once
            est = self.estimate(micro, ckpt, self.per_process)
            out.append(_Try(micro, ckpt, est, est.train_gb <= self.have, est.train_gb, gen_batch=self.per_process))
        return out

    def judge_vllm(self, micro: int, ckpt: bool) -> list[_Try]:
        est = self.estimate(micro, ckpt)
        fixed = est.vllm_gb - est.vllm_kv_gb
        wanted = getattr(getattr(self.train, "vllm", None), "sleep_mode", "auto")
        modes = [True] if wanted is True else [False] if wanted is False or not self.allow_sleep else [False, True]
        out = []
        for sleep in modes:
            util, share = vllm_share(est, self.gib, sleep=sleep)
            room = share - fixed
            awake = est.static_gb + share if sleep else est.train_gb + share
            peak = max(est.train_gb, awake)
            # "auto" promises the headroom beside vLLM awake: a share at its floor that eats it does not fit.
            headroom = vllm_headroom_gib(self.gib) if est.vllm_fraction is None else 0.0
            fits = peak <= self.have and awake + headroom <= self.have + 1e-9 and room >= kv_floor_gb(est) - 1e-9
            waves = max(1, math.ceil(est.vllm_kv_full_gb / room)) if room > 0 else 0
            out.append(_Try(micro, ckpt, est, fits, peak, sleep, util, share, room, self.per_process, 1, waves))
        return out

    # -- the choice ---------------------------------------------------------------------------------
    def best(self, ckpt: bool) -> _Try | None:
        tries = [t for m in _candidates(self.train, self.per_process) for t in self.judge(m, ckpt) if t.fits]
        if not tries:
            return None
        return min(tries, key=lambda t: t.key(self.per_process, getattr(self.train, "max_length", 512)))

    def awake_waves(self, ckpt: bool) -> int | None:
        """The fewest decode waves without sleep mode (None: nothing fits awake)."""
        waves = [
            t.waves for m in _candidates(self.train, self.per_process) for t in self.judge(m, ckpt) if t.fits and not t.sleep
        ]
        return min(waves) if waves else None

    def decide(self) -> FitReport:
        wanted = self.ckpt_wanted()
        best = self.best(True if wanted == "auto" else wanted)
        if best is not None and wanted == "auto":
            # Recompute costs about a third more compute: off where this micro-batch does as well without it.
            off = [
                t
                for t in self.judge(best.micro, False)
                if t.fits and t.sleep == best.sleep and t.waves <= best.waves and (t.gen_batch or 0) >= (best.gen_batch or 0)
            ]
            if off:
                best = min(off, key=lambda t: t.key(self.per_process, getattr(self.train, "max_length", 512)))
        if best is None:
            return self.refuse(True if wanted == "auto" else wanted)
        report = self.report(best, ok=best.peak <= self.have)
        if best.sleep:
            report = replace(report, awake_waves=self.awake_waves(best.ckpt))
        return report

    def report(self, t: _Try, *, ok: bool, reason: str = "") -> FitReport:
        est = t.est
        kv_fraction = None
        note = ""
        if self.use_vllm:
            kv_fraction = min(1.0, t.room / est.vllm_kv_full_gb) if est.vllm_kv_full_gb else 1.0
            if ok and kv_fraction < VLLM_KV_WARN:
                how = (
                    "raise train.vllm.gpu_memory_utilization for speed"
                    if est.vllm_fraction is not None
                    else "a larger GPU, a shorter train.max_length or fewer rollouts per step decode in fewer"
                )
                note = (
                    f"vLLM's KV room {t.room:.1f} GiB holds {kv_fraction:.0%} of the {est.vllm_kv_full_gb:.1f} GiB a step's "
                    f"rollouts need at full length: it decodes each step in ~{t.waves} waves ({how})"
                )
        elif self.grpo and ok and t.rounds > 1:
            whole = est.generate_kv_gb * t.rounds
            note = (
                f"generate()'s KV cache for a whole step ({whole:.1f} GiB) does not fit beside training: it generates "
                f"in {t.rounds} rounds of {t.gen_batch} completions per process ({t.waves} decode waves)"
            )
        return FitReport(
            ok,
            t.peak,
            None,
            reason,
            sleep_mode=t.sleep,
            note=note,
            vllm_util=t.util,
            micro=t.micro,
            checkpointing=t.ckpt,
            engine=("vllm" if self.use_vllm else "transformers") if self.grpo else "",
            generation_batch=t.gen_batch,
            generation_rounds=t.rounds,
            waves=t.waves if self.grpo else 0,
            kv_fraction=kv_fraction,
            share_gb=t.share,
            estimate=est,
        )

    def refuse(self, ckpt: bool) -> FitReport:
        """Nothing fits: the report at the smallest choice, and a reason with the least it would need."""
        micros = _candidates(self.train, self.per_process)
        tries = self.judge(micros[0], ckpt)
        if not self.grpo and tries[0].peak <= self.have:  # no micro-batch leaves SFT's margin: the smallest, tight
            return self.report(tries[0], ok=True)
        if self.use_vllm and self.train.vllm.gpu_memory_utilization != "auto":
            # A share set by hand: a share too small for vLLM itself fails at any micro-batch (it does not
            # shrink the micro-batch); else training does not fit beside it.
            t0 = tries[0]
            if t0.room < t0.est.vllm_kv_gb:
                largest = [t for m in micros for t in self.judge(m, ckpt) if t.peak <= self.have]
                t = max(largest, key=lambda x: x.micro) if largest else t0
                return self.report(
                    t,
                    ok=False,
                    reason=(
                        f"vLLM needs ~{t.est.vllm_gb:.1f} GiB to start (weights, profiling, CUDA graphs, one request's KV cache) "
                        f"but gets {t.util:.0%} of {self.label} = {t.share:.1f} GiB (train.vllm.gpu_memory_utilization = {t.util:.0%}): "
                        "raise it or pick a larger GPU"
                    ),
                )
        t = min(tries, key=lambda x: x.peak)
        return self.report(t, ok=False, reason=self.why_not(t))

    def why_not(self, t: _Try) -> str:
        est, label, have = t.est, self.label, self.have
        if not self.grpo:
            return f"needs ~{est.train_gb:.1f} GiB per GPU, {label} has {have:.1f} GiB usable" + (
                ' (compute.strategy = "fsdp" shards the model over the GPUs)'
                if self.procs > 1 and self.strategy != "fsdp"
                else ""
            )
        if not self.use_vllm:
            group = self.train.group_size
            return (
                f"transformers generation needs ~{est.train_gb:.1f} GiB even at the smallest split: weights and LoRA "
                f"{est.static_gb:.1f} GiB + generate()'s KV cache {est.generate_kv_gb:.1f} GiB for {t.gen_batch} completions "
                f"of up to {self.train.max_length} tokens (whole groups of {group}; training at micro-batch {t.micro} peaks at "
                f"{est.weights_gb + est.lora_gb + est.activations_gb + est.overhead_gb:.1f} GiB); {label} has {have:.1f} GiB usable"
            )
        wanted = getattr(self.train.vllm, "sleep_mode", "auto")
        no_sleep = (
            ""
            if self.allow_sleep or wanted != "auto"
            else " (sleep mode is not chosen for multi-turn or dynamic sampling: it would re-push every weight at each "
            "generation call; set train.vllm.sleep_mode = true to accept that cost)"
        )
        if est.vllm_fraction is not None:
            return (
                f"training ~{est.train_gb:.1f} GiB + vLLM share {t.share:.1f} GiB ({t.util:.0%}) peaks at ~{t.peak:.1f} GiB"
                f"{' with sleep mode' if t.sleep else ''}; {label} has {have:.1f} GiB usable" + no_sleep
            )
        fixed = est.vllm_gb - est.vllm_kv_gb
        floor = kv_floor_gb(est)
        base = est.static_gb if t.sleep else est.train_gb
        # The headroom grows with the card: the least usable memory of a card that holds all this and its headroom.
        bare = base + fixed + floor
        least = USABLE * max((bare + VLLM_HEADROOM_MIN_GIB) / USABLE, bare / (USABLE - VLLM_HEADROOM))
        waves = math.ceil(est.vllm_kv_full_gb / floor) if floor > 0 else 1
        return (
            f"needs at least ~{least:.1f} GiB{' with sleep mode' if t.sleep else ''}: training ~{base:.1f} GiB at "
            f"micro-batch {t.micro} + vLLM {fixed:.1f} GiB to start + KV {floor:.1f} GiB (the larger of one max_model_len "
            f"request and {VLLM_KV_MIN:.0%} of a step's rollouts: ~{waves} decode waves) + "
            f"{least - bare:.1f} GiB headroom; {label} has {have:.1f} GiB usable" + no_sleep
        )


def needs_sleep_mode(
    model: str | ModelInfo,
    gpu: str | GPUInfo | float,
    train: Any,
    *,
    processes: int = 1,
    strategy: str = "ddp",
    allow_sleep: bool = True,
) -> bool:
    """``train.vllm.sleep_mode`` resolved: "auto" turns it on where training and vLLM's share do not both
    fit at any micro-batch, or where it saves more than ``SLEEP_WAVES`` decode waves (sleep mode costs
    seconds per step: vLLM's weights and KV cache are freed and re-made)."""
    wanted = getattr(getattr(train, "vllm", None), "sleep_mode", "auto")
    if wanted != "auto":
        return bool(wanted)
    return fit_report(model, gpu, train, processes=processes, strategy=strategy, allow_sleep=allow_sleep).sleep_mode


def fits(
    model: str | ModelInfo, gpu: str | GPUInfo | float, train: Any = None, *, processes: int = 1, strategy: str = "ddp"
) -> bool | None:
    """True/False whether the run fits on one GPU of this type; None when the model or GPU is unknown."""
    return fit_report(model, gpu, train, processes=processes, strategy=strategy).ok
