"""The built-in offline model ``autoslm/tiny``: a tiny Qwen3-shaped model and its tokenizer, built here.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on a fixed corpus; the chat template
is the Qwen3 one that TRL ships (so thinking, tools and TRL's template detection work as for a real
Qwen3). Weights are initialised from a fixed seed, so every build is identical. The result is cached
under ``$AUTOSLM_HOME/models/`` and written atomically, so concurrent workers can build it at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TINY_VERSION = "v4"
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Single tokens, but not special (as in Qwen3's tokenizer): decoding with skip_special_tokens keeps
# them, so thinking can be stripped and tool calls parsed from decoded completions.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def _corpus() -> list[str]:
    """Deterministic text covering digits, arithmetic, chat scaffolding and common English."""
    words = (
        "the a an is are was what how many which answer question number numbers sum plus minus times "
        "add subtract multiply result equals higher lower correct guess game turn you your my please "
        "compute calculate tool call function arguments expression name user assistant system think "
        "reasoning step first then so therefore final of to in and or with for on at by from it this "
        "that be not yes no help solve problem value total give only reply between"
    ).split()
    lines = [" ".join(words)] + ["user\nassistant\nsystem\n"] * 50
    for a in range(0, 100):
        for b in range(0, 100, 7):
            lines.append(f"What is {a} + {b}? {a + b}. {a} - {b} = {a - b}. {a} * {b} = {a * b}.")
    lines.append('{"name": "calculator", "arguments": {"expression": "12 * 7"}}')
    lines += [_tool_preamble()] * 40  # the built-in tool task's system prompt: a few tokens, not 500
    lines.append("You are a helpful assistant. Answer with the number only.")
    return lines


def _tool_preamble() -> str:
    import json

    from transformers.utils import get_json_schema

    from autoslm.envs.tools_task import calculator

    schema = json.dumps({"type": "function", "function": get_json_schema(calculator)["function"]})
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{schema}\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = qwen3_chat_template
    return fast


def build_model(tokenizer):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # 32, not 16: vLLM's CPU attention supports head sizes 32 and up, so the quickstarts can
        # generate through colocated vLLM on a CPU too.
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.15,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_weights(model, folder: Path) -> None:
    """What ``model.save_pretrained`` writes for this model (its config, generation config and one
    safetensors file without the tied output weights), written here because transformers writes nothing
    on a process other than global rank 0: on several pods each pod's first rank builds its own copy."""
    from safetensors.torch import save_file

    model.config.architectures = [type(model).__name__]
    model.config.dtype = model.dtype
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})


def ensure_tiny(cache_root: Path) -> Path:
    """The built model's directory under ``cache_root``, building it first if missing."""
    target = Path(cache_root) / f"tiny-{TINY_VERSION}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer)
        save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another worker finished first: its copy is identical, keep it.
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m autoslm.engine.train.tiny CACHE_ROOT``: build (if missing) and print the model's directory.
    How the laptop side (``autoslm chat``) gets the model without importing the engine."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m autoslm.engine.train.tiny CACHE_ROOT", file=sys.stderr)
        return 2
    print(ensure_tiny(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
