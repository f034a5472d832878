"""The reward-file check (``autoslm.envs.reward_check``): what a misbehaving file may not do to the
machine that validates it (leave processes behind, take unbounded memory or stderr), that the bytes
checked are the bytes shipped, and what a file importing a package only the pod installs gets."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoslm.errors import SpecError
from autoslm.spec import load_spec
from autoslm.store.local import LocalStore
from autoslm.store.shipping import ship_local_files

REPO = Path(__file__).resolve().parents[2]
GOOD = "def f(prompts, completions, **kw):\n    return [0.0 for _ in completions]\n"


def write_spec(folder: Path, body: str, extra: str = "", name: str = "r.py") -> Path:
    (folder / name).write_text(body)
    path = folder / "spec.toml"
    path.write_text(
        f'name = "rw"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\nrewards = ["{name}:f"]\n{extra}\n'
        '[train]\nmethod = "grpo"\nmax_steps = 2\nprompts_per_step = 2\ngroup_size = 2\nmax_completion_tokens = 8\n'
        "max_length = 64\n"
    )
    return path


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's reaping is left


def wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


STARTS = (
    """import os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
plain = subprocess.Popen(["sleep", "300"])
own = subprocess.Popen(["sleep", "301"], start_new_session=True)
with open(os.path.join(here, "pids.txt"), "w") as out:
    out.write(f"{plain.pid} {own.pid}")
