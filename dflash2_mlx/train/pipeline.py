"""`dflash2 train`: prompts → target regenerations → cached features → drafter → model card.

Every stage is resumable from `work/`: regenerations are appended per batch, features per
shard, training checkpoints every few hundred steps.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import mlx.core as mx

from ..drafter.model import Drafter
from ..drafter.vocab import DRAFT_VOCAB_FILE, count_tokens, draft_vocab_text
from ..errors import DFlash2Error
from ..prompts import load_prompts
from ..downloads import fetch
from ..target.adapter import TargetAdapter
from ..target.folder import load_target_folder
from .datastore import datastore_file
from .drafter_init import adopt_start, check_start_fits, start_tensors
from .features import build_feature_cache, load_feature_cache, read_regenerations
from .fixed_text import corpus_sequences, corpus_sources
from .live import live_sequences
from .model_card import model_card
from .pipeline_config import PipelineConfig, prompt_parts
from .run_record import pipeline_record, resume_run
from .preflight import (
    check_anchorable,
    check_earlier_run,
    check_heldout_apart,
    check_config,
    check_inputs,
    check_out,
    check_settings,
    check_work_identity,
    claim_run,
)
from .stream import FixedTextStream, check_disk_bound
from .trainer import (
    TrainConfig,
    Trainer,
    check_distillable,
    drafter_config_for,
    head_weight,
    init_drafter,
)


def _guess_mask_id(tokenizer, vocab: int) -> int:
    """A token the target never emits: a reserved/unused special token, else the last id."""
    for name in ("<|MASK|>", "<empty_output>", "<mask>", "<|mask|>"):
        tid = (
            tokenizer.convert_tokens_to_ids(name)
            if hasattr(tokenizer, "convert_tokens_to_ids")
            else None
        )
        if (
            isinstance(tid, int)
            and 0 <= tid < vocab
            and tid != getattr(tokenizer, "unk_token_id", None)
        ):
            return tid
    return vocab - 1


def _run_folder(pc: PipelineConfig) -> Path:
    """Where the training of `pc.out` checkpoints (named after its last part)."""
    return pc.work / f"run-{pc.out.name}"


@dataclass
class PreparedData:
    model: object
    adapter: TargetAdapter
    target_config: dict
    train: list
    heldout: list
    stages: dict
    fixed: FixedTextStream | None = None


def _regenerate_split(
    pc: PipelineConfig,
    target: tuple,
    regen: Path,
    parts: list[tuple[str, tuple[float, ...]]],
    log: Callable[[str], None],
) -> tuple[set[tuple[str, float]], dict]:
    """Regenerates a split's `parts` into `regen`, one batched regeneration per set of
    temperatures; returns the (id, temperature) pairs it asks for and its stage record."""
    from .regenerate import regenerate

    t0 = time.perf_counter()
    wanted, n_prompts, new_tokens = set(), 0, 0
    for temps in dict.fromkeys(t for _, t in parts):
        prompts = load_prompts(
            "+".join(p for p, t in parts if t == temps), skip_bad=pc.skip_bad_lines
        )
        st = regenerate(
            target,
            prompts,
            regen,
            max_new_tokens=pc.max_new_tokens,
            temperatures=temps,
            batch_size=pc.regen_batch,
            log=log,
        )
        wanted |= {(p.id, t) for p in prompts for t in temps}
        n_prompts, new_tokens = n_prompts + len(prompts), new_tokens + st.new_tokens
    stage = {
        "prompts": n_prompts,
        "new_tokens": new_tokens,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return wanted, stage


def _fixed_text_stream(
    pc: PipelineConfig, seqs: list, adapter: TargetAdapter, tag: str, log: Callable[[str], None]
) -> tuple[FixedTextStream, dict]:
    """The corpus's fixed text (`seqs`), streamed through the target, and its stage record."""
    fixed = FixedTextStream(
        adapter,
        seqs,
        pc.work / f"stream_{tag}",
        max_disk_bytes=pc.stream_disk_bytes,
        passes=pc.stream_passes,
        log=log,
    )
    stage = {
        "sequences": len(seqs),
        "tokens": sum(len(s.tokens) for s in seqs),
        "shards": len(fixed.shards),
        "sources": corpus_sources(pc.corpus),
    }
    log(
        f"fixed text: {len(seqs):,} sequences, {stage['tokens']:,} tokens "
        f"in {len(fixed.shards)} shards"
    )
    return fixed, stage


