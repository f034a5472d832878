"""The worker process around training: runner, uploader, heartbeats, watchdog, self-termination,
prefetch, failure rules. Runs on the pod (or as the local provider's process)."""
