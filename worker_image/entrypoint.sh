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
  # Downloads weights, config and tokenizer, writing a progress heartbeat every few minutes
  # (autoslm/engine/pod/prefetch.py); a failure there never stops the worker from starting.
  timeout "$PREFETCH_TIMEOUT_S" python -m autoslm.engine.pod.prefetch
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
