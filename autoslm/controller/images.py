"""Which image a rented pod runs, and the start command that goes with it.

``compute.image`` chooses:

- ``"auto"`` (default): the published worker image of this version (``catalog.default_worker_image()``)
  if its registry says it exists, else bootstrap. Offline, or a registry that cannot tell: bootstrap.
- ``"bootstrap"``: a public base image that exists and carries torch (and, where the provider lets us
  replace its entrypoint, vLLM), plus autoslm's wheel installed at start (autoslm/controller/wheel.py,
  worker_image/boot.sh).
- anything else: that image reference, run as is (it must keep the worker image's contract:
  docs/worker-image.md).

The choice is made once per launch (``resolve_image``) and written into the run's spec, so every
attempt of a run starts the same way. The registry is asked with the OCI distribution API (HEAD of
the tag's manifest, with the anonymous pull token the registry's 401 points at), through an injected
base URL: ``AUTOSLM_REGISTRY_URL`` replaces ``https://<registry host>`` (tests, mirrors).

Base images, per provider (each vendor's ``Vendor.bootstrap_image``, ``bootstrap_has_vllm`` and
``bootstrap_base``, in its folder autoslm/providers/<vendor>/), because their APIs differ in what they
let us override:

- RunPod's REST v2 create takes ``args`` only, handed to the image's ENTRYPOINT (the published v2
  schema, docs/worker-image.md; whether v2 also honours ``entrypoint``/``cmd`` is not settled). The
  vLLM image's ENTRYPOINT is the vLLM server, so RunPod gets PyTorch's official runtime image, which
  has no ENTRYPOINT: ``args`` is the command (``sh -c <boot.sh> ...``). It has no vLLM: for a GRPO run
  that may use vLLM, boot.sh installs the pinned vllm on it with torch, torchvision, torchaudio, triton
  and the image's nvidia-*/cuda-* held (``--vllm``); where that fails, the worker generates with
  transformers and records a "generation_fallback" event.
- Vast's args launch takes an entrypoint override (sent as ``onstart``, as the official CLI's
  ``--entrypoint`` does), so Vast gets vLLM's official image of the pinned release, with ``sh`` as
  its entrypoint.

Both are pinned by digest (the manifest-list digests their publishers' tags point at, read from public
records in 2026-10; see docs/worker-image.md). Their torch (2.13.0+cu130) matches requirements-gpu.txt;
vLLM's image also has transformers 5.17.0, triton 3.7.1 and Python 3.12. On both, boot.sh installs
autoslm[worker,kernels]: bitsandbytes, liger-kernel and kernels are on every pod (``pod_packages``).

It must never put a secret into a start command: keys reach a pod through its environment only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoslm import catalog
from autoslm.providers import VENDORS

if TYPE_CHECKING:  # httpx loads when a registry is asked (a rented run's launch), not for a local one
    import httpx

REGISTRY_URL_ENV = "AUTOSLM_REGISTRY_URL"
CHECK_TIMEOUT_S = 4.0

# The pinned vLLM release (requirements-gpu.txt), which boot.sh installs where the base lacks it.
VLLM_PIN = "0.31.0"


def _has_vllm(provider: str) -> bool:
    """Whether the bootstrap base of ``provider`` has vLLM in the image itself (``Vendor.bootstrap_has_vllm``)."""
    vendor = VENDORS.get(provider)
    return bool(vendor and vendor.bootstrap_has_vllm)


_MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


@dataclass(frozen=True)
class ImageChoice:
    mode: str  # "image" | "bootstrap"
    image: str | None  # the image a non-bootstrap pod runs
    why: str

    @property
    def value(self) -> str:
        """What goes into the run's ``compute.image``."""
        return "bootstrap" if self.mode == "bootstrap" else str(self.image)


def split_ref(ref: str) -> tuple[str, str, str]:
    """``ghcr.io/o/n:tag`` -> (registry host, repository, tag or digest); Docker Hub names get its host."""
    name, _, digest = ref.partition("@")
    tag = ""
    head, _, maybe_tag = name.rpartition(":")
    if head and "/" not in maybe_tag:  # a tag, not a registry's port
        name, tag = head, maybe_tag
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        host, repo = first, name.split("/", 1)[1]
    else:
        host, repo = "registry-1.docker.io", name if "/" in name else f"library/{name}"
    return host, repo, digest or tag or "latest"


