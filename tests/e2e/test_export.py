"""`autoslm export` and `push --merged/--gguf` end to end on a run of the SFT quickstart, through the CLI:
the merged weights load in plain transformers and give the logits of base + adapter under peft; the GGUF
(f16, q8_0) written by llama.cpp's pinned converter loads in transformers' GGUF loader with the merged
model's logits, and (where llama.cpp's runtime is built: `make test-long` builds it and runs those
checks, `long`) tokenizes as transformers does, answers with the merged model's greedy tokens and writes
k-quants; the Modelfile carries the run's chat template and stop
tokens; the pushed repos load without peft and their cards name the base model; each bad input is one
line and exit 2, and a failed conversion leaves nothing behind.

The converter is the copy `make converter` fetched (.llama-cpp/), given to the test's home as a user's
first export would fetch it into theirs (without it, the first export here fetches it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_models_dir
from tests.fakes.hub import FAKE_HUB_TOKEN, FakeHub
from tests.shared_runs import locked, once, session_folder

pytestmark = [pytest.mark.e2e]

LLAMA = REPO / ".llama-cpp"
LLAMA_BIN = LLAMA / "build" / "bin"
PROMPTS = [f"What is {a} + {b}?" for a, b in ((1, 2), (3, 4), (5, 5), (9, 8), (7, 0), (2, 6), (4, 4), (8, 1), (6, 3), (0, 9))]
# bf16 keeps 8 bits of mantissa: logits this close are the same model at bf16's precision.
BF16_RTOL = 2**-7


class World:
    """One run of the SFT quickstart for the whole session, in a home every xdist worker shares
    (tests/shared_runs.py: exports of one run are what these tests look at, not training; concurrent
    commands on one home are the product's everyday case). ``tmp``: this worker's own folder."""

    def __init__(self, shared: Path, tmp: Path):
        self.shared, self.tmp, self.home = shared, tmp, shared / "home"
        path = os.environ.get("PATH", "")
        self.env = {**os.environ, "AUTOSLM_HOME": str(self.home), "PYTHONPATH": str(REPO), "PATH": path}
        # llama.cpp's library for llama-cpp-python's bindings (`make llama-cpp` builds them without one of their own).
        self.with_llama = {**self.env, "LLAMA_CPP_LIB_PATH": str(LLAMA_BIN)}
        self.run_id = once(shared, self._train)

    def _train(self) -> str:
        from autoslm.recipes.export import CONVERTER_VERSION

        (self.home / "llama.cpp").mkdir(parents=True, exist_ok=True)
        models = self.home / "models"
        if not models.is_symlink():
            models.symlink_to(shared_models_dir(self.tmp), target_is_directory=True)
        made = LLAMA / f"convert-{CONVERTER_VERSION}"
        if (made / ".complete").exists() and not (self.home / "llama.cpp" / made.name).exists():
            (self.home / "llama.cpp" / made.name).symlink_to(made, target_is_directory=True)
        r = self.cli("launch", str(REPO / "jobspecs" / "quickstart.toml"))
        assert r.returncode == 0, r.stdout + r.stderr
        return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and "launched" in line)

    def cli(self, *args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "autoslm", *args],
            capture_output=True,
            text=True,
            env=env or self.env,
            cwd=str(REPO),
            timeout=timeout,
        )

    def export(self, *args: str, env: dict | None = None) -> Path:
        """The folder `autoslm export RUN ARGS` wrote, once per ARGS for the session (the tests look at the
        same exports; a worker that wants one another is writing waits for it)."""
        out = self.shared / "out"
        out.mkdir(exist_ok=True)
        to = out / "-".join(a.strip("-") for a in args)
        with locked(out / f"{to.name}.lock"):
            if not to.exists():
                r = self.cli("export", self.run_id, *args, "--to", str(to), env=env)
                assert r.returncode == 0, r.stdout + r.stderr
                assert "done in" in r.stdout  # the steps said as they went
        return to


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(session_folder(tmp_path_factory, "export-run"), tmp_path_factory.mktemp("export"))


def chat_ids(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return tokenizer(text, add_special_tokens=False).input_ids


def logits(model, tokenizer) -> list:
    import torch

    with torch.inference_mode():
        return [model(torch.tensor([chat_ids(tokenizer, p)])).logits[0].float() for p in PROMPTS]


def assert_close(got: list, want: list, rtol: float) -> float:
    """Each prompt's logits within ``rtol`` of the largest logit; the largest difference, relative."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        worst = max(worst, float((g - w).abs().max() / w.abs().max()))
    assert worst <= rtol, worst
    return worst


def test_merged_weights_load_without_peft_and_give_the_adapters_logits(world):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = world.export("--format", "merged")
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not (out / "adapter_config.json").exists() and not list(out.glob(".autoslm-export-*"))
    tok = AutoTokenizer.from_pretrained(out)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(world.home / "models" / "tiny-v4", dtype=torch.float32)
    adapter = world.tmp / "adapter"
    assert world.cli("download", world.run_id, "--to", str(adapter)).returncode == 0
    peft = PeftModel.from_pretrained(base, str(adapter)).eval()
    worst = assert_close(logits(merged, tok), logits(peft, tok), BF16_RTOL)
    print(f"merged vs peft: largest logit difference {worst:.2e} of the largest logit")
    assert tok.chat_template and "<|im_start|>" in tok.chat_template


def test_gguf_f16_and_q8_0_load_in_transformers_with_the_merged_logits(world):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    merged_dir = world.export("--format", "merged")
    out = world.export("--format", "gguf")  # f16, the default
    q8 = world.export("--format", "gguf", "--quant", "q8_0")
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "model-f16.gguf"]
    assert sorted(p.name for p in q8.iterdir()) == ["Modelfile", "model-q8_0.gguf"]
    tok = AutoTokenizer.from_pretrained(merged_dir)
    want = logits(AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval(), tok)
    # transformers' GGUF loader reads no head_dim for qwen3 (only qwen3_moe maps attention.key_length):
    # the model's own config gives it; the weights are the GGUF's, dequantized by transformers.
    config = AutoConfig.from_pretrained(merged_dir)
    for folder, name, rtol in ((out, "model-f16.gguf", BF16_RTOL), (q8, "model-q8_0.gguf", 2**-4)):
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32).eval()
        worst = assert_close(logits(model, tok), want, rtol)
        print(f"{name} vs merged: largest logit difference {worst:.2e} of the largest logit")
        gguf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        assert all(gguf_tok(p).input_ids == tok(p).input_ids for p in PROMPTS)