def _check_with_target(pc: PipelineConfig, tc: TrainConfig, adapter, tokenizer) -> list | None:
    """What needs the loaded target, checked before hours of regeneration, not after; returns
    the corpus's sequences (None without --corpus), rendered now so that a record the chat
    template refuses stops nothing that ran."""
    if tc.distill_weight > 0:
        check_distillable(adapter)
    if pc.corpus and tc.fixed_ratio > 0 and tc.fixed_distill_weight > 0:
        check_distillable(adapter, "--corpus-distill 0")
    if not pc.corpus:
        return None
    corpus = corpus_sequences(
        tokenizer, pc.corpus, max_tokens=pc.corpus_tokens, max_len=pc.max_len, seed=tc.seed
    )
    if tc.fixed_ratio > 0:  # a shard holds at least the longest sequence
        check_disk_bound(adapter, pc.stream_disk_bytes, max(len(s.tokens) for s in corpus))
    return corpus


def prepare_data(
    pc: PipelineConfig, tc: TrainConfig, log: Callable[[str], None] = print
) -> PreparedData:
    """Regenerate responses and cache the target's features (both resumable; with
    pc.live_features the training ones are computed as steps draw them); fills in
    tc.mask_token_id when unset."""
    parts = prompt_parts(pc.prompts, pc.temperatures)
    check_out(pc.out, pc.work, write=False)
    check_settings(tc, pc.max_new_tokens, [t for _, temps in parts for t in temps])
    check_heldout_apart("+".join(name for name, _ in parts), pc.heldout, pc.skip_bad_lines)
    # Folders, or repo ids downloaded, after the checks a download would keep waiting:
    target = fetch(pc.target, "target")
    start = fetch(tc.init_from, "drafter") if tc.init_from else None
    check_inputs(target, pc.corpus, start)
    if start is not None:  # its target layers and mask token: before a resume compares them
        adopt_start(tc, start)
    check_earlier_run(_run_folder(pc), pc.out, tc)
    model, tokenizer = load_target_folder(target)
    target_cfg = json.loads((target / "config.json").read_text())
    probe = TargetAdapter(model, ())
    head_weight(probe)  # a quantized head is refused now, not after the regeneration
    if start is not None:
        check_start_fits(start, probe)
    if tc.mask_token_id is None:
        tc.mask_token_id = _guess_mask_id(tokenizer, probe.vocab_size)
    dcfg = drafter_config_for(probe, target_cfg, tc)
    tc.target_layer_ids = tuple(dcfg.target_layer_ids)  # recorded as trained
    if start is not None:  # a start of another kind or shape: refused now, not after the data
        start_tensors(Drafter(dcfg), start)
    adapter = TargetAdapter(model, dcfg.target_layer_ids)
    corpus = _check_with_target(pc, tc, adapter, tokenizer)
    # The first things written, after every check: a refused run leaves no folder behind.
    check_out(pc.out, pc.work)
    check_work_identity(pc.work, target, pc.max_new_tokens, pc.max_len)
    tag = "-".join(map(str, dcfg.target_layer_ids))

    seqs, stages = _regenerate_and_cache(pc, (model, tokenizer), adapter, parts, tag, log)
    train, held = _training_sets(pc, tc, adapter, seqs, tag)
    fixed = None
    if corpus:
        fixed, stages["corpus"] = _fixed_text_stream(pc, corpus, adapter, tag, log)
    return PreparedData(model, adapter, target_cfg, train, held, stages, fixed)


