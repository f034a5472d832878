"""Where a run should go: every provider's offers for the JobSpec, with fit, price and cost, in failover order.

``plan_offers`` is what ``autoslm plan`` prints; ``choose_offer`` picks the first usable one (or raises
NoCapacity naming why nothing is usable). Offers come from each provider's ``offers()``; memory and
time come from ``autoslm.catalog`` estimates, so the numbers are forecasts, labelled as such.

It must never create, rent or terminate anything: it only reads offers. A provider that cannot be
asked (no key, outage) does not hide the others' offers; only when no provider answers at all is its
error raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autoslm import catalog
from autoslm.errors import NoCapacity, ProviderError, StoreError
from autoslm.providers import VENDORS
from autoslm.providers.base import GpuWish, Offer, Provider
from autoslm.recipes.generation import sleep_allowed

log = logging.getLogger("autoslm.placement")


@dataclass(frozen=True)
class PlannedOffer:
    """One offer, judged for one JobSpec. Flat on purpose: ``autoslm plan`` prints these fields as columns."""

    provider: str
    gpu: str
    gpu_count: int
    vram_gb: float  # per GPU: data-parallel training holds the whole model on each one
    price_per_hour: float  # one pod (a replica of several pods costs ``nodes`` times it)
    interruptible: bool
    fits: bool | None  # None: the model or GPU is unknown to the catalog, so nobody can tell
    vram_need_gb: float | None
    est_hours: float | None  # one replica, setup included, as estimated; None when the step count is unknown
    estimated_cost_usd: float | None  # every replica, as estimated (not cut at the limits: an offer over them is not usable)
    max_cost_usd: float  # price x limits.max_hours x replicas, capped by limits.max_usd: the most it can cost
    usable: bool
    note: str = ""  # why it is not usable, or what the estimate rests on
    location: str = ""
    reliability: float | None = None
    offer_id: str | None = None
    failover_rank: int = 0  # index of the provider in compute.provider
    replicas: int = 1
    nodes: int = 1  # pods per replica (compute.nodes): the estimate and the limits count all of them
    ram_gb: float | None = None  # the pod's host RAM, where the provider says
    ram_need_gb: float | None = None  # host RAM while the model loads (FSDP: rank 0 holds it whole)
    # How the pod runs, as the worker will decide it (catalog.fit_report): the same numbers --print-config shows.
    step_s: float | None = None  # seconds per optimizer step
    eval_s: float | None = None  # seconds per held-out evaluation (counted in est_hours)
    evaluations: int = 0  # held-out evaluations over the run
    lm_eval_s: float | None = None  # [eval] lm_eval on the base and the adapter, after training (counted in est_hours)
    waves: int = 0  # GRPO: decode waves per step (0: SFT)
    micro_batch: int | None = None
    generation: str = ""  # GRPO: "vllm" | "transformers"
    generation_batch: int | None = None  # completions per process per generation call
    vllm_util: float | None = None
    kv_fraction: float | None = None  # share of a step's rollouts vLLM's KV room holds at once


@dataclass
class Placement:
    offers: list[PlannedOffer] = field(default_factory=list)
    problems: dict[str, ProviderError] = field(default_factory=dict)  # provider -> why it could not be asked


def gpu_wish(compute) -> GpuWish:
    """What a JobSpec's ``compute`` asks of a vendor: the GPUs, the limits on a pod, and each vendor's own
    options. One for `plan` and for a launch, so that a launch rents what `plan` printed."""
    return GpuWish(
        gpu_types=tuple(compute.gpus),
        gpu_count=compute.gpu_count,
        nodes=compute.nodes,
        interruptible=compute.interruptible,
        max_price_per_hour=compute.max_price_per_hour,
        disk_gb=compute.disk_gb,
        image=compute.image,
        options=dict(compute.options),
    )


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch on one provider may rent, decided here once: its usable offers in `plan`'s order
    (None: a vendor with no market, which picks itself), every offer as judged, and, where none is
    usable, why (``nothing``: the launch does not ask that provider then)."""

    offers: tuple[Offer, ...] | None
    judged: list[PlannedOffer] = field(default_factory=list)
    nothing: NoCapacity | None = None


