"""A chat template given by the user (mlx_lm.server's --chat-template): in place of the
model's, or for a model that has none (whose messages otherwise go in as 'role: text' lines,
said on load); a file, a tokenizer_config.json or the text; bad ones refused before serving."""

from __future__ import annotations

import json
import shutil

import pytest
from tiny_pair import CHAT_TEMPLATE, answer

import dflash2_mlx as d2
from dflash2_cli.app import run
from dflash2_mlx.chat_template import read_chat_template
from dflash2_mlx.errors import ParameterError
from dflash2_mlx.text import chat_prompt_ids

HELLO = [{"role": "user", "content": "hello model"}]


@pytest.fixture(scope="module")
def bare_target(tiny_pair, tmp_path_factory):
    """The tiny target with its chat template removed."""
    folder = tmp_path_factory.mktemp("bare") / "target"
    shutil.copytree(tiny_pair[0], folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_read_chat_template_from_a_file_a_config_or_the_text(tmp_path):
    jinja = tmp_path / "t.jinja"
    jinja.write_text(CHAT_TEMPLATE)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    assert read_chat_template(str(jinja)) == CHAT_TEMPLATE
    assert read_chat_template(str(config)) == CHAT_TEMPLATE
    assert read_chat_template(CHAT_TEMPLATE) == CHAT_TEMPLATE
    # a real template's text: lines longer than a file name may be, read twice (CLI, library)
    long_text = "{# " + "x" * 400 + " #}" + CHAT_TEMPLATE
    assert read_chat_template(read_chat_template(long_text)) == long_text
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "blank.jinja").write_text("\n")
    for value, message in [
        ("nosuch.jinja", "no such file, and not a Jinja template"),
        (str(tmp_path / "empty.json"), "no 'chat_template' string in it"),
        (str(tmp_path / "blank.jinja"), "is empty"),
        (str(tmp_path), "is a folder; give a Jinja file or a tokenizer_config.json"),
    ]:
        with pytest.raises(ParameterError, match=message):
            read_chat_template(value)


def test_a_model_without_a_template_takes_the_one_given(tiny_pair, bare_target):
    bare = d2.load_pair(bare_target, tiny_pair[1])
    given = d2.load_pair(bare_target, tiny_pair[1], chat_template=CHAT_TEMPLATE)
    own = d2.load_pair(*tiny_pair)
    assert chat_prompt_ids(given.tokenizer, HELLO) == chat_prompt_ids(own.tokenizer, HELLO)
    assert chat_prompt_ids(bare.tokenizer, HELLO) != chat_prompt_ids(own.tokenizer, HELLO)
    with pytest.raises(ParameterError, match="does not render a user turn"):
        d2.load_pair(bare_target, tiny_pair[1], chat_template="{% for m in messages %}")
    with pytest.raises(ParameterError, match="chat_template must be a non-empty string"):
        d2.load_pair(bare_target, tiny_pair[1], chat_template=" ")


def test_a_given_template_replaces_the_models_own_and_may_be_a_file(tiny_pair, tmp_path):
    other = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }};{% endfor %}<<assistant>>"
    pair = d2.load_pair(*tiny_pair, chat_template=other)
    text = pair.tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    assert text == "<<user>> hello model;<<assistant>>"
    path = tmp_path / "other.jinja"  # the library reads a file as the CLI does
    path.write_text(other)
    pair = d2.load_pair(*tiny_pair, chat_template=str(path))
    assert pair.tokenizer.apply_chat_template(HELLO, tokenize=False) == text


def test_chat_says_when_the_model_has_no_template_and_takes_one(tiny_pair, bare_target, capsys):
    flags = ["--drafter", str(tiny_pair[1]), "-p", "hello model", "--max-tokens", "8"]
    assert run(["chat", "--target", str(bare_target), *flags]) == 0
    assert "note: the model has no chat template" in capsys.readouterr().err
    template = bare_target.parent / "chat.jinja"
    template.write_text("{# " + "x" * 400 + " #}" + CHAT_TEMPLATE)  # real templates are long
    given = ["--chat-template", str(template)]
    assert run(["chat", "--target", str(bare_target), *flags, *given]) == 0
    cap = capsys.readouterr()
    assert cap.out == answer(*tiny_pair, HELLO, 8) + "\n"  # as the model's own template
    assert "chat template: from --chat-template" in cap.err and "no chat template" not in cap.err


def test_serve_refuses_a_bad_template_before_it_binds(capsys):
    assert run(["serve", "--chat-template", "nosuch", "--port", "1"]) == 2
    assert "chat template 'nosuch': no such file" in capsys.readouterr().err


def test_a_folder_whose_own_template_does_not_parse_is_refused_at_load(tiny_pair, tmp_path):
    """A syntax error in the model's chat_template.jinja let `serve` start and then answer
    every chat request with a 400 blaming its messages: the load now names the file and the
    line (a template given in its place still serves)."""
    from dflash2_mlx.errors import CompatibilityError

    folder = tmp_path / "target"
    shutil.copytree(tiny_pair[0], folder)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}\n{{ m.content }\n")
    with pytest.raises(CompatibilityError, match=r"chat_template.jinja: .*does not parse \(line"):
        d2.load_pair(folder, tiny_pair[1])
    assert run(["chat", "--target", str(folder), "--drafter", str(tiny_pair[1]), "-p", "hi"]) == 2
    pair = d2.load_pair(folder, tiny_pair[1], chat_template=CHAT_TEMPLATE)
    assert chat_prompt_ids(pair.tokenizer, HELLO) == chat_prompt_ids(
        d2.load_pair(*tiny_pair).tokenizer, HELLO
    )
    # one that compiles but fails on a lone user turn (it wants tools) is not refused
    (folder / "chat_template.jinja").write_text(
        "{% if tools|length > 0 %}T{% endif %}" + CHAT_TEMPLATE
    )
    d2.load_pair(folder, tiny_pair[1])
    # a named template that does not compile is refused, whichever it is
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": CHAT_TEMPLATE},
        {"name": "tool_use", "template": "{{ tools }"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CompatibilityError, match=r"target: its chat template 'tool_use' does"):
        d2.load_pair(folder, tiny_pair[1])