def _regenerate_and_cache(
    pc: PipelineConfig,
    target: tuple,
    adapter: TargetAdapter,
    parts: list[tuple[str, tuple[float, ...]]],
    tag: str,
    log: Callable[[str], None],
) -> tuple[dict, dict]:
    """Regenerates the train and held-out splits and caches their features (not the training
    ones with pc.live_features); returns each split's regenerations this run asks for, and the
    stage records."""
    stages, seqs = {}, {}
    for name, split in (("train", parts), ("heldout", [(pc.heldout, (0.0,))])):
        regen = pc.work / f"regen_{name}.jsonl"
        wanted, stages[f"regen_{name}"] = _regenerate_split(pc, target, regen, split, log)
        seqs[name] = [
            q for q in read_regenerations(regen, pc.max_len) if (q.id, q.temperature) in wanted
        ]
        if not seqs[name]:
            split_spec = pc.heldout if name == "heldout" else pc.prompts
            raise DFlash2Error(
                f"{split_spec}: no {name} prompt and answer fit in {pc.max_len} tokens "
                "(every one is longer): shorter prompts are needed"
            )
        if name == "train" and pc.live_features:
            continue  # computed when a step draws them (live.py)
        t0 = time.perf_counter()
        build_feature_cache(adapter, seqs[name], pc.work / f"features_{name}_{tag}", log=log)
        stages[f"features_{name}"] = {"seconds": round(time.perf_counter() - t0, 1)}
    return seqs, stages


def _training_sets(
    pc: PipelineConfig, tc: TrainConfig, adapter: TargetAdapter, seqs: dict, tag: str
) -> tuple[list, list]:
    """(train, held-out): the features of this run's regenerations (the training ones live
    with pc.live_features), each checked to hold an anchorable block."""
    if pc.live_features:
        train = live_sequences(adapter, seqs["train"])
    else:
        keys = {(q.id, q.temperature) for q in seqs["train"]}
        cached = load_feature_cache(pc.work / f"features_train_{tag}")
        train = [s for s in cached if (s.id, s.temperature) in keys]
    held = load_feature_cache(pc.work / f"features_heldout_{tag}")
    keys = {(q.id, q.temperature) for q in seqs["heldout"]}  # this run's, not an earlier one
    held = [s for s in held if (s.id, s.temperature) in keys]
    check_anchorable(held, tc.block_size, "held-out")
    if not train:
        raise DFlash2Error(f"{pc.prompts}: no usable training sequences")
    check_anchorable(train, tc.block_size)
    return train, held


def train_drafter(
    pc: PipelineConfig,
    tc: TrainConfig,
    data: PreparedData,
    log: Callable[[str], None] = print,
    on_step: Callable[[dict], None] | None = None,
) -> dict:
    """Train (or resume) into `pc.work/run-<out name>/`, then export `pc.out` with its card."""
    dcfg = drafter_config_for(data.adapter, data.target_config, tc)
    drafter = init_drafter(dcfg, tc)
    run = _run_folder(pc)
    claim_run(run, pc.out)
    trainer = Trainer(data.adapter, drafter, data.train, data.heldout, tc, run, log, data.fixed)
    done = resume_run(pc, tc.steps, data.fixed, trainer, run, log)
    if done is not None:  # a rerun of a finished command
        return {
            "final": done["final"],
            "stages": done["stages"],
            "out": str(pc.out),
            "unchanged": True,
        }
    start, t0 = trainer.step, time.perf_counter()
    final = trainer.run(on_step)
    if data.fixed is not None:  # its features go; the corpus recomputes them when needed
        data.stages.setdefault("corpus", {})["stream_at_end"] = data.fixed.state()
        data.fixed.close()
    stages = {
        **data.stages,
        "train": {
            "steps": trainer.step,
            "resumed_at_step": start,
            "seconds_this_run": round(time.perf_counter() - t0, 1),
            "answers": len(data.train),
            "answer_tokens": sum(len(s.tokens) - s.response_start for s in data.train),
        },
    }
    store = datastore_file(data.train, pc.prompts)
    card = model_card(pc, tc, final, stages, datastore=bool(store))
    record = {
        "pipeline": pipeline_record(pc),
        "train": asdict(tc),
        "final": final,
        "history": trainer.history,
        "stages": stages,
    }
    extra = [
        ("README.md", card),
        (DRAFT_VOCAB_FILE, _draft_vocab(pc, data)),
        ("training.json", json.dumps(record, indent=2, default=str)),
        *store,
    ]
    trainer.export(pc.out, dtype=getattr(mx, pc.dtype), extra_files=extra)  # all or nothing
    return {"final": final, "stages": stages, "out": str(pc.out)}