def test_the_gguf_and_its_modelfile_carry_the_runs_chat_template_and_stops(world):
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    from autoslm.engine.export.modelfile import go_template, turn_text

    out = world.export("--format", "gguf")
    tok = AutoTokenizer.from_pretrained(world.export("--format", "merged"))
    fields = GGUFReader(out / "model-f16.gguf").fields
    assert fields["tokenizer.chat_template"].contents() == tok.chat_template
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"  # GPT-2's split, named from tokenizer.json
    text = (out / "Modelfile").read_text()

    def render(messages, generation):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, enable_thinking=False)

    template = go_template(turn_text(render))
    assert "FROM ./model-f16.gguf\n" in text
    assert f'TEMPLATE """{template}"""\n' in text
    assert template.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # the quickstart trained without thinking
    assert 'PARAMETER stop "<|im_end|>"' in text


def _greedy_transformers(folder: Path, ids: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


LLAMA_GREEDY = """
import json, sys
from llama_cpp import Llama
model, text, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = Llama(model_path=model, n_ctx=512, n_threads=1, verbose=False)
ids = llm.tokenize(text.encode(), add_bos=False, special=True)
out = []
for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
    out.append(t)
    if len(out) == n:
        break
print(json.dumps({"prompt": ids, "tokens": out}))
"""


@pytest.mark.long  # with llama.cpp's runtime, which make test-long builds
def test_llama_cpp_answers_with_the_merged_models_greedy_tokens(world):
    if not (LLAMA_BIN / "libllama.so").exists():
        pytest.skip("llama.cpp's runtime is not built here (`make llama-cpp` builds it from the pinned source)")
    from transformers import AutoTokenizer

    merged = world.export("--format", "merged")
    out = world.export("--format", "gguf")
    tok = AutoTokenizer.from_pretrained(merged)
    env = world.with_llama
    # A chat (the answer, then the end of turn over and over) and a plain continuation of the task's text.
    chat = tok.decode(chat_ids(tok, PROMPTS[3]))
    for text in (chat, "What is 12 + 7? 19. What is 3 + 5? 8. What is 6 + 2?"):
        ids = tok(text, add_special_tokens=False).input_ids
        want = _greedy_transformers(merged, ids, 24)
        cmd = [sys.executable, "-c", LLAMA_GREEDY, str(out / "model-f16.gguf"), text, "24"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        got = json.loads(p.stdout.strip().splitlines()[-1])
        assert got["prompt"] == ids  # llama.cpp splits and merges the text as transformers does
        assert got["tokens"] == want, (tok.decode(got["tokens"]), tok.decode(want))
        print(f"llama.cpp f16 greedy = transformers merged greedy: {tok.decode(want)!r}")
    assert len(set(want)) > 3  # the continuation is not one token repeated: the comparison can fail


def test_k_quants_without_llamas_quantizer_say_what_to_install(world):
    # No llama-quantize on PATH, and llama-cpp-python's bindings without the library they load: refused.
    to = world.tmp / "out" / "q4"
    bare = {**world.env, "PATH": "/usr/bin:/bin"}
    bare.pop("LLAMA_CPP_LIB_PATH", None)
    r = world.cli("export", world.run_id, "--format", "gguf", "--quant", "q4_k_m", "--to", str(to), env=bare)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "llama-quantize" in r.stderr and "llama-cpp-python" in r.stderr and not to.exists()


@pytest.mark.long  # with llama.cpp's runtime, which make test-long builds
def test_k_quants_take_llamas_quantizer(world):
    if not (LLAMA_BIN / "libllama.so").exists():
        pytest.skip("llama.cpp's library is not built here (`make llama-cpp`)")
    # libllama's quantizer (the function llama-quantize calls) writes the k-quant.
    out = world.export("--format", "gguf", "--quant", "q4_k_m", env=world.with_llama)
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "model-q4_k_m.gguf"]
    from gguf import GGUFReader

    fields = GGUFReader(out / "model-q4_k_m.gguf").fields
    assert fields["general.file_type"].contents() == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert "FROM ./model-q4_k_m.gguf" in (out / "Modelfile").read_text()


def test_the_adapter_alone_as_a_gguf_lora(world):
    from gguf import GGUFReader

    out = world.export("--format", "gguf-lora")
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "adapter-f16.gguf"]
    fields = GGUFReader(out / "adapter-f16.gguf").fields
    assert fields["general.type"].contents() == "adapter" and fields["adapter.type"].contents() == "lora"
    assert "ADAPTER ./adapter-f16.gguf" in (out / "Modelfile").read_text()