"""
    + GOOD
)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the processes through /proc")
@pytest.mark.parametrize("then", ["", "raise RuntimeError('no')\n"], ids=["passes", "fails"])
def test_processes_a_reward_file_starts_end_with_the_check_setsid_ones_too(tmp_path, then):
    path = write_spec(tmp_path, STARTS + then)
    try:
        load_spec(path)
    except SpecError:
        pass
    pids = [int(p) for p in (tmp_path / "pids.txt").read_text().split()]
    try:
        assert wait_gone(pids) == [], "a process the reward file started outlived validate"
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def test_a_file_that_takes_too_much_memory_is_one_line(tmp_path):
    from autoslm.envs.reward_check import check_file
    from autoslm.envs.reward_refs import parse_reward, placeholder_row

    (tmp_path / "big.py").write_text("blob = bytearray(512 * 1024 * 1024)\n" + GOOD)
    problem = check_file(
        tmp_path / "big.py", parse_reward(f"{tmp_path / 'big.py'}:f"), placeholder_row(None), memory_bytes=256 * 1024**2
    )
    assert problem == "big.py:f: importing the file needed more than the 0.25 GiB of memory the check allows", problem


def test_the_default_memory_bound_refuses_a_file_that_grows_past_it(tmp_path):
    path = write_spec(tmp_path, "blob = bytearray(3 * 1024**3)\n" + GOOD)
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert "r.py:f: importing the file needed more than the 2 GiB of memory the check allows" in str(e.value), e.value


def test_only_the_end_of_a_flood_of_stderr_is_kept_and_its_last_line_is_said(tmp_path):
    from autoslm.envs.reward_sandbox import STDERR_KEEP_BYTES, _Tail

    r, w = os.pipe()
    tail = _Tail(os.fdopen(r, "rb"))
    with os.fdopen(w, "wb") as out:
        for _ in range(64):
            out.write(b"x" * 65536 + b"\n")
        out.write(b"the last line\n")
    assert tail.text().endswith("the last line\n") and len(tail.data) <= 2 * STDERR_KEEP_BYTES
    flood = (
        "import os, sys\nfor _ in range(256):\n    sys.stderr.write('y' * 65535 + '\\n')\nsys.stderr.write('gave up\\n')\n"
        "sys.stderr.flush()\nos._exit(3)\n"
    )
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path, flood))
    assert "importing the file ended the process (exit code 3): gave up;" in str(e.value), e.value


def test_the_bytes_checked_are_the_bytes_shipped_not_a_later_rewrite(tmp_path):
    path = write_spec(tmp_path, GOOD)
    spec = load_spec(path)
    (tmp_path / "r.py").write_text("raise SystemExit('never checked')\n" + GOOD)
    shipped = ship_local_files(spec, LocalStore(tmp_path / "store"))
    sha = shipped.environment.rewards[0].split("store:")[1].split("/")[0]
    assert sha == hashlib.sha256(GOOD.encode()).hexdigest()
    assert (tmp_path / "store" / "data" / "sha256" / sha).read_bytes() == GOOD.encode()


POD_ONLY = "import surely_not_installed_here_pkg\n" + GOOD


def test_a_package_only_the_pod_installs_is_a_warning_and_what_can_be_checked_is(tmp_path, cli):
    extra = 'packages = ["surely-not-installed-here-pkg==1.0"]'
    path = write_spec(tmp_path, POD_ONLY, extra)
    r = cli("validate", str(path))
    assert r.code == 0, r.err
    warnings = [line for line in r.err.splitlines() if line.startswith("warning:")]
    assert (
        len(warnings) == 1
        and "r.py:f: the file imports 'surely_not_installed_here_pkg', not installed here" in warnings[0]
        and "only the pod can import it" in warnings[0]
    ), r.err
    (tmp_path / "r.py").write_text(POD_ONLY.replace("def f(", "def g("))
    r = cli("validate", str(path))
    assert r.code != 0 and "r.py:f: the file has no 'f'" in r.err, r.err
    (tmp_path / "r.py").write_text(POD_ONLY)
    r = cli("validate", str(write_spec(tmp_path, POD_ONLY)))  # no packages: nothing on the pod provides it
    assert r.code != 0 and "No module named 'surely_not_installed_here_pkg'" in r.err, r.err


@pytest.mark.parametrize("version", ["--pre", "-e", "latest", "1.0 --pre"])
def test_a_verifiers_id_whose_version_is_not_a_version_is_refused(tmp_path, cli, version):
    path = tmp_path / "spec.toml"
    path.write_text(
        f'name = "v"\nmodel = "autoslm/tiny"\n[environment]\nid = "owner/foo@{version}"\n'
        '[compute]\nprovider = "runpod"\ngpu = "A100 80GB SXM"\n'
        '[train]\nmethod = "grpo"\nmax_steps = 2\nprompts_per_step = 2\ngroup_size = 2\nmax_completion_tokens = 8\n'
        "max_length = 64\n"
    )
    r = cli("validate", str(path))
    assert r.code != 0 and "environment.id" in r.err and f"owner/foo@{version}" in r.err, (r.code, r.err)


def test_the_check_runs_as_its_own_module(tmp_path):
    """`python -m autoslm.envs.reward_check <folder>` answers for the bytes it was given, not the file's."""
    import json
    import pickle

    from autoslm.envs.reward_refs import parse_reward, placeholder_row

    (tmp_path / "r.py").write_text("raise SystemExit('the file as it is now')\n")
    ref = parse_reward(f"{tmp_path / 'r.py'}:f")
    box = tmp_path / "box"
    box.mkdir()
    (box / "in.pickle").write_bytes(
        pickle.dumps((str(tmp_path / "r.py"), ref, placeholder_row(None)[:2] + (True,), 5, GOOD.encode(), (), 2 * 1024**3))
    )
    r = subprocess.run(
        [sys.executable, "-m", "autoslm.envs.reward_check", str(box)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((box / "out.json").read_text()) == {"problem": None, "warning": None}


def test_a_module_only_the_pod_has_imported_inside_the_function_is_a_warning_too(tmp_path):
    from autoslm.envs.reward_check import reward_warnings

    body = "def f(prompts, completions, **kw):\n    import surely_not_installed_here_pkg\n    return [0.0 for _ in completions]\n"
    spec = load_spec(write_spec(tmp_path, body, 'packages = ["surely-not-installed-here-pkg==1.0"]'))
    (warning,) = reward_warnings(spec)
    assert warning[0] == "environment.rewards.0" and "only the pod can import it and call f" in warning[1], warning
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path, body))
    assert "calling it on the first row of the data raised ModuleNotFoundError" in str(e.value), e.value