def _dataset_size(spec) -> int | None:
    n = (spec.environment.params or {}).get("n_train")
    return int(n) if isinstance(n, int) and n > 0 else None


@dataclass(frozen=True)
class Left:
    """What a relaunch still has: money (limits.max_usd less what the run spent), hours (to its deadline),
    and the optimizer steps already done (a resumed run trains only the rest)."""

    spent_usd: float = 0.0
    hours: float | None = None
    done_steps: int = 0


def resume_step(artifacts, reached: int | None) -> int:
    """The step a relaunch resumes after: its newest checkpoint's, never past the step the replica
    reached (the steps since are trained again). No checkpoint, or a store that cannot tell: 0, the whole
    run again, its "before" evaluation included."""
    try:
        done = max(artifacts.list_checkpoints(), default=0)
    except (StoreError, OSError):
        return 0
    return min(done, reached) if reached else done


def judge_offer(
    spec,
    offer: Offer,
    *,
    rank: int = 0,
    n_examples: int | None = None,
    has_vllm: bool = True,
    left: Left | None = None,
    image_mode: str | None = None,
) -> PlannedOffer:
    """One offer against one JobSpec: does the model fit, what does it cost, may we use it. ``has_vllm``:
    whether the pod this provider starts can import vllm (its package set, ``controller.images``).
    An offer whose own estimate passes limits.max_hours or limits.max_usd is not usable: the run would be
    ended by the limit before it finishes. ``left``: a relaunch, judged on what remains (``Left``).
    ``image_mode``: "image" or "bootstrap" (``images.choose_image``), which sets the pod's set-up time."""
    replicas = len(spec.seeds)
    train = spec.train if spec.kind == "train" else None
    if train is None:
        fit, est = _serve_fit_and_estimate(spec, offer, has_vllm=has_vllm, image_mode=image_mode)
    else:
        fit, est = _fit_and_estimate(spec, offer, n_examples=n_examples, has_vllm=has_vllm, image_mode=image_mode)
    nodes = spec.compute.nodes
    ceiling = est.ceiling_usd * replicas
    hours = _remaining_hours(spec, est, left.done_steps) if left is not None and train is not None else est.hours
    total = hours * offer.price_per_hour * nodes * replicas if hours is not None else None
    if spec.limits.max_usd is not None:
        ceiling = min(ceiling, spec.limits.max_usd)
    # A serve runs until its limits (`autoslm serve`: its time is the TTL, a relaunch's what is left of it);
    # an export (`autoslm export --on`) is planned at its cap: a merge and a conversion, whose time no
    # training estimate says.
    if train is None or spec.export is not None:
        hours = _time_limit_h(spec)
        if left is not None and left.hours is not None:
            hours = max(0.0, min(hours, left.hours))
        total = min(hours * offer.price_per_hour, ceiling)

    ram_need = catalog.host_ram_gb(spec.model, train, processes=spec.compute.gpu_count, strategy=spec.compute.strategy)
    problems = _offer_problems(spec, offer, fit, ram_need) + _over_limits(spec, hours, total, left)
    note = "; ".join(problems)
    if not problems:
        note = fit.reason if fit.ok is None else est.basis + (f"; {fit.note}" if fit.note else "")
    return PlannedOffer(
        provider=offer.provider,
        gpu=offer.gpu,
        gpu_count=offer.gpu_count,
        vram_gb=round(offer.vram_gb, 1),
        price_per_hour=round(offer.price_per_hour, 4),
        interruptible=offer.interruptible,
        fits=fit.ok,
        vram_need_gb=round(fit.need_gb, 1) if fit.need_gb is not None else None,
        est_hours=round(hours, 2) if hours is not None else None,
        estimated_cost_usd=round(total, 2) if total is not None else None,
        max_cost_usd=round(ceiling, 2),
        usable=not problems,
        note=note,
        location=offer.location,
        reliability=offer.reliability,
        offer_id=offer.offer_id,
        failover_rank=rank,
        replicas=replicas,
        nodes=nodes,
        ram_gb=round(offer.ram_gb, 1) if offer.ram_gb is not None else None,
        ram_need_gb=round(ram_need, 1) if ram_need is not None else None,
        step_s=round(est.step_s, 1) if est.step_s is not None else None,
        eval_s=round(est.eval_s, 1) if est.eval_s is not None else None,
        evaluations=est.evaluations,
        lm_eval_s=round(est.lm_eval_s, 1) if est.lm_eval_s else None,
        waves=fit.waves,
        micro_batch=fit.micro,
        generation=fit.engine,
        generation_batch=fit.generation_batch,
        vllm_util=fit.vllm_util,
        kv_fraction=round(fit.kv_fraction, 3) if fit.kv_fraction is not None else None,
    )


