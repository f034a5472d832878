"""`autoslm push RUN --to owner/name`: publish a succeeded run's adapter as a Hub model repo, with a model card.

The card carries YAML metadata (base_model, library_name: peft, tags, datasets), the method, data,
hyperparameters and final metrics, a curve image (a PNG drawn without matplotlib), and how to load
the result with peft and with vLLM. ``merge=True`` (`--merged`) uploads merged full weights instead of
the adapter, and ``gguf=True`` (`--gguf`) the GGUF of them with its Ollama Modelfile: both are
`autoslm export` (sdk/export.py, its worker in a process of its own, so this module never imports torch),
and the card's metadata says what they are to the base model (``base_model_relation``: ``merge``,
``quantized``).

It must never put a token in the card, a file or a message; pushing twice to the same repo is safe
(the repo is created with exist_ok, and each push is one commit of the whole folder).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from autoslm.controller.state import RunState
from autoslm.errors import StoreAuthError, StoreError, UsageError
from autoslm.recipes.export import checked_request, gguf_name
from autoslm.recipes.generation import VLLM_LORA_RANKS, vllm_lora_rank
from autoslm.recipes.harness import metric_lines, model_index
from autoslm.secrets import redact
from autoslm.views.report.charts import png_chart
from autoslm.views.runview import RunData, artifacts_of, collect, final_metrics, main_curve, train_rows

HYPER_KEYS = (
    "method",
    "max_steps",
    "epochs",
    "batch_size",
    "learning_rate",
    "lr_scheduler",
    "warmup_ratio",
    "max_length",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "group_size",
    "prompts_per_step",
    "beta",
    "loss_type",
    "max_completion_tokens",
    "temperature",
)


def _hub_datasets(spec: dict) -> list[str]:
    env_id = (spec.get("environment") or {}).get("id") or ""
    if env_id.startswith("hf:"):
        return [env_id[3:]]
    if "/" in env_id and not env_id.startswith(("autoslm/", "jsonl:")):
        return [env_id]  # a verifiers environment on the Hub
    return []


def _yaml_list(key: str, items: list[str]) -> str:
    return f"{key}:\n" + "".join(f"- {json.dumps(i)}\n" for i in items) if items else ""


def _harness_block(data: RunData) -> dict | None:
    """The lm-eval scores of the lowest seed that has them."""
    for _, m in sorted(data.metrics.items()):
        if m.lm_eval:
            return m.lm_eval
    return None


def model_card(data: RunData, repo_id: str, *, merged: bool, image: str | None, gguf: str | None = None) -> str:
    """The README: ``merged`` for merged weights, ``gguf`` (its type, e.g. "q8_0") for their GGUF, else the adapter."""
    spec = data.spec or {}
    train = spec.get("train") or {}
    base = spec.get("model") or "unknown"
    method = (train.get("method") or data.status.phase or "sft").lower()
    env_id = (spec.get("environment") or {}).get("id")
    datasets = _hub_datasets(spec)
    merged = merged or gguf is not None
    tags = ["autoslm", "trl", method, "lora"] + ([] if merged else ["peft"]) + (["gguf", gguf] if gguf else [])
    relation = "quantized" if gguf else ("merge" if merged else "adapter")
    meta = (
        f"---\nbase_model: {json.dumps(base)}\nbase_model_relation: {relation}\n"
        + ("library_name: gguf\n" if gguf else "library_name: transformers\n" if merged else "library_name: peft\n")
        + _yaml_list("tags", tags)
        + _yaml_list("datasets", datasets)
        + "pipeline_tag: text-generation\n"
        + model_index(_harness_block(data), repo_id.split("/")[-1])
        + "---\n"
    )
    hyper = [(k, train[k]) for k in HYPER_KEYS if train.get(k) is not None]
    metrics = final_metrics(data)
    lines = [
        meta,
        f"# {repo_id.split('/')[-1]}",
        "",
        f"A {'LoRA fine-tune merged into' if merged else 'LoRA adapter for'} [`{base}`](https://huggingface.co/{base}), "
        + (f"as GGUF {gguf} (llama.cpp's converter), " if gguf else "")
        + f"trained with {method.upper()} ({'GRPO, reinforcement learning from a reward' if method == 'grpo' else 'supervised fine-tuning'}) "
        f"by autoslm (run `{data.run_id}`).",
        "",
        "## Data",
        "",
        f"- task / environment: `{env_id}`"
        + (
            f" (params: `{json.dumps((spec.get('environment') or {}).get('params') or {})}`)"
            if (spec.get("environment") or {}).get("params")
            else ""
        ),
        f"- thinking: {spec.get('thinking', False)}",
        "",
        "## Hyperparameters",
        "",
        "| name | value |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in hyper],
        f"| seed | {spec.get('seed')} |",
        "",
        "## Final metrics",
        "",
        "| metric | value |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in metrics.items()],
        "",
        *[f"- {line}" for line in metric_lines(_harness_block(data))],
        "",
    ]
    if image:
        lines += ["## Training curve", "", f"![training curve]({image})", ""]
    if gguf:
        lines += _gguf_usage_lines(repo_id, gguf)
    else:
        lines += _usage_lines(repo_id, base, merged=merged, lora_rank=train.get("lora_rank") or 16)
    return redact("\n".join(lines))


def _gguf_usage_lines(repo_id: str, quant: str) -> list[str]:
    """The card's "How to use" for a GGUF: Ollama (the repo's Modelfile) and llama.cpp."""
    name = repo_id.split("/")[-1].lower()
    return [
        "## How to use",
        "",
        "With Ollama (the Modelfile carries the chat template and stop tokens the model was trained with):",
        "",
        "```sh",
        f"hf download {repo_id} --local-dir {name}",
        f"cd {name} && ollama create {name} -f Modelfile && ollama run {name}",
        "```",
        "",
        "With llama.cpp:",
        "",
        "```sh",
        f"llama-server --hf-repo {repo_id} --hf-file {gguf_name(quant)}",
        "```",
        "",
    ]


def _usage_lines(repo_id: str, base: str, *, merged: bool, lora_rank: int) -> list[str]:
    """The card's "How to use": the model loaded with transformers (and peft for an adapter), and with vLLM."""
    lines = ["## How to use", "", "With transformers" + ("" if merged else " and peft") + ":", "", "```python"]
    if merged:
        lines += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
        ]
    else:
        lines += [
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            f'model = PeftModel.from_pretrained(base, "{repo_id}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
        ]
    lines += ["```", ""]
    try:
        max_rank = None if merged else vllm_lora_rank(lora_rank)
    except ValueError:  # vLLM cannot load this adapter as a LoRA: its merged model it can
        top = VLLM_LORA_RANKS[-1]
        return lines + [
            f"vLLM loads LoRA ranks up to {top}, and this adapter's is {lora_rank}: push it merged (`autoslm push --merge`) to serve it with vLLM.",
            "",
        ]
    lines += ["With vLLM:", "", "```python", "from vllm import LLM, SamplingParams", ""]
    if merged:
        lines += [
            f'llm = LLM(model="{repo_id}")',
            'print(llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=64)))',
        ]
    else:
        lines += [
            "from huggingface_hub import snapshot_download",
            "from vllm.lora.request import LoRARequest",
            "",
            f'llm = LLM(model="{base}", enable_lora=True, max_lora_rank={max_rank})',
            f'adapter = snapshot_download("{repo_id}")',
            'print(llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=64),',
            '               lora_request=LoRARequest("adapter", 1, adapter)))',
        ]
    return lines + ["```", ""]