def _draft_vocab(pc: PipelineConfig, data: PreparedData) -> str:
    """What the drafter learned to emit: every response token of its training data (and the
    corpus's answers, which it learned from too)."""
    counts = count_tokens(s.tokens[s.response_start :] for s in data.train)
    source = f"response tokens of the {len(data.train)} training regenerations ({pc.prompts})"
    if data.fixed is not None:
        answers = [s for shard in data.fixed.shards for s in shard]
        counts += count_tokens(s.tokens[a:b] for s in answers for a, b in s.spans)
        source += f" and of the {len(answers)} --corpus answers ({pc.corpus})"
    return draft_vocab_text(counts, source)


def run_pipeline(
    pc: PipelineConfig,
    tc: TrainConfig,
    log: Callable[[str], None] = print,
    on_step: Callable[[dict], None] | None = None,
) -> dict:
    return train_drafter(pc, tc, prepare_data(pc, tc, log), log, on_step)


# The DFlash 2 ablation: the same data, budget and seed; only the drafter's parts differ.
ABLATION_VARIANTS = {
    "dflash": {"version": 1},
    "dflash2-conv-only": {"version": 2, "selector_weight": 0.0},
    "dflash2-selector-only": {"version": 2, "train_conv": False},
    "dflash2": {"version": 2},
}


def run_ablation(
    pc: PipelineConfig,
    tc: TrainConfig,
    log: Callable[[str], None] = print,
    on_step: Callable[[dict], None] | None = None,
) -> dict:
    """Train every variant into pc.out/<variant>/ and write pc.out/ablation.json with the
    held-out teacher-forced τ (each block exactly what greedy decoding drafts at its anchor),
    per-position accuracy and the final loss parts."""
    check_config(tc, ablation=True)
    data = prepare_data(pc, tc, log)
    results = {}
    for name, change in ABLATION_VARIANTS.items():
        log(f"ablation: {name}")
        vtc = replace(tc, **change, command=f"{tc.command}  # variant {name}")
        vpc = replace(pc, out=pc.out / name)
        final = train_drafter(vpc, vtc, data, log, on_step)["final"]
        results[name] = {
            k: final.get(k) for k in ("proxy_tau", "position_accuracy", "loss", "base", "selector")
        }
    base = results["dflash"]["proxy_tau"]
    for r in results.values():
        r["gain_over_dflash"] = round(r["proxy_tau"] / base - 1, 4) if base else None
    summary = {
        "budget": {
            "steps": tc.steps,
            "batch_seqs": tc.batch_seqs,
            "anchors_per_seq": tc.anchors_per_seq,
            "block_size": tc.block_size,
            "layers": tc.layers,
            "seed": tc.seed,
        },
        "heldout_sequences": len(data.heldout),
        "variants": results,
        "command": tc.command,
    }
    pc.out.mkdir(parents=True, exist_ok=True)
    (pc.out / "ablation.json").write_text(json.dumps(summary, indent=2))
    return summary