def _fit_and_estimate(spec, offer: Offer, *, n_examples: int | None, has_vllm: bool, image_mode: str | None):
    """(the fit on the offer's card, the run's estimate there): memory per GPU with the step split over
    gpu_count processes (DDP), or the model too (FSDP), at the micro-batch and generation batch the pod
    will choose; time and cost with that fit's engine and decode waves and the pod's set-up."""
    from autoslm.controller.images import pod_setup
    from autoslm.envs.task_table import is_multi_turn

    gpu = catalog.gpu_info(offer.gpu)
    fit = catalog.fit_report(
        spec.model,
        gpu if gpu else offer.vram_gb,
        spec.train,
        processes=spec.compute.ranks,
        strategy=spec.compute.strategy,
        allow_sleep=sleep_allowed(spec, is_multi_turn(spec)),
        has_vllm=has_vllm,
    )
    vendor = VENDORS.get(offer.provider)
    est = catalog.estimate_run(
        spec.model,
        gpu if gpu else offer.gpu,
        spec.train,
        offer.price_per_hour * spec.compute.nodes,  # the replica's pods together
        max_hours=spec.limits.max_hours,
        gpu_count=offer.gpu_count,
        nodes=spec.compute.nodes,
        link_gbps=vendor.capabilities.pod_link_gbps if vendor else None,
        n_examples=n_examples if n_examples is not None else _dataset_size(spec),
        waves=max(1, fit.waves),
        has_vllm=fit.engine == "vllm" if fit.engine else has_vllm,
        ev=spec.eval,
        multi_turn=is_multi_turn(spec),
        concurrent=_kv_sequences(spec, fit),
        setup=pod_setup(spec, offer.provider, image_mode),
    )
    return fit, est


def _time_limit_h(spec) -> float:
    """The run's time limit in hours: a training run's ``limits.max_hours``, a serve's TTL."""
    return spec.limits.max_hours if spec.kind == "train" else spec.limits.ttl_s / 3600


def _serve_fit_and_estimate(spec, offer: Offer, *, has_vllm: bool, image_mode: str | None):
    """A serve's (fit, estimate) on the offer's card: the model fits where it would train with the default
    recipe (the catalog holds no estimate of vLLM's serving memory, and training needs more than serving),
    and its time is its TTL, its pod's set-up included (the deadline counts from the launch)."""
    from autoslm.controller.images import pod_setup

    gpu = catalog.gpu_info(offer.gpu)
    fit = catalog.fit_report(spec.model, gpu if gpu else offer.vram_gb, None, has_vllm=has_vllm)
    hours = _time_limit_h(spec)
    setup = pod_setup(spec, offer.provider, image_mode)
    ceiling = offer.price_per_hour * hours
    basis = f"serves for its TTL ({hours * 60:g} min), ~{setup.seconds / 60:.0f} min of it set-up"
    est = catalog.RunEstimate(None, hours, ceiling, ceiling, basis, setup_s=setup.seconds)
    return fit, est


def _offer_problems(spec, offer: Offer, fit, ram_need: float | None) -> list[str]:
    """Why the pod itself cannot run the JobSpec: no interruptible pods, no fit, too little host RAM."""
    problems = []
    if spec.compute.interruptible and not offer.interruptible:
        vendor = VENDORS.get(offer.provider)  # its declared reason (Capabilities.not_interruptible)
        problems.append(
            vendor.capabilities.not_interruptible
            if vendor and vendor.capabilities.not_interruptible
            else f"{offer.provider} has no interruptible pods"
        )
    if fit.ok is False:
        problems.append(fit.reason)
    if offer.ram_gb is not None and ram_need is not None and offer.ram_gb < ram_need:
        how = (
            f"rank 0 of {spec.compute.gpu_count} FSDP processes reads the whole model into it"
            if spec.compute.strategy == "fsdp" and spec.compute.gpu_count > 1
            else "to load the model"
        )
        problems.append(f"needs ~{ram_need:.0f} GB host RAM ({how}), the offer has {offer.ram_gb:.0f} GB")
    return problems