def push(
    client,
    ref: str,
    to: str,
    *,
    private: bool = False,
    merge: bool = False,
    gguf: bool = False,
    quant: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    log=None,
) -> str:
    """Upload ``ref``'s adapter (merged weights with ``merge``, their GGUF with ``gguf``) and a model card to
    the Hub model repo ``to``; returns its URL."""
    if to.count("/") != 1 or not all(to.split("/")):
        raise UsageError(f"--to {to!r}: want a Hub model repo as owner/name")
    if merge and gguf:
        raise UsageError("--merged and --gguf: push one of them to a repo (a second push to another repo gives the other)")
    fmt = "gguf" if gguf else ("merged" if merge else None)
    if fmt:
        quant = checked_request(fmt, quant) or None
    elif quant is not None:
        raise UsageError("--quant goes with --gguf")
    data = collect(client, ref)
    if data.status.state is not RunState.SUCCEEDED:
        raise UsageError(f"run {data.run_id} is {data.status.state}: only a succeeded run has an adapter to push")
    _, arts = artifacts_of(client, data.ref)
    with tempfile.TemporaryDirectory(prefix="autoslm-push-") as tmp:
        adapter, folder = Path(tmp) / "adapter", Path(tmp) / "repo"
        if fmt:
            from autoslm.sdk.export import export

            export(client, data.run_id, format=fmt, quant=quant, to=folder, log=log)
        else:
            arts[0].fetch_adapter(adapter)
            if not (adapter / "adapter_config.json").exists():
                raise UsageError(f"run {data.run_id}: no adapter in its store")
            folder.mkdir()
            for p in adapter.iterdir():
                if p.is_file():
                    (folder / p.name).write_bytes(p.read_bytes())
        image = None
        rows = train_rows(data.events)
        key, pts = main_curve(rows)
        if pts:
            (folder / "training_curve.png").write_bytes(png_chart({key: pts}))
            image = "training_curve.png"
        card = model_card(data, to, merged=merge, image=image, gguf=quant if gguf else None)
        (folder / "README.md").write_text(card, encoding="utf-8")
        return _upload(folder, to, private=private, endpoint=endpoint, token=token, run_id=data.run_id)


def _upload(folder: Path, repo_id: str, *, private: bool, endpoint: str | None, token: str | None, run_id: str) -> str:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    api = HfApi(endpoint=endpoint, token=token, library_name="autoslm")
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=f"autoslm: run {run_id}")
    except HfHubHTTPError as e:
        status = e.response.status_code if getattr(e, "response", None) is not None else None
        if status in (401, 403):
            raise StoreAuthError(
                redact(f"Hugging Face Hub refused the push to {repo_id} (HTTP {status})"),
                hint="set HF_TOKEN to a token with write access",
            ) from None
        server = " ".join(str(getattr(e, "server_message", "") or "").split())[:300]
        raise StoreError(
            redact(f"Hugging Face Hub: pushing to {repo_id} failed (HTTP {status}" + (f": {server}" if server else "") + ")")
        ) from None
    return f"{endpoint}/{repo_id}"