def image_exists(
    ref: str, *, base_url: str | None = None, timeout: float = CHECK_TIMEOUT_S, transport: httpx.BaseTransport | None = None
) -> bool | None:
    """True/False as the registry says; None when it cannot tell (offline, refused, unexpected answer)."""
    host, repo, reference = split_ref(ref)
    base = (base_url or os.environ.get(REGISTRY_URL_ENV) or f"https://{host}").rstrip("/")
    url = f"{base}/v2/{repo}/manifests/{reference}"
    if transport is None and url in _ANSWERS:  # `launch` shows the plan, then decides: ask once
        return _ANSWERS[url]
    found = _ask(url, repo, timeout, transport)
    if transport is None:
        _ANSWERS[url] = found
    return found


_ANSWERS: dict[str, bool | None] = {}


def _ask(url: str, repo: str, timeout: float, transport: httpx.BaseTransport | None) -> bool | None:
    import httpx

    headers = {"Accept": _MANIFEST_TYPES}
    try:
        with httpx.Client(timeout=timeout, transport=transport, follow_redirects=True) as client:
            r = client.head(url, headers=headers)
            if r.status_code == 401:
                token = _anonymous_token(client, r.headers.get("www-authenticate", ""), repo)
                if token is None:
                    return None
                r = client.head(url, headers={**headers, "Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    if r.status_code == 200:
        return True
    if r.status_code == 404:
        return False
    return None


def _anonymous_token(client: httpx.Client, challenge: str, repo: str) -> str | None:
    """The pull token a Bearer challenge (``realm=...,service=...,scope=...``) points at, asked anonymously."""
    if not challenge.lower().startswith("bearer "):
        return None
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in fields:
        return None
    params = {"service": fields.get("service", ""), "scope": fields.get("scope") or f"repository:{repo}:pull"}
    r = client.get(fields["realm"], params=params)
    if r.status_code != 200:
        return None
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    return body.get("token") or body.get("access_token")


def choose_image(setting: str | None, *, exists=image_exists) -> ImageChoice:
    """What ``compute.image`` means now: a concrete image, or bootstrap."""
    setting = setting or "auto"
    if setting == "bootstrap":
        return ImageChoice("bootstrap", None, 'compute.image = "bootstrap"')
    if setting != "auto":
        return ImageChoice("image", setting, "compute.image")
    published = catalog.default_worker_image()
    found = exists(published)
    if found:
        return ImageChoice("image", published, f"{published} is published")
    if found is False:
        return ImageChoice("bootstrap", None, f"{published} is not published")
    return ImageChoice("bootstrap", None, f"could not ask the registry whether {published} exists")


def resolve_image(spec, *, exists=image_exists):
    """The spec with ``compute.image`` decided ("bootstrap" or an image); local runs are left as they are."""
    if spec.compute.is_local or spec.compute.image not in (None, "auto"):
        return spec
    choice = choose_image(spec.compute.image, exists=exists)
    return spec.model_copy(update={"compute": spec.compute.model_copy(update={"image": choice.value})})


@dataclass(frozen=True)
class PodPackages:
    """What the pod's Python will have, for ``plan``, ``validate`` and ``--print-config``."""

    kernels: bool  # bitsandbytes, liger-kernel, kernels
    vllm: bool  # vllm importable when the worker starts (installed at start counts, if it installs)
    how: str  # a few words: where vLLM comes from


def wants_vllm(spec) -> bool:
    """Will this run generate with colocated vLLM on a CUDA pod that has it? The worker's own decision
    (``recipes.generation.vllm_usable``) asked with vLLM present: GRPO, ``train.vllm.enabled`` not
    false, a model vLLM can serve, not the 4-bit tier. Only then does a bootstrap pod install vLLM."""
    from autoslm.catalog import model_info
    from autoslm.recipes.generation import vllm_usable

    if spec.kind == "serve":
        return True  # a serve is vLLM's server: its pod always needs vLLM
    if spec.train.method != "grpo":
        return False
    return vllm_usable(spec, model_info(spec.model), has_cuda=True, has_vllm=True)[0]


def pod_packages(spec, provider: str, mode: str) -> PodPackages:
    """The package set of the pod ``provider`` starts for this run: the published (or named) image's, or
    the bootstrap base's plus what boot.sh installs (autoslm[worker,kernels], and for a GRPO run the
    pinned vllm where the base has none)."""
    if mode != "bootstrap":
        return PodPackages(True, True, "the image's")
    if _has_vllm(provider):
        return PodPackages(True, True, "the base image's")
    if wants_vllm(spec):
        from autoslm.controller.podlock import twin_of, vllm_outcome

        twin = twin_of(provider)
        outcome = vllm_outcome(twin) if twin else None
        if outcome is not None and (outcome.refusal or "vllm" not in outcome.install):
            return PodPackages(True, False, f"none: boot would not install vllm {VLLM_PIN} there ({outcome.refusal})")
        return PodPackages(True, True, f"vllm {VLLM_PIN} installed at start")
    return PodPackages(True, False, "none (not needed)")


def image_mode(spec) -> str:
    """ "image" or "bootstrap" as far as the spec says it without asking a registry: a launched run's spec
    names what was chosen; "auto" before launch counts as bootstrap, the longer set-up."""
    return "bootstrap" if (spec.compute.image or "auto") in ("auto", "bootstrap") else "image"


def pod_setup(spec, provider: str, mode: str | None = None):
    """The set-up of the pod ``provider`` starts for this run (``catalog.setup_estimate``): the worker
    image's pull, or the bootstrap base's with what boot installs on it, the model's download and the
    warm-up. ``mode``: "image" or "bootstrap" (``choose_image``); default ``image_mode(spec)``."""
    mode = mode or image_mode(spec)
    vllm = wants_vllm(spec)
    if mode != "bootstrap":
        return catalog.setup_estimate(spec.model, image="worker", vllm=vllm)
    base = VENDORS[provider].bootstrap_base if provider in VENDORS else "pytorch"
    installs = ("autoslm", "vllm") if vllm and not _has_vllm(provider) else ("autoslm",)
    return catalog.setup_estimate(spec.model, image=base, installs=installs, vllm=vllm)


def pod_vllm(spec, provider: str, *, exists=image_exists) -> bool:
    """Whether vllm is importable on the pod ``provider`` starts for this run (the image ``compute.image``
    resolves to, and what boot installs there: ``pod_packages``). ``plan`` sizes memory and time by it:
    without vLLM, transformers' generate() generates, and its KV cache is counted instead of vLLM's share."""
    if not VENDORS[provider].rented:
        return True  # a local run's worker decides from its own Python (validate checks an explicit true)
    return pod_packages(spec, provider, choose_image(spec.compute.image, exists=exists).mode).vllm


def pod_installs(spec) -> list[str]:
    """What boot installs on every pod of this run besides autoslm (``[environment] packages`` and a pinned
    verifiers environment's own package): worker_image/boot_rules.py's own decision, read from the spec."""
    from autoslm._image.boot_rules import environment_packages

    return environment_packages(spec.model_dump(mode="json"))


def describe(spec, *, exists=image_exists) -> str:
    """One line for `plan`/`launch`: the image each provider's pod will run, what boot installs on it, and
    the expected set-up time."""
    choice = choose_image(spec.compute.image, exists=exists)
    providers = [p for p in spec.compute.providers if VENDORS[p].rented]
    setups = [pod_setup(spec, p, choice.mode) for p in providers] or [pod_setup(spec, "", choice.mode)]
    lo, hi = min(x.low_min for x in setups), max(x.high_min for x in setups)
    packages = pod_installs(spec)
    extra_packages = f"; installed at start: {', '.join(packages)}" if packages else ""
    if choice.mode == "image":
        return f"pod image: {choice.image} ({choice.why}){extra_packages}; expected set-up {lo}-{hi} min (pull + model download)"

    def base(p: str) -> str:
        pk = pod_packages(spec, p, "bootstrap")
        vllm = "" if _has_vllm(p) else (f" + vLLM {VLLM_PIN} installed at start{vllm_note(p)}" if pk.vllm else " (no vLLM)")
        return f"{p}: {VENDORS[p].bootstrap_image.split('@')[0]}{vllm}"

    bases = "; ".join(base(p) for p in providers if VENDORS[p].bootstrap_image)
    return (
        f"pod image: bootstrap ({choice.why}) -- {bases}, plus autoslm's wheel installed at start{extra_packages}; "
        f"expected set-up {lo}-{hi} min (pull + install + model download)"
    )


def vllm_note(provider: str, lock: dict | None = None) -> str:
    """What the lock file (worker_image/pod-lock.json) says vLLM's install keeps of that base against its
    pins, e.g. " (torchaudio stays 2.11.1, vLLM pins 2.11.0: its audio models are unavailable)"."""
    from autoslm.controller.podlock import kept_against_vllm

    kept = kept_against_vllm(provider, lock)
    return "".join(
        f" ({n} stays {image}, vLLM pins {wanted}: its audio models are unavailable)" for n, (image, wanted) in kept.items()
    )


def boot_payload() -> str:
    """worker_image/boot.py as the start command carries it: one program, each module beside it
    (``BOOT_FILES``: boot_rules.py, boot_net.py, boot_install.py) inlined once, in place of the first
    top-level ``from <module> import ...`` that reaches it (its own such imports first; its ``from
    __future__`` import dropped: boot.py has it first); comments and docstrings dropped (``ast``),
    zlib-compressed, base64 (no quote, `$` or backquote in it: it sits inside single quotes, and
    shellcheck reads it). Deterministic for a given python."""
    import ast
    import base64
    import zlib

    from autoslm.controller.wheel import BOOT_FILES, image_file

    beside = {name[: -len(".py")] for name in BOOT_FILES if name.endswith(".py")} - {"boot"}

    def parsed(name: str) -> ast.Module:
        tree = ast.parse(image_file(f"{name}.py").read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        return tree

    def imports_beside(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.ImportFrom)
            and node.module in beside
            or isinstance(node, ast.Import)
            and any(a.name in beside for a in node.names)
        )

    def inlined(name: str, done: set[str]) -> list[ast.stmt]:
        out = []
        for node in parsed(name).body:
            if isinstance(node, ast.ImportFrom) and node.module in beside:
                if node.module not in done:
                    done.add(node.module)
                    out += inlined(node.module, done)
            elif not (name != "boot" and isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                out.append(node)
        return out

    tree = parsed("boot")
    tree.body = inlined("boot", {"boot"})
    if any(imports_beside(node) for node in ast.walk(tree)):
        raise ValueError(
            "a boot file in worker_image/ imports another other than by a top-level `from boot_... import ...`: "
            "the start command could not carry it"
        )
    return base64.b64encode(zlib.compress(ast.unparse(tree).encode(), 9)).decode()


def boot_script() -> str:
    """worker_image/boot.sh as a pod's ``sh -c`` receives it: its comment and blank lines dropped, and
    ``BOOT_PY`` set to ``boot_payload()`` (a bootstrap pod has no checkout: the start command carries
    the Python part of boot)."""
    from autoslm.controller.wheel import image_file

    lines = [
        line
        for line in image_file("boot.sh").read_text().splitlines(keepends=True)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return "".join(f"BOOT_PY='{boot_payload()}'\n" if line.strip() == "BOOT_PY=''" else line for line in lines)


def boot_command(wheel_ref: str, command: list[str], *, vllm: bool = False) -> list[str]:
    """The start command of a bootstrap pod: worker_image/boot.sh's text run by ``sh -c``; ``vllm``: a
    GRPO run that will generate with vLLM (``wants_vllm``), for which boot installs the pinned vllm where
    the base image has none."""
    return ["sh", "-c", boot_script(), "autoslm-boot", "--wheel", wheel_ref, *(["--vllm"] if vllm else []), "--", *command]
