"""``python -m autoslm.engine.export REQUEST.json RESULT.json``: one export (see the package's docstring).

REQUEST holds: model, trust_remote_code, adapter (a local folder), format, quant, dtype (the run's),
dest, free_bytes (what the destination's disk has), run_id, thinking, sampling. RESULT gets the files
written and the notes. Progress goes to stdout, one line per event; a refusal or failure is the last
line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m autoslm.engine.export REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    from autoslm.engine.export.plan import Refused, make_plan
    from autoslm.engine.export.run import Failed, export
    from autoslm.engine.gc_pause import collector_paused
    from autoslm.engine.unused_imports import import_stack_without_unused
    from autoslm.secrets import autoslm_home

    with collector_paused():  # the imports as a worker's start makes them (engine/gc_pause.py, engine/unused_imports.py)
        import_stack_without_unused()

    def log(msg: str) -> None:
        print(msg, flush=True)

    req = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    t0 = time.monotonic()
    try:
        plan = make_plan(req, autoslm_home(), log)
        files = export(plan, autoslm_home(), log)
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr, flush=True)
        return 2
    except Failed as e:
        print(f"failed: {e}", file=sys.stderr, flush=True)
        return 1
    result = {"files": [str(f) for f in files], "notes": plan.notes, "seconds": round(time.monotonic() - t0, 2)}
    result.update(params=plan.params, arch=plan.arch)
    tmp = Path(args[1] + f".{os.getpid()}")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
