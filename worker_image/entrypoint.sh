#!/usr/bin/env bash
# The worker image's entrypoint: prefetch the run's base model into the Hub cache (timed), then run the
# pod's command -- by default `python -m autoslm.engine`; RunPod (`args`) and Vast (`runtype = "args"`)
# pass autoslm's command as this script's arguments.
#
#   docker run --gpus all -e AUTOSLM_JOBSPEC="$(cat spec.json)" -e HF_TOKEN ... ghcr.io/autoslm/worker:0.1.0
#
# It must never print the environment (HF_TOKEN and the pod-scoped provider key live there) or stop the
# worker from starting: a failed prefetch is reported and the worker downloads (and reports errors) itself.
set -uo pipefail

if [ "$#" -eq 0 ]; then
  set -- python -m autoslm.engine
fi

# Seconds the prefetch may take before the worker starts anyway (it resumes the partial download).
PREFETCH_TIMEOUT_S=1800

prefetch() {
  local started ended
  started=$(date +%s)
  timeout "$PREFETCH_TIMEOUT_S" python - <<'PY'
import json, os, sys

spec = os.environ.get("AUTOSLM_JOBSPEC")
if not spec:
    print("[autoslm] prefetch: no AUTOSLM_JOBSPEC, nothing to fetch", flush=True)
    sys.exit(0)
try:
    model = json.loads(spec).get("model") or ""
except ValueError:
    print("[autoslm] prefetch: AUTOSLM_JOBSPEC is not JSON; the worker will report it", flush=True)
    sys.exit(0)
# Built-in models are built locally and local paths need no download.
if not model or model.startswith(("autoslm/", "/", "./", "~")):
    print(f"[autoslm] prefetch: {model or 'no model'} needs no download", flush=True)
    sys.exit(0)
from huggingface_hub import snapshot_download

# Weights, config and tokenizer only: no other frameworks' weights, no repo extras.
try:
    path = snapshot_download(
        model,
        allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*", "*.tiktoken"],
    )
except Exception as e:  # one line in the pod log; the worker hits (and reports) the same error properly
    print(f"[autoslm] prefetch: {model}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", flush=True)
    sys.exit(1)
print(f"[autoslm] prefetch: {model} -> {path}", flush=True)
PY
  local rc=$?
  ended=$(date +%s)
  # The worker reports this in its first heartbeat and event, so `autoslm status` can show it.
  export AUTOSLM_PREFETCH_S=$((ended - started))
  if [ "$rc" -eq 0 ]; then
    echo "[autoslm] prefetch took $((ended - started))s"
  elif [ "$rc" -eq 124 ]; then
    echo "[autoslm] prefetch did not finish in ${PREFETCH_TIMEOUT_S}s; starting the worker, which resumes the download"
  else
    echo "[autoslm] prefetch failed (exit $rc) after $((ended - started))s; starting the worker, which reports any real error"
  fi
}

prefetch
# exec: the worker becomes tini's child directly, so SIGTERM from the provider reaches it.
exec "$@"
