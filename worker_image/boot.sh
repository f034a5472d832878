#!/bin/sh
# How every pod starts: install autoslm's shipped wheel (bootstrap pods only), prefetch the run's model,
# then run the worker. The worker image's entrypoint and the bootstrap start command are this one file.
#
#   boot.sh [--wheel store:<sha256>/<file>.whl] [--] [command ...]   # default: python -m autoslm.engine
#
# Worker image (worker_image/Dockerfile): ENTRYPOINT, autoslm already installed, no --wheel.
# Bootstrap pod (compute.image = "bootstrap"): the controller sends this file's text as
# `sh -c '<text>' autoslm-boot --wheel store:<sha256>/autoslm-<v>-py3-none-any.whl -- python -m autoslm.engine`
# to a public image that carries torch (and vLLM). It fetches the wheel from the run's store
# ($AUTOSLM_STORE; $HF_ENDPOINT and $HF_TOKEN for a Hub repo), installs it held to the
# requirements-gpu.txt inside the wheel -- never installing or replacing torch or vllm, which are held
# at the versions the image has -- and then goes on exactly as the image does. Each stage writes a
# "setup" heartbeat that `autoslm status` and `watch` show; a failed install is a non-retryable error
# in the store, after which the pod ends itself.
#
# POSIX sh (dash, busybox ash): a base image may have no bash. It must never print the environment
# (HF_TOKEN and the pod-scoped provider key live there) nor put a secret on a command line.
set -u

PREFETCH_TIMEOUT_S=1800  # the prefetch may take this long before the worker starts anyway (it resumes)
BEAT_EVERY_S=60          # setup heartbeats while pip runs: each one is a commit to the run's store
HELD="torch vllm torchvision torchaudio triton"  # what the base image brings; never installed here

log() { printf '[autoslm] %s\n' "$*"; }

wheel=
while [ "$#" -gt 0 ]; do
  case "$1" in
    --wheel)
      if [ "$#" -lt 2 ]; then log "--wheel needs a store:<sha256>/<file>.whl reference"; exit 2; fi
      wheel=$2
      shift 2
      ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [ "$#" -eq 0 ]; then
  set -- python -m autoslm.engine
fi

# Some images have only python3 (the vLLM image); the command says `python`.
PY=$(command -v python3 || command -v python || true)
if [ -z "$PY" ]; then
  log "no python3 or python on PATH: this image cannot run autoslm"
  exit 2
fi
if [ "$1" = python ] && ! command -v python >/dev/null 2>&1; then
  shift
  set -- "$PY" "$@"
fi

now() { date +%s; }

# A "setup" heartbeat (and event) in the run's store; needs autoslm importable. Never fatal.
beat() {
  "$PY" -m autoslm.engine.pod.boot beat "$1" || log "$1"
}

# The install failed: a non-retryable error in the store, then the pod ends itself.
fail() {
  log "$1"
  if "$PY" -c 'import autoslm.engine.pod.boot' >/dev/null 2>&1; then
    "$PY" -m autoslm.engine.pod.boot fail "$1" --log "${2:-}"
  fi
  exit 2
}

pip_install() {
  # PIP_BREAK_SYSTEM_PACKAGES: images that install Python system-wide mark it externally managed.
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$PY" -m pip install --no-input "$@"
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

# The versions of what the image brings (HELD), one "name==version" a line; torch is required.
held_versions() {
  # shellcheck disable=SC2086 # one argument per name in HELD
  "$PY" - $HELD <<'EOF'
import sys
from importlib import metadata

for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
EOF
}

# requirements-gpu.txt (from the wheel) with the held packages pinned at what the image has.
write_constraints() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import re, sys, zipfile

wheel, held_file, out = sys.argv[1:]
held = [line for line in open(held_file).read().splitlines() if line]
names = {line.split("==")[0].lower() for line in held}
pins = zipfile.ZipFile(wheel).read("autoslm/_image/requirements-gpu.txt").decode().splitlines()
keep = [p for p in pins if not (re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==", p) and
                                re.match(r"^\s*([A-Za-z0-9_.-]+)", p).group(1).lower().replace("_", "-") in names)]
open(out, "w").write("\n".join(keep + held) + "\n")
EOF
}

install_autoslm() {
  dir=${TMPDIR:-/tmp}/autoslm-boot
  mkdir -p "$dir"
  started=$(now)
  log "fetching autoslm from the run's store ($1)"
  whl=$(fetch_wheel "$1" "$dir") || { log "could not fetch autoslm's wheel (see above)"; exit 2; }
  version=$(basename "$whl" | cut -d- -f2)
  held_versions > "$dir/held-before.txt"
  if ! grep -q '^torch==' "$dir/held-before.txt"; then
    log "this image has no torch: a bootstrap pod installs autoslm on an image that carries torch, never torch itself"
    exit 2
  fi
  log "the image brings $(tr '\n' ' ' < "$dir/held-before.txt")"
  write_constraints "$whl" "$dir/held-before.txt" "$dir/constraints.txt" || { log "could not read requirements-gpu.txt from $whl"; exit 2; }
  # The [gpu] extra needs vllm, which only an image can bring: without it the worker generates with transformers.
  extras=worker
  if grep -q '^vllm==' "$dir/held-before.txt"; then
    extras=worker,gpu
  fi

  # First autoslm and its light dependencies (seconds), so that every later stage can write a heartbeat.
  if ! { pip_install --no-deps --force-reinstall "$whl" && pip_install -c "$dir/constraints.txt" "$whl"; } > "$dir/pip-core.log" 2>&1; then
    tail -n 20 "$dir/pip-core.log"
    log "could not install autoslm $version itself (pip's output above); the controller ends this pod at its startup timeout"
    exit 2
  fi
  beat "installing autoslm $version [$extras]: $(($(now) - started)) s"

  pip_install -c "$dir/constraints.txt" "${whl}[${extras}]" > "$dir/pip.log" 2>&1 &
  pid=$!
  last=$(now)
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    if [ $(($(now) - last)) -ge "$BEAT_EVERY_S" ]; then
      last=$(now)
      beat "installing autoslm $version [$extras]: $((last - started)) s"
    fi
  done
  wait "$pid"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$dir/pip.log"
    fail "installing autoslm $version [$extras] on this image failed (pip exit $rc); its last lines are in the error" "$dir/pip.log"
  fi
  held_versions > "$dir/held-after.txt"
  if ! cmp -s "$dir/held-before.txt" "$dir/held-after.txt"; then
    fail "installing autoslm $version changed the image's $(tr '\n' ' ' < "$dir/held-before.txt")to $(tr '\n' ' ' < "$dir/held-after.txt")" "$dir/pip.log"
  fi
  "$PY" -c 'import autoslm; print("[autoslm] autoslm", autoslm.__version__, "from", autoslm.__file__)'
  beat "installed autoslm $version [$extras] in $(($(now) - started)) s"
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

if [ -n "$wheel" ]; then
  install_autoslm "$wheel"
fi
prefetch
# exec: the worker becomes the container's main process (tini's child in the image), so SIGTERM reaches it.
exec "$@"