def _remaining_hours(spec, est, done_steps: int) -> float | None:
    """A resumed run's hours: set-up again, the steps not yet done and the evaluations still to come
    (``evaluations_left``: with no step done, the whole run again, its "before" evaluation included)."""
    from autoslm.recipes.evaluation import evaluations_left

    if est.hours is None or not est.steps or not done_steps:
        return est.hours
    rest = max(0, est.steps - done_steps)
    evals = evaluations_left(spec.eval, spec.train, est.steps, done_steps) if est.evaluations else 0
    return (est.setup_s + rest * (est.step_s or 0.0) + evals * (est.eval_s or 0.0) + est.lm_eval_s) / 3600


def _over_limits(spec, hours: float | None, usd: float | None, left: Left | None) -> list[str]:
    """Which limit an estimate passes, each in one short reason naming the field ("2.3 h > limits.max_hours 2").
    A relaunch is judged on the hours to the deadline and the money not yet spent."""
    out = []
    limit_h = _time_limit_h(spec)
    max_hours = limit_h if left is None or left.hours is None else min(limit_h, left.hours)
    if hours is not None and hours > max_hours:
        limit = f"limits.max_hours {limit_h:g}" if spec.kind == "train" else f"limits.ttl_s {spec.limits.ttl_s:g}"
        if left is not None and left.hours is not None:
            limit = f"{max(0.0, left.hours):.1f} h left of {limit}"
        out.append(f"{hours:.1f} h > {limit}")
    if spec.limits.max_usd is not None and usd is not None:
        budget = spec.limits.max_usd - (left.spent_usd if left is not None else 0.0)
        if usd > budget:
            limit = f"limits.max_usd {spec.limits.max_usd:g}"
            if left is not None and left.spent_usd:
                limit = f"${max(0.0, budget):.2f} left of {limit}"
            out.append(f"${usd:.2f} > {limit}")
    return out


def _kv_sequences(spec, fit) -> float | None:
    """Completions one process's colocated vLLM holds at once at full length (its KV room), or None."""
    if fit.kv_fraction is None or spec.train.method != "grpo":
        return None
    return fit.kv_fraction * spec.train.prompts_per_step * spec.train.group_size / max(1, spec.compute.ranks)


def plan_placement(
    spec,
    providers: Mapping[str, Provider],
    *,
    n_examples: int | None = None,
    lookup: bool = False,
    pod_vllm: Callable[[str], bool] | None = None,
    image_mode: str | None = None,
) -> Placement:
    """Ask every provider in ``compute.provider`` for offers, side by side (each is a network round
    trip); judge each. Errors are kept per provider. ``lookup``: only a look (`autoslm plan`), so the
    providers try once instead of backing off and retrying as they do when a run is to be placed.
    ``pod_vllm(provider)``: whether that provider's pod can import vllm (default: yes), which decides
    what generates and so the memory plan (``controller.images.pod_vllm``); ``image_mode``: see ``judge_offer``."""
    from concurrent.futures import ThreadPoolExecutor

    placement = Placement()
    wish = gpu_wish(spec.compute)
    asked = [(rank, name, providers[name]) for rank, name in enumerate(spec.compute.providers) if providers.get(name) is not None]

    def ask(provider):
        try:
            return (provider.offers(wish, lookup=True) if lookup else provider.offers(wish)), None
        except ProviderError as e:
            return None, e

    with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
        answers = list(pool.map(lambda a: ask(a[2]), asked))
    for (rank, name, _), (offers, err) in zip(asked, answers):
        if err is not None:
            log.info("%s: could not list offers: %s", name, err)  # the caller says it (placement.problems)
            placement.problems[name] = err
            continue
        vllm = pod_vllm(name) if pod_vllm is not None else True
        placement.offers += [
            judge_offer(spec, o, rank=rank, n_examples=n_examples, has_vllm=vllm, image_mode=image_mode) for o in offers
        ]
    placement.offers.sort(key=_plan_order)
    return placement


