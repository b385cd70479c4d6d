"""A tiny target that really calls tools and thinks: a tokenizer folder with a Qwen-style (hermes)
chat template that renders `tools`, `<tool_call>` / `<think>` tokens, and a random llama trained
for a few seconds until greedy decoding reproduces fixed answers:

  - asked "weather in paris?" with the get_weather tool: a `<tool_call>` (mlx-lm's json_tools
    parser, which mlx-lm infers from this template, parses it); "... paris and rome?": two;
  - given the tool's result: the final answer;
  - asked "hi" (thinking on): a `<think>` section, then the answer; (thinking off): the answer.

`trained_pair(folder)` builds it all; tests cache it in a session-scoped fixture.
"""

from __future__ import annotations

import functools
import json
import re
import string
from pathlib import Path

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)
import mlx.core as mx  # noqa: E402

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # plain text, as in Qwen's
MASK = "<mask>"
EOS = "<|im_end|>"
# Words with their leading space, single punctuation marks, single whitespace characters: a
# short sequence per text (fast to train), and the text round-trips exactly (Fuse decoder).
PIECES = r" ?\w+| ?[^\w\s]|\s"

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<|im_start|>user\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for tool_call in message.tool_calls or [] %}"
    "{% if tool_call.function %}{% set tool_call = tool_call.function %}{% endif %}"
    "{% if message.content or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": '
    "{{ tool_call.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER]
ASK = [{"role": "user", "content": "weather in paris?"}]
CALL_ARGS = {"city": "paris"}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>'
ASK_TWO = [{"role": "user", "content": "weather in paris and rome?"}]
TWO_CALLS = CALL_TEXT + "\n" + CALL_TEXT.replace("paris", "rome")
RESULT = '{"sky": "sunny", "temp": 21}'
FINAL = "it is sunny in paris, 21 degrees."
HI = [{"role": "user", "content": "hi"}]
THOUGHT = "the user says hi. i greet back."
ANSWER = "hello! how can i help?"
SHORT_ANSWER = "hello!"


def followup(call_id: str = "call_1", arguments=None) -> list[dict]:
    """The conversation after the tool call: the assistant's call and the tool's result.

    `arguments` as OpenAI sends them (a JSON string) by default; chat templates get a dict."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {
            "name": "get_weather",
            "arguments": json.dumps(CALL_ARGS) if arguments is None else arguments,
        },
    }
    return ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": RESULT},
    ]


def _hf_tokenizer(vocab: list[str]):
    """A word-piece-level fast tokenizer over `vocab` with the template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS[1:] + [MASK]])
    tok.add_tokens([AddedToken(t, special=False) for t in MARKERS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token=EOS, clean_up_tokenization_spaces=False
    )
    hf.chat_template = TEMPLATE
    return hf


def _texts(hf) -> list[str]:
    """Every text the tests render or expect: the vocabulary is made of their pieces."""

    def render(messages, **kw):
        return hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)

    return [
        render(ASK, tools=TOOLS),
        render(ASK_TWO, tools=TOOLS),
        TWO_CALLS,
        render(followup(arguments=CALL_ARGS), tools=TOOLS),
        render(HI, enable_thinking=True),
        render(HI, enable_thinking=False),
        CALL_TEXT,
        FINAL,
        THOUGHT,
        ANSWER,
    ]


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    chars = set(string.ascii_letters + string.digits + string.punctuation + " \n")
    pieces = {
        p for t in _texts(_hf_tokenizer(SPECIALS + MARKERS + [MASK])) for p in re.findall(PIECES, t)
    }
    return tuple(SPECIALS + MARKERS + sorted((pieces | chars) - set(MARKERS)) + [MASK])


def save_tokenizer(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    _hf_tokenizer(list(vocabulary())).save_pretrained(str(folder))
    return folder


def load_tokenizer(folder: Path):
    """mlx-lm's own loader: it infers the tool parser (json_tools) from the template."""
    from mlx_lm.tokenizer_utils import load

    return load(Path(folder))


def examples(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids ending with EOS) the target is trained to reproduce."""
    eos = tokenizer.eos_token_id

    def ids(messages, **kw):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kw))

    def text(s):
        return list(tokenizer.encode(s, add_special_tokens=False)) + [eos]

    return [
        (ids(ASK, tools=TOOLS), text(CALL_TEXT)),
        (ids(ASK_TWO, tools=TOOLS), text(TWO_CALLS)),
        (ids(followup(arguments=CALL_ARGS), tools=TOOLS), text(FINAL)),
        (ids(HI, enable_thinking=True), text(f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")),
        (ids(HI, enable_thinking=False), text(SHORT_ANSWER)),
    ]


def greedy(model, prompt: list[int], n: int, eos: int) -> list[int]:
    from tiny import greedy_reference

    return greedy_reference(model, prompt, n, eos={eos})


def train_target(tokenizer, *, seed: int = 0, max_steps: int = 300, margin_steps: int = 20):
    """A tiny llama trained until greedy decoding reproduces every example's answer, then
    `margin_steps` more (wider logit margins: the same argmax on any BLAS)."""
    import mlx.nn as nn
    import mlx.optimizers as optim

    from tiny import make_target

    model = make_target("llama", seed=seed, vocab=len(vocabulary()), layers=2, hidden=64)
    data = examples(tokenizer)
    width = max(len(p) + len(a) for p, a in data)
    inputs, targets, weights = [], [], []
    for p, a in data:
        seq, pad = p + a, width - len(p) - len(a)
        inputs.append(seq[:-1] + [0] * pad)
        targets.append(seq[1:] + [0] * pad)
        weights.append([0.0] * (len(p) - 1) + [1.0] * len(a) + [0.0] * pad)
    x, y, w = mx.array(inputs), mx.array(targets), mx.array(weights)

    def loss_fn(m):
        return (nn.losses.cross_entropy(m(x), y) * w).sum() / w.sum()

    grad = nn.value_and_grad(model, loss_fn)
    opt = optim.Adam(learning_rate=3e-3)

    def train(steps):
        for _ in range(steps):
            _, g = grad(model)
            opt.update(model, g)
            mx.eval(model.parameters(), opt.state)

    def learned():
        eos = tokenizer.eos_token_id
        return all(greedy(model, p, len(a) + 2, eos) == a for p, a in data)

    for _ in range(0, max_steps, 10):
        train(10)
        if learned():
            train(margin_steps)
            if learned():
                return model
    raise RuntimeError(f"the tiny tool target did not learn its answers in {max_steps} steps")


def trained_pair(folder: Path, block_size: int = 4):
    """A Pair over the trained target, mlx-lm's tokenizer for it, and a random drafter."""
    from dflash2_mlx.api import Pair
    from tiny import make_drafter

    tokenizer = load_tokenizer(save_tokenizer(Path(folder) / "tokenizer"))
    model = train_target(tokenizer)
    vocab = len(vocabulary())
    drafter = make_drafter(
        2,
        block_size=block_size,
        vocab=vocab,
        mask_token_id=vocab - 1,
        layer_ids=(0, 1),
        num_target_layers=2,
    )
    return Pair.from_models(model, tokenizer, drafter)
