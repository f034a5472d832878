"""How every pod starts, after worker_image/boot.sh has found a python: install autoslm's shipped wheel
(bootstrap pods only), prefetch the run's model, then run the worker.

    boot.py [--wheel store:<sha256>/<file>.whl] [--vllm] [--] [command ...]   # default: python -m autoslm.engine

Standard library only: it runs before autoslm is importable (and on a python too old for autoslm, to
say so). Syntax a python 3.8 can read, for the same reason. A bootstrap pod receives it compressed
inside its start command (autoslm/controller/images.py); the worker image runs the file.

Boot is four files beside each other, one program (the start command carries them as one; the image
runs this file, its folder on sys.path):

- boot.py (this file): the command line, the ``Boot`` of one pod (its python and pip, error records,
  heartbeats, the pod's boot count), the prefetch and the worker.
- boot_install.py: what is installed and the checks around each install -- autoslm's wheel, the spec's
  ``[environment] packages`` (pinned "name==version" strings, in $AUTOSLM_JOBSPEC, installed with
  autoslm's extras under the same constraints), vLLM (``--vllm``, a GRPO run that will use it, on an
  image without it). What the image had keeps its version; an install may only add packages.
- boot_net.py: the world over urllib -- the wheel from the run's store, an error record into it, the
  vendor's API through which the pod ends itself.
- boot_rules.py: what to decide -- the held set, the constraints, what an install may change, what
  vLLM's install keeps, which failures are retried, which vendor's pod this is -- as pure functions,
  which the controller runs too.

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

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from boot_install import install_autoslm, install_packages
from boot_net import in_pod, log, request_pod_end, write_error
from boot_rules import must_hold, pod_vendor, redact, retryable

PREFETCH_TIMEOUT_S = 1800  # the prefetch may take this long before the worker starts anyway (it resumes)
BEAT_EVERY_S = 60  # setup heartbeats while pip runs: each one is a commit to the run's store
HOLD_S = 6 * 3600  # how long a pod that cannot end itself waits, after its error record, for the supervisor


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
        ended = request_pod_end(self.env)
        self.exit_or_hold(recorded and not again, ended)

    def record(self, text, again):
        try:
            write_error(self.env, text)
        except Exception as e:  # noqa: BLE001 - the controller's startup timeout is the backstop
            log("could not record the error in the store (%s)" % type(e).__name__)
            return False
        log("recorded the error in the run's store (%s)" % ("retryable once" if again else "not retryable"))
        return True

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
    # A pod billed from when its command runs, not from its create (a Hugging Face job: no create time
    # reaches it) counts its money from here, installs included (autoslm/engine/pod/watchdog.py).
    os.environ.setdefault("AUTOSLM_BILLED_FROM", "%.3f" % time.time())
    boot = Boot(dict(os.environ))
    boot.preflight(wheel, old_python)
    if wheel:
        install_autoslm(boot, wheel, want_vllm)
    else:
        install_packages(boot)
    boot.prefetch()
    return run_worker(worker_command(command, boot.py))


if __name__ == "__main__":
    sys.exit(main())