def _plan_order(p: PlannedOffer) -> tuple:
    """`plan`'s order, which a launch follows: provider order, usable first, then the cheapest run (its
    estimated cost; price per hour breaks ties and orders offers whose run time is unknown)."""
    cost = p.estimated_cost_usd
    return (p.failover_rank, not p.usable, cost is None, cost if cost is not None else 0.0, p.price_per_hour)


def launch_offers(
    spec, provider: Provider, *, has_vllm: bool = True, left: Left | None = None
) -> tuple[tuple[Offer, ...], list[PlannedOffer]]:
    """What a launch on one provider may rent: its usable offers in `plan`'s order (the first is the
    best offer `plan` printed), and every offer as judged (why the others are not usable). The same
    ``judge_offer`` as `plan`: fit at the micro-batch the pod will choose, host RAM, the limits
    (``left``: a relaunch, judged on the money and hours it has left)."""
    judged = [(o, judge_offer(spec, o, has_vllm=has_vllm, left=left)) for o in provider.offers(gpu_wish(spec.compute))]
    judged.sort(key=lambda x: _plan_order(x[1]))
    return tuple(o for o, p in judged if p.usable), [p for _, p in judged]


def launch_plan(spec, name: str, provider: Provider, *, left: Left | None = None) -> LaunchPlan:
    """What a launch of ``spec`` on provider ``name`` may rent (``launch_offers``, with vLLM where its pod
    has it), and why nothing where no offer is usable, as `plan` says it. A vendor with no market
    (``Capabilities.market``: this machine) has no plan: it picks itself."""
    if spec.compute.vendors[name].capabilities.market == "none":
        return LaunchPlan(None)
    from autoslm.controller.images import pod_vllm

    # The image was decided at launch (sdk.prepare); one still undecided starts as bootstrap (podspec).
    offers, judged = launch_offers(spec, provider, has_vllm=pod_vllm(spec, name, exists=lambda _ref: False), left=left)
    return LaunchPlan(offers, judged, nothing=None if offers else no_usable_offer(judged))


def plan_offers(
    spec,
    providers: Mapping[str, Provider],
    *,
    n_examples: int | None = None,
    lookup: bool = False,
    pod_vllm: Callable[[str], bool] | None = None,
    image_mode: str | None = None,
) -> list[PlannedOffer]:
    """Every offer for this JobSpec in failover order (provider order, usable first, then cheapest run).

    Raises the first provider's error when no provider could be asked at all (a missing key should
    say so, not look like "no offers").
    """
    placement = plan_placement(spec, providers, n_examples=n_examples, lookup=lookup, pod_vllm=pod_vllm, image_mode=image_mode)
    if (
        not placement.offers
        and placement.problems
        and len(placement.problems) == len([n for n in spec.compute.providers if n in providers])
    ):
        raise next(iter(placement.problems.values()))
    return placement.offers


def choose_offer(planned: list[PlannedOffer], problems: Mapping[str, ProviderError] | None = None) -> PlannedOffer:
    """The first usable offer in failover order; NoCapacity saying why when there is none."""
    for p in planned:
        if p.usable:
            return p
    raise no_usable_offer(planned, problems)


def no_usable_offer(planned: list[PlannedOffer], problems: Mapping[str, ProviderError] | None = None) -> NoCapacity:
    """Why none of the judged offers may be rented (none usable, or none at all), and what to change."""
    reasons = sorted({f"{p.provider} {p.gpu}: {p.note}" for p in planned if p.note})[:6]
    reasons += [f"{name}: {err}" for name, err in (problems or {}).items()]
    if not planned and not problems:
        return NoCapacity("no offer matches the GPU wishes and limits", hint=NO_OFFER_HINT)
    return NoCapacity("no usable offer: " + "; ".join(reasons), hint=unusable_hint([p.note for p in planned]))


NO_OFFER_HINT = "try another gpu, a higher max_price_per_hour, or another provider"


def unusable_hint(notes: list[str]) -> str:
    """What to change when no offer is usable, from why each was not: the limit every one of them
    fails, named by its field, else the general advice."""
    if notes and all("limits.max_usd" in (n or "") for n in notes):
        return "every offer's estimate is over the money limit: raise limits.max_usd, or train fewer steps"
    return "pick a larger GPU, a smaller model or batch, or raise the limits"
