"""The CLI's tables and usage errors, through the real `autoslm` process.

.venv/bin/python -m pytest tests/integration/test_cli_views.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from autoslm.controller.registry import Registry, RunRecord
from autoslm.sdk import new_run_id
from autoslm.spec import validate_dict

SPEC = validate_dict({"name": "many", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}})


def make_runs(home, n: int, name: str = "many", steps: int = 10) -> list[str]:
    """``n`` finished runs in the registry (nothing to tick: the listing is what is measured)."""
    reg = Registry(home)
    ids = []
    now = time.time()
    for i in range(n):
        rid = new_run_id(name, now + 7 * i)  # real ids: long shared prefixes, seconds apart
        ids.append(rid)
        reg.create_run(RunRecord(rid, name, "sft", SPEC.to_json(), None, (home / "artifacts").as_uri(), now + i, now + 3600), [0])
        reg.update_replica(rid, 0, state="succeeded", step=steps, total_steps=steps)
    reg.close()
    return ids


def test_list_keeps_every_run_id_whole_and_marks_the_prefix_every_command_takes(cli, home):
    ids = make_runs(home, 200)
    for cols in ("60", "100"):
        r = cli("list", env={"COLUMNS": cols})
        assert r.code == 0, r.err
        assert all(rid in r.out for rid in ids), f"a run id was cut at {cols} columns"
        assert max(len(line) for line in r.out.splitlines()) <= int(cols)
    from autoslm.views.commands import unique_prefixes

    prefixes = unique_prefixes(ids)
    for rid in (ids[0], ids[57], ids[-1]):
        p = prefixes[rid]
        assert len(p) < len(rid)
        st = cli("status", p, "--json")
        assert st.code == 0, st.err
        assert json.loads(st.out)["run_id"] == rid
    ambiguous = cli("status", "many-20")
    assert ambiguous.code == 2 and "matches 200 runs" in ambiguous.err


def test_status_and_list_print_every_run_id_whole_on_one_line_at_80_100_and_200_columns(cli, home):
    # The ids users met wrapped at 80 columns: a long spec name, a four-digit step count.
    ids = make_runs(home, 12, name="quickstart-grpo-with-a-longer-name", steps=1200)
    assert len(ids[0]) > 50
    for cols in (80, 100, 200):
        for args in (("status",), ("list",)):
            r = cli(*args, env={"COLUMNS": str(cols)})
            assert r.code == 0, r.err
            lines = r.out.splitlines()
            for rid in ids:  # whole, on one line, with its state beside it
                (line,) = [x for x in lines if rid in x]
                assert line.startswith(rid) and "succeeded" in line, (cols, line)
            assert max(map(len, lines)) <= cols, (cols, r.out)
            header = lines[0].split()
            assert header[:2] == ["run", "id"] and "state" in header
            if cols == 200:  # room for everything
                assert {"phase", "step", "provider", "restarts", "created"} <= set(header), header
        one = cli("status", ids[3], env={"COLUMNS": str(cols)})
        assert one.code == 0 and one.out.splitlines()[0].startswith(f"run {ids[3]}: "), one.out
    # --json is the same at any width.
    wide, narrow = (cli("list", "--json", env={"COLUMNS": c}).out for c in ("200", "80"))
    assert json.loads(wide) == json.loads(narrow) and {r["run_id"] for r in json.loads(wide)} == set(ids)


def test_mistyped_commands_and_options_are_usage_errors_with_the_nearest(cli):
    r = cli("reprot", "x")
    assert r.code == 2
    assert "Usage:" in r.err and "No such command 'reprot'" in r.err and "'report'" in r.err
    assert "internal error" not in r.err and "Traceback" not in r.err
    r = cli("frobnicate")
    assert r.code == 2 and "the nearest command is" in r.err
    r = cli("status", "--jsn")
    assert r.code == 2 and "Usage:" in r.err and "--json" in r.err


def test_the_cli_path_imports_no_pandas_matplotlib_or_torch(home):
    code = (
        "import sys, runpy\n"
        "sys.argv = ['autoslm'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('autoslm', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'pandas', 'matplotlib', 'transformers') if m in sys.modules))\n"
    )
    some = make_runs(home, 3)
    env = {**os.environ, "AUTOSLM_HOME": str(home)}
    for args in (
        ["--help"],
        ["list"],
        ["status"],
        ["report", "--help"],
        ["watch", "--help"],
        ["push", "--help"],
        ["export", "--help"],
        ["report", some[1], "--out", str(home / "r.html")],
    ):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        assert "HEAVY=\n" in p.stdout, (args, p.stdout[-500:], p.stderr[-500:])


def test_every_command_has_a_help_page(cli):
    from autoslm.cli import app_command_names

    for name in app_command_names():
        r = cli(name, "--help")
        assert r.code == 0 and "Usage:" in r.out, (name, r.err[-500:])


def test_output_that_is_not_a_terminal_is_never_hard_wrapped_inside_a_path(cli, tmp_path):
    # A spec deep under a long directory: at 80 columns, `validate`'s line is far wider than the console.
    deep = tmp_path / ("a-rather-long-directory-name-" * 3) / ("and-another-one-below-it-" * 3)
    deep.mkdir(parents=True)
    spec = deep / "quickstart.toml"
    spec.write_text('name = "deep"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n')
    sweep = deep / "sweep.toml"
    sweep.write_text(
        'name = "deep"\nmodel = "autoslm/tiny"\nseed = [0, 1]\n[environment]\nid = "autoslm/arith"\n'
        '[sweep]\n"train.learning_rate" = [1e-3, 3e-3]\n'
    )
    assert len(str(spec)) > 120
    for path, words in ((spec, "ok: "), (sweep, "= 4 runs")):
        for cols in ("80", "200"):
            r = cli("validate", str(path), env={"COLUMNS": cols})
            assert r.code == 0, r.err
            assert len(r.out.splitlines()) == 1 and str(path) in r.out and words in r.out, r.out
