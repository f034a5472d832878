"""The training worker: ``python -m autoslm.engine`` (a provider starts it; see engine/pod/context.py).

``python -m autoslm.engine --print-config SPEC [--device cuda|cpu] [--gpu NAME]`` prints what a pod
would run for SPEC instead (engine/train/print_config.py): no weights, no network.
"""

import sys

if __name__ == "__main__":
    if "--print-config" in sys.argv[1:]:
        from autoslm.engine.train.print_config import main

        args = [a for a in sys.argv[1:] if a != "--print-config"]
        raise SystemExit(main(args))
    from autoslm.engine.pod.runner import run_worker

    raise SystemExit(run_worker())
