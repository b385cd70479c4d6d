"""corpus_prompts: regeneration prompts from a corpus folder (filters, held-out exclusion,
seeded order, clear errors)."""

import json

import pytest

from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.train.corpus_prompts import CorpusPromptsError, PromptRecipe, build_prompts, main

HELD = "What is the tallest mountain in the world?"


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _chat(i, text):
    msgs = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    return {"id": f"chitchat/{i}", "source": "chitchat", "messages": msgs}


@pytest.fixture
def corpus(tmp_path):
    chat = [
        _chat(0, "Hello"),  # too short
        _chat(1, "What is your favourite book and why do you like it?"),
        _chat(2, "what is your FAVOURITE book, and why do you like it"),  # same once normalised
        _chat(3, "Quel est ton livre préféré et pourquoi l'aimes-tu donc?"),  # not English
        _chat(4, "what is the tallest mountain in the world"),  # a held-out prompt
        _chat(5, "If you could travel anywhere tomorrow, where would you go?"),
        _chat(6, "I think the best pizza topping is pineapple, honestly."),
    ]
    _write(tmp_path / "chitchat.jsonl", chat)
    wiki = [
        {
            "id": f"wiki/{t}",
            "source": "wiki",
            "messages": [
                {"role": "user", "content": f"Tell me about {t}"},
                {"role": "assistant", "content": "..."},
            ],
        }
        for t in ("Paris", "Mount Everest", "Jazz", "Photosynthesis")
    ]
    _write(tmp_path / "wiki.jsonl", wiki)
    held = tmp_path / "held.jsonl"
    _write(held, [{"id": "h", "category": "chat", "messages": [{"role": "user", "content": HELD}]}])
    return tmp_path, held


def test_filters_dedup_and_held_out_exclusion(corpus):
    folder, held = corpus
    out = build_prompts(folder, PromptRecipe(wiki=3, exclude=str(held)))
    chat = sorted(p["id"] for p in out if p["category"] == "corpus-chat")
    assert chat == ["chitchat/1", "chitchat/5", "chitchat/6"]
    wiki = [p for p in out if p["category"] == "corpus-wiki"]
    assert len(wiki) == 3 and all(
        p["messages"][0]["content"].startswith("Tell me about ") for p in wiki
    )
    assert all(len(p["messages"]) == 1 and p["messages"][0]["role"] == "user" for p in out)


def test_seeded_and_loadable(corpus, tmp_path):
    folder, held = corpus
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    main([str(folder), str(a), "--wiki", "2", "--exclude", str(held)])
    main([str(folder), str(b), "--wiki", "2", "--exclude", str(held)])
    assert a.read_bytes() == b.read_bytes()
    other = build_prompts(folder, PromptRecipe(wiki=4, seed=1, exclude=str(held)))
    same_seed = build_prompts(folder, PromptRecipe(wiki=4, seed=0, exclude=str(held)))
    assert [p["id"] for p in other] != [p["id"] for p in same_seed]
    assert len(load_prompts(a)) == 5  # the regenerator's own reader takes the file


def test_missing_source_and_bad_line_are_named(corpus):
    folder, held = corpus
    (folder / "wiki.jsonl").unlink()
    with pytest.raises(CorpusPromptsError, match="wiki.jsonl: missing"):
        build_prompts(folder, PromptRecipe(exclude=str(held)))
    # a chitchat-only corpus (`dflash2 corpus --sources chitchat`) serves --wiki 0
    only_chat = build_prompts(folder, PromptRecipe(wiki=0, exclude=str(held)))
    assert sorted(p["id"] for p in only_chat) == ["chitchat/1", "chitchat/5", "chitchat/6"]
    (folder / "wiki.jsonl").write_text('{"id": "w", "messages": []}\n')
    with pytest.raises(CorpusPromptsError, match=r"wiki.jsonl:1: not a chat record"):
        build_prompts(folder, PromptRecipe(exclude=str(held)))


@pytest.mark.parametrize(
    "flags, why",
    [
        (["--chat", "-1"], "argument --chat: must be >= 0, got -1"),
        (["--wiki", "-2"], "argument --wiki: must be >= 0, got -2"),
        (["--wiki", "x"], "argument --wiki: not an integer: 'x'"),
        (["--chat", "0", "--wiki", "0"], "--chat 0 and --wiki 0 leave no prompts"),
    ],
)
def test_cli_counts_out_of_range_name_the_flag(flags, why, corpus, tmp_path, capsys):
    folder, _ = corpus
    out = tmp_path / "p.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main([str(folder), str(out), *flags])
    assert exit_.value.code == 2 and why in capsys.readouterr().err
    assert not out.exists()


def test_recipe_counts_are_checked():
    with pytest.raises(CorpusPromptsError, match="chat=-1 wiki=1000"):
        PromptRecipe(chat=-1)
    with pytest.raises(CorpusPromptsError, match="no prompts"):
        PromptRecipe(chat=0, wiki=0)
    with pytest.raises(CorpusPromptsError, match="min_words <= max_words, got 9 and 3"):
        PromptRecipe(min_words=9, max_words=3)


def test_chat_zero_keeps_only_wiki_and_help_shows_defaults(corpus, capsys):
    folder, held = corpus
    out = build_prompts(folder, PromptRecipe(chat=0, wiki=2, exclude=str(held)))
    assert [p["category"] for p in out] == ["corpus-wiki"] * 2
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prompts to keep (default: 1000)" in text and "(default: heldout)" in text
