"""The training worker (runs on the pod or as a local process). Needs the ``worker`` extra.

Three rooms, named for when and where their code runs:

- ``pod/``: the process around training: the runner and its training phases (begin -> data -> load ->
  trainer -> before-eval -> train -> after-eval -> save -> report),
  the uploader thread, heartbeats, the watchdog, self-termination, the model prefetch and the
  worker's failure rules. Only rank 0 talks to the store.
- ``train/``: what builds and runs a trainer: the GPU recipe, model loading, SFT, GRPO, training
  arguments, ``--print-config``, adapter merging and the built-in tiny model.
- ``rollout/``: what GRPO generates and scores: multi-turn episodes, rewards, evaluation.

``rank_launcher.py`` starts N training processes per pod; ``distributed.py`` is what each of them
does. The engine may import the foundation (spec, recipes, catalog, layout, errors, secrets),
``envs`` and ``store``, and ``providers.http`` (the pod ends itself through its vendor's API); never
the controller, the SDK or the views. Nothing here imports torch at module import time except where
a module says so.
"""
