"""The training worker (runs on the pod or as a local process). Needs the ``worker`` extra.

Nothing in this package imports torch at module import time except where a module says so; the
control plane imports ``engine.batching`` (pure) for validation.
"""
