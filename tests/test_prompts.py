"""The bundled prompt sets and the JSONL loader."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from dflash2_mlx.prompts import Prompt, PromptFileError, load_prompts, prompt_path

CATEGORIES = {"chat", "instructions", "code", "math", "stories", "summaries", "multi-turn"}


def test_bundled_sets_sizes_and_categories():
    train, held = load_prompts("train"), load_prompts("heldout")
    assert len(train) + len(held) >= 600
    assert 55 <= len(held) <= 70
    assert {p.category for p in train} == CATEGORIES == {p.category for p in held}
    for cat, n in Counter(p.category for p in held).items():
        assert 8 <= n <= 10, (cat, n)
    for cat, n in Counter(p.category for p in train).items():
        assert n >= 60, (cat, n)


def test_heldout_never_in_train():
    train, held = load_prompts("train"), load_prompts("heldout")
    assert not {p.id for p in train} & {p.id for p in held}
    key = lambda p: json.dumps(p.messages, sort_keys=True)  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in held}
    last_user = lambda p: p.messages[-1]["content"].strip().lower()  # noqa: E731
    assert not {last_user(p) for p in train} & {last_user(p) for p in held}
    assert len({key(p) for p in train}) == len(train)


def test_bundled_prompt_shapes():
    for p in load_prompts("train") + load_prompts("heldout"):
        roles = [m["role"] for m in p.messages]
        assert roles[-1] == "user"
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        if p.category == "multi-turn":
            assert len(roles) in (3, 5), p.id  # two or four prior turns
        else:
            assert len(roles) == 1, p.id
        if p.category == "summaries":
            assert len(p.messages[0]["content"]) > 250, p.id  # carries the passage
        assert p.id.startswith(p.category), p.id


def test_split_names_and_paths(tmp_path):
    assert prompt_path("train").name == "train.jsonl" and prompt_path("train").is_file()
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"id": "a", "category": "chat", "messages": [{"role": "user", "content": "Hi"}]})
        + "\n"
    )
    assert load_prompts(f) == [Prompt("a", "chat", [{"role": "user", "content": "Hi"}])]
    assert load_prompts(str(f))[0].id == "a"


def _write(tmp_path, lines):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


GOOD = json.dumps({"id": "ok", "category": "chat", "messages": [{"role": "user", "content": "Hi"}]})


@pytest.mark.parametrize(
    "bad, why",
    [
        ('{"id": "x", "category": "chat", "messages": [', "invalid JSON"),
        ("", "empty line"),
        ("   ", "empty line"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"category": "chat", "messages": [{"role": "user", "content": "Hi"}]}', "'id'"),
        ('{"id": "x", "category": "chat", "messages": []}', "'messages'"),
        (
            '{"id": "x", "category": "chat", "messages": [{"role": "robot", "content": "Hi"}]}',
            "messages[0]",
        ),
        (
            '{"id": "x", "category": "chat", "messages": [{"role": "user", "content": " "}]}',
            "empty content",
        ),
        (
            '{"id": "x", "category": "chat", "messages": [{"role": "user", "content": "a"}, '
            '{"role": "assistant", "content": "b"}]}',
            "last message",
        ),
        (GOOD, "duplicate id"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    f = _write(tmp_path, [GOOD, bad, GOOD.replace('"ok"', '"ok2"')])
    with pytest.raises(PromptFileError) as err:
        load_prompts(f)
    assert f"{f}:2:" in str(err.value) and why in str(err.value)


def test_blank_lines_after_the_last_prompt_are_not_prompts(tmp_path):
    f = tmp_path / "ok.jsonl"
    f.write_text(GOOD + "\n\n  \n")
    assert [p.id for p in load_prompts(f)] == ["ok"]


def test_a_byte_order_mark_is_no_part_of_the_first_prompt(tmp_path):
    """Windows editors save one; it was "Unexpected UTF-8 BOM" on line 1."""
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + (GOOD + "\r\n").encode())
    assert [p.id for p in load_prompts(f)] == ["ok"]


def test_skip_bad_warns_and_keeps_the_rest(tmp_path):
    f = _write(tmp_path, [GOOD, "{oops", GOOD.replace('"ok"', '"ok2"')])
    with pytest.warns(UserWarning, match=r"bad\.jsonl:2:"):
        got = load_prompts(f, skip_bad=True)
    assert [p.id for p in got] == ["ok", "ok2"]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(PromptFileError, match="cannot read") as err:
        load_prompts(tmp_path / "missing.jsonl")
    assert "bundled split" not in str(err.value)  # a path: no split list
    with pytest.raises(PromptFileError, match="not a bundled split either: train, ") as err:
        load_prompts("trian")  # a typo of a split name
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(tmp_path / "empty.jsonl")
    good = '{"id": "a", "category": "c", "messages": [{"role": "user", "content": "hi"}]}\n'
    (tmp_path / "junk.jsonl").write_bytes(good.encode() + b"\xff\xfe\x00junk\n")
    with pytest.raises(PromptFileError, match=r"junk.jsonl:2: not UTF-8 text \(byte 0xff"):
        load_prompts(tmp_path / "junk.jsonl", skip_bad=True)  # not a line to skip: the file
    with pytest.raises(PromptFileError, match="an empty name before or after a '\\+'"):
        load_prompts("train+")


def test_extra_splits_are_disjoint_from_heldout_and_join_with_train():
    train, held = load_prompts("train"), load_prompts("heldout")
    wide, extra, more = (
        load_prompts("train-wide"),
        load_prompts("train-extra"),
        load_prompts("train-more"),
    )
    deep = load_prompts("train-deep")
    assert len(wide) >= 700 and {p.category for p in wide} == CATEGORIES
    assert len(deep) >= 1000 and {p.category for p in deep} == CATEGORIES
    assert len(extra) >= 800 and {p.category for p in extra} == CATEGORIES
    assert len(more) >= 400 and {p.category for p in more} == CATEGORIES
    last_user = lambda p: p.messages[-1]["content"].strip().lower()  # noqa: E731
    assert not {last_user(p) for p in wide + deep + extra + more} & {last_user(p) for p in held}
    assert not {last_user(p) for p in wide} & {last_user(p) for p in train + extra + more}
    assert not {last_user(p) for p in deep} & {last_user(p) for p in train + wide + extra + more}
    assert len({last_user(p) for p in deep}) == len(deep)
    conversation = lambda p: json.dumps(p.messages)  # noqa: E731
    assert not {conversation(p) for p in extra} & {conversation(p) for p in more}
    assert len(load_prompts("train+train-wide")) == len(train) + len(wide)
    both = load_prompts("train+train-extra")
    assert len(both) == len(load_prompts("train")) + len(extra)
    assert len(load_prompts("train+train-extra+train-more")) == len(both) + len(more)
    with pytest.raises(PromptFileError, match="appears in more than one set"):
        load_prompts("train+train")


def test_a_prompt_may_carry_its_token_ids(tmp_path):
    ok = {"id": "a", "category": "x", "messages": [{"role": "user", "content": "hi"}]}
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({**ok, "prompt_ids": [1, 2, 3]}) + "\n" + json.dumps({**ok, "id": "b"}) + "\n"
    )
    with_ids, plain = load_prompts(path)
    assert with_ids.prompt_ids == (1, 2, 3) and plain.prompt_ids is None
    for bad in ([], [1, -2], [1, True], "1 2", [1.5]):
        path.write_text(json.dumps({**ok, "prompt_ids": bad}) + "\n")
        with pytest.raises(PromptFileError, match="'prompt_ids' must be a non-empty list"):
            load_prompts(path)
