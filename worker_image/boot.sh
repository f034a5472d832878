#!/bin/sh
# How every pod starts: find a python >= 3.11, then worker_image/boot.py does the rest (installs
# autoslm's shipped wheel on a bootstrap pod, prefetches the run's model, runs the worker).
#
#   boot.sh [--wheel store:<sha256>/<file>.whl] [--vllm] [--] [command ...]   # default: python -m autoslm.engine
#
# Worker image (worker_image/Dockerfile): ENTRYPOINT, boot.py and the modules it imports (boot_rules.py,
# boot_net.py, boot_install.py) beside this file, autoslm installed.
# Bootstrap pod: the controller sends this file's text, comment lines dropped and BOOT_PY set to
# boot.py and those modules as one program, compressed (autoslm/controller/images.py), as
# `sh -c '<text>' autoslm-boot --wheel ... -- ...`.
# Where no python is >= 3.11, boot.py still runs on the newest one there (it reads as python 3.8) to
# record that in the run's store; with no python at all nothing can be recorded.
#
# POSIX sh (dash, busybox ash): a base image may have no bash. It must never print the environment
# (HF_TOKEN and the pod-scoped provider key live there) nor put a secret on a command line.
set -u
BOOT_PY=''

PY=
OLD=
for cand in python3 python python3.14 python3.13 python3.12 python3.11; do
  p=$(command -v "$cand" 2>/dev/null) || continue
  if "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    PY=$p
    break
  fi
  if [ -z "$OLD" ]; then
    OLD=$p
  fi
done
if [ -z "$PY" ]; then
  if [ -z "$OLD" ]; then
    echo "[autoslm] no python3 or python on PATH: this image cannot run autoslm (nothing can be recorded without one)"
    exit 2
  fi
  PY=$OLD
  set -- --old-python "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>&1 | head -n 1)" "$@"
fi

if [ -n "$BOOT_PY" ]; then
  exec "$PY" -c 'import base64, sys, zlib; exec(compile(zlib.decompress(base64.b64decode(sys.argv.pop(1))), "boot.py", "exec"))' "$BOOT_PY" "$@"
fi
exec "$PY" "$(dirname "$0")/boot.py" "$@"
