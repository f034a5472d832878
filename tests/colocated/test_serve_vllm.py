"""`autoslm serve` on this machine with vLLM's CPU build (the .venv-vllm stack: make test-vllm): vLLM's own
OpenAI server answers a `curl` with the run's adapter, `autoslm chat` talks to it, `autoslm cancel` ends it.

The run is a 4-step SFT of the built-in model (10-25 s); starting vLLM's server costs 25-65 s on 2 loaded
cores (the whole test: 90-100 s there).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from autoslm.engine.train.gpu import installed
from tests.e2e.test_sft_local import run_id_from

if not installed("vllm"):
    pytest.skip("vllm is not installed in this stack (make test-vllm runs these in .venv-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_serve_answers_a_curl_with_the_adapter_chat_uses_it_and_cancel_ends_it(cli, tmp_path, home):
    spec = tmp_path / "tiny.toml"
    spec.write_text(f"""# autoslm launch {spec}
name = "served"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 64, n_eval = 8, max_operand = 9 }}
[train]
method = "sft"
max_steps = 4
batch_size = 8
max_length = 64
lora_rank = 8
lora_alpha = 16
[artifacts]
path = "{tmp_path / "store"}"
""")
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)

    r = cli("serve", run_id, timeout=300)
    assert r.code == 0, r.out + r.err
    url = re.search(r"OpenAI base URL: (\S+)", r.out).group(1)
    (curl,) = [line for line in r.out.splitlines() if line.startswith("curl ")]
    # The printed line, run as a user would paste it: vLLM answers with the LoRA module the run's name names.
    answer = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    body = json.loads(answer.stdout)
    assert body["model"] == "served" and body["choices"][0]["message"]["content"], body
    assert body["system_fingerprint"].startswith("vllm-"), body  # vLLM's own server, not a stand-in
    models = json.loads(subprocess.run(["curl", "-s", f"{url}/models"], capture_output=True, text=True, timeout=60).stdout)
    (lora,) = [m for m in models["data"] if m["id"] == "served"]
    assert lora["root"].endswith("adapter") and lora["parent"] == "autoslm/tiny", lora

    r = cli("chat", run_id, "--prompt", "2+3=", "--max-new-tokens", "4")
    assert r.code == 0 and "talking to the serve" in r.err and url in r.err, r.out + r.err
    assert r.out.strip()

    serve_id = json.loads((home / "serves" / f"{run_id}.json").read_text())["serve_run"]
    pod_id = json.loads(cli("status", serve_id, "--json").out)["pod_id"]
    r = cli("cancel", run_id)  # the run ended long ago: its serve is what is cancelled
    assert r.code == 0 and "cancelled" in r.out and "-serve-" in r.out, r.out + r.err
    gone = subprocess.run(["curl", "-s", "--max-time", "5", f"{url}/models"], capture_output=True, text=True)
    assert gone.returncode != 0, gone.stdout  # nothing listens there any more
    assert json.loads(cli("status", serve_id, "--json").out)["state"] == "cancelled"
    group = int(pod_id.split("-")[1])  # the serve's process group (its worker and vLLM's processes)
    assert not [p for p in Path("/proc").glob("[0-9]*/stat") if _in_group(p, group)], "a process of the serve is left"


def _in_group(stat: Path, group: int) -> bool:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[2] == str(group) and fields[0] != "Z"