def test_the_sdk_returns_the_paths_written(world):
    import autoslm

    files = autoslm.attach(world.run_id, home=world.home).export(world.tmp / "sdk", format="gguf", quant="q8_0")
    assert [f.name for f in files] == ["model-q8_0.gguf", "Modelfile"] and all(f.is_file() for f in files)


def test_push_merged_writes_a_repo_that_loads_without_peft(world):
    import torch
    from huggingface_hub import snapshot_download
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with FakeHub(token=FAKE_HUB_TOKEN) as hub:
        env = {**world.env, **hub.env()}
        r = world.cli("push", world.run_id, "--to", "alice/quick-merged", "--merged", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        files = hub.files("alice/quick-merged", "model")
        assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "README.md"} <= set(files)
        assert "adapter_config.json" not in files
        card = files["README.md"].decode()
        assert card.startswith('---\nbase_model: "autoslm/tiny"\nbase_model_relation: merge\nlibrary_name: transformers\n')
        local = snapshot_download("alice/quick-merged", endpoint=hub.url, token=FAKE_HUB_TOKEN, cache_dir=world.tmp / "hub-cache")
        pushed = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).eval()
        merged = world.export("--format", "merged")
        tok = AutoTokenizer.from_pretrained(local)
        assert_close(logits(pushed, tok), logits(AutoModelForCausalLM.from_pretrained(merged).eval(), tok), 1e-6)

        r = world.cli("push", world.run_id, "--to", "alice/quick-gguf", "--gguf", "--quant", "q8_0", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        files = hub.files("alice/quick-gguf", "model")
        assert {"model-q8_0.gguf", "Modelfile", "README.md"} <= set(files) and "model.safetensors" not in files
        card = files["README.md"].decode()
        assert card.startswith('---\nbase_model: "autoslm/tiny"\nbase_model_relation: quantized\nlibrary_name: gguf\n')
        assert '- "q8_0"' in card and "ollama create" in card
        assert all(FAKE_HUB_TOKEN.encode() not in b for b in files.values())


def test_each_bad_input_is_one_line_and_exit_2_before_anything_is_written(world):
    to = world.tmp / "out" / "refused"
    cancelled = world.cli("launch", str(REPO / "jobspecs" / "quickstart.toml"), "--detach")
    other = next(line.split()[1] for line in cancelled.stdout.splitlines() if line.startswith("run ") and "launched" in line)
    assert world.cli("cancel", other).returncode == 0
    for args, said in (
        (("nosuchrun",), "nosuchrun"),
        ((world.run_id, "--format", "onnx"), "--format 'onnx': not a format autoslm exports"),
        ((world.run_id, "--format", "gguf", "--quant", "q9"), "--quant 'q9': not a quantization of --format gguf"),
        ((world.run_id, "--quant", "q8_0"), "--quant q8_0: merged weights are saved in the dtype the run trained in"),
        ((f"{world.run_id}@999", "--format", "gguf"), "kept no checkpoint of step 999"),
        ((other,), "has no adapter to export"),
        ((world.run_id, "--on", "runpod"), "an export on runpod needs --max-usd"),
        ((world.run_id, "--on", "lambda", "--max-usd", "1"), "--on 'lambda': not a provider that rents a GPU"),
    ):
        r = world.cli("export", *args, "--to", str(to))
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, (args, r.stderr)
        assert not to.exists(), args


def _engine_export(world, model: Path, fmt: str, dest: Path, free: int = 10**12) -> subprocess.CompletedProcess:
    """The worker's export, as the SDK starts it, on a local model folder."""
    adapter = world.tmp / "adapter-engine"
    if not adapter.exists():
        assert world.cli("download", world.run_id, "--to", str(adapter)).returncode == 0
    req = {"run_id": world.run_id, "model": str(model), "adapter": str(adapter), "format": fmt, "quant": "f16"}
    req.update(dtype="float32", dest=str(dest), free_bytes=free, thinking=False, sampling={})
    (world.tmp / "req.json").write_text(json.dumps(req))
    cmd = [sys.executable, "-m", "autoslm.engine.export", str(world.tmp / "req.json"), str(world.tmp / "res.json")]
    return subprocess.run(cmd, capture_output=True, text=True, env=world.env)


def _tiny_copy(world, name: str) -> Path:
    import shutil

    model = world.tmp / name
    if not model.exists():
        shutil.copytree(world.home / "models" / "tiny-v4", model)
    return model


def test_the_worker_refuses_an_architecture_a_tokenizer_or_a_disk_it_cannot_convert_to(world):
    odd = _tiny_copy(world, "odd-arch")
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    r = _engine_export(world, odd, "gguf", world.tmp / "out" / "odd")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "does not know the architecture NoSuchForCausalLM" in r.stderr and "Qwen3ForCausalLM" in r.stderr
    assert not (world.tmp / "out" / "odd").exists()

    split = _tiny_copy(world, "odd-tokenizer")  # the same vocabulary, split on whitespace first: no hash the converter knows
    tj = json.loads((split / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, tj["pre_tokenizer"]]}
    (split / "tokenizer.json").write_text(json.dumps(tj))
    r = _engine_export(world, split, "gguf", world.tmp / "out" / "split")
    assert r.returncode == 2 and "does not know this model's tokenizer" in r.stderr, r.stderr
    assert not (world.tmp / "out" / "split").exists()

    r = _engine_export(world, _tiny_copy(world, "small-disk"), "merged", world.tmp / "out" / "small", free=1000)
    assert r.returncode == 2 and "needs about" in r.stderr and "its disk has 0.0 MB" in r.stderr, r.stderr
    assert not (world.tmp / "out" / "small").exists()


def test_a_failed_conversion_leaves_no_file_where_the_user_looks(world):
    """The converter copy in this home is made to fail after writing part of its file: the destination
    (which held a file of the user's) keeps only that file, and no staging folder."""
    import shutil

    from autoslm.recipes.export import CONVERTER_VERSION

    home_copy = world.tmp / "broken-home"
    (home_copy / "llama.cpp").mkdir(parents=True)
    (home_copy / "models").symlink_to(world.home / "models", target_is_directory=True)
    conv = home_copy / "llama.cpp" / f"convert-{CONVERTER_VERSION}"
    shutil.copytree((world.home / "llama.cpp" / conv.name).resolve(), conv)
    (conv / "convert_hf_to_gguf.py").write_text(
        "import sys\nout = sys.argv[sys.argv.index('--outfile') + 1]\nopen(out, 'wb').write(b'GGUF partial')\n"
        "raise SystemExit('converter stopped halfway')\n"
    )
    dest = world.tmp / "out" / "broken"
    dest.mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    env = {**world.env, "AUTOSLM_HOME": str(home_copy)}
    adapter = world.tmp / "adapter-engine"
    if not adapter.exists():
        assert world.cli("download", world.run_id, "--to", str(adapter)).returncode == 0
    req = {"run_id": world.run_id, "model": "autoslm/tiny", "adapter": str(adapter), "format": "gguf", "quant": "f16"}
    req.update(dtype="float32", dest=str(dest), free_bytes=10**12, thinking=False, sampling={})
    (world.tmp / "req-broken.json").write_text(json.dumps(req))
    cmd = [sys.executable, "-m", "autoslm.engine.export", str(world.tmp / "req-broken.json"), str(world.tmp / "res-broken.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "converter stopped halfway" in r.stderr, r.stderr
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]
