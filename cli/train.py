"""`dflash2 train`: distil a DFlash2 (default) or DFlash drafter for any mlx-lm target."""

from __future__ import annotations

import shlex

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from dflash2_mlx.train.config import TrainConfig  # its fields are the defaults below
from dflash2_mlx.train.pipeline_config import PipelineConfig, prompt_parts

from .common import fail, given_params, number_list
from .stop_flag import interrupt_status, terminate_as_interrupt
from .train_progress import training_progress


def _command_line(params: dict) -> str:
    """The running command as typed options (defaults left out), for the model card."""
    import inspect

    parts = ["dflash2", "train", str(params["target"])]
    for name, p in inspect.signature(train).parameters.items():
        value = params.get(name)
        if name in ("ctx", "target") or value == getattr(p.default, "default", None):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + flag[2:])
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def train(
    ctx: typer.Context,
    target: str = typer.Argument(
        ...,
        help="mlx-lm target: a folder, a Hugging Face repo id or an alias of `dflash2 models` "
        "('smollm2-135m' = the embedded default).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Drafter folder to write."),
    work: Optional[Path] = typer.Option(
        None,
        help="Work folder for regenerations, features (~5.8 KB a token for SmolLM2) and "
        "checkpoints (default: OUT.work). Reruns resume from it; delete it once the drafter "
        "is final.",
    ),
    prompts: str = typer.Option(
        PipelineConfig.prompts,
        help="Bundled split names or JSONL files of prompts, joined "
        "with '+' (train, train-wide, train-deep, train-broad: 564, 704, "
        "1,070 and 1,300 hand-written; train-extra, train-more: 843 and 424 "
        "template-built). NAME@0,0.7 gives a set its own "
        "regeneration temperatures. Each JSONL line needs an id, a category and "
        'messages: {"id": "q1", "category": "chat", "messages": [{"role": "user", '
        '"content": "..."}]} (the last message the user\'s).',
    ),
    heldout: str = typer.Option(
        PipelineConfig.heldout, help="Held-out prompts (never trained on)."
    ),
    version: int = typer.Option(
        TrainConfig.version, min=1, max=2, help="2 = DFlash2 (conv + selector), 1 = DFlash."
    ),
    layers: int = typer.Option(TrainConfig.layers, min=1, max=16, help="Drafter layers."),
    block_size: int = typer.Option(
        TrainConfig.block_size, min=2, max=32, help="Trained block size."
    ),
    layer_ids: Optional[str] = typer.Option(None, help="Target layer ids, e.g. '1,8,15,22,29'."),
    mask_token_id: Optional[int] = typer.Option(
        None, min=0, help="Mask token id (default: a reserved token of the tokenizer)."
    ),
    steps: int = typer.Option(
        TrainConfig.steps,
        min=1,
        help="Optimizer steps in all (a rerun with more resumes from its checkpoint).",
    ),
    batch: int = typer.Option(
        TrainConfig.batch_seqs, min=1, help="Sequences (answers) drawn per step."
    ),
    anchors: int = typer.Option(
        TrainConfig.anchors_per_seq, min=1, help="Anchors (blocks) per sequence and step."
    ),
    lr: float = typer.Option(
        TrainConfig.lr,
        min=0.0,
        max=1.0,
        help="Peak learning rate (warm-up, then cosine over --steps; a rerun with more "
        "--steps resumes on the schedule of the new total).",
    ),
    max_new_tokens: int = typer.Option(PipelineConfig.max_new_tokens, min=8),
    temperatures: str = typer.Option(
        ",".join(f"{t:g}" for t in PipelineConfig.temperatures),
        help="Regeneration temperatures (of the prompt sets without their own @temperatures).",
    ),
    regen_batch: int = typer.Option(
        PipelineConfig.regen_batch,
        min=1,
        help="Sequences regenerated together; larger "
        "is faster while memory allows (SmolLM2 on one CPU core: "
        "30 tok/s at 32, 55 at 96).",
    ),
    conv: bool = typer.Option(
        True,
        help="DFlash2: train the dynamic convs (--no-conv keeps them identity; for ablations).",
    ),
    selector: bool = typer.Option(
        True,
        help="DFlash2: train the path selector (--no-selector "
        "keeps it neutral: drafts are the per-position argmax).",
    ),
    distill: float = typer.Option(
        TrainConfig.distill_weight,
        min=0.0,
        max=100.0,
        help="Weight of the distillation term: KL from "
        "the target's whole next-token distribution (read off its last "
        "layer, which --layer-ids must then end with) to the drafter's.",
    ),
    dropout: float = typer.Option(
        TrainConfig.dropout,
        min=0.0,
        max=0.9,
        help="Dropout on the context rows "
        "and every attention / MLP output (against memorising a small "
        "training set).",
    ),
    corpus: Optional[Path] = typer.Option(
        None,
        help="Fixed text to mix in: a `dflash2 corpus` "
        "folder or a JSONL file of chat records, each with an id and messages "
        '({"id": "c1", "messages": [...]}). It is '
        "labelled by the target (its greedy next token, "
        "exact until the text leaves its greedy path, + KL).",
    ),
    corpus_ratio: float = typer.Option(
        0.5,
        min=0.0,
        max=0.95,
        help="Share of each batch's sequences from --corpus (the rest regenerations).",
    ),
    corpus_tokens: int = typer.Option(
        PipelineConfig.corpus_tokens,
        min=1000,
        help="Tokens of --corpus to use (records shuffled with --seed, then cut).",
    ),
    corpus_distill: float = typer.Option(
        TrainConfig.fixed_distill_weight,
        min=0.0,
        max=100.0,
        help="Weight of the KL to the target's "
        "distribution on --corpus's exactly-labelled positions.",
    ),
    stream_disk_gb: float = typer.Option(
        2.0,
        min=0.0,
        max=1e6,
        help="Disk for --corpus features: they "
        "are computed a shard at a time, trained on, deleted.",
    ),
    stream_passes: float = typer.Option(
        2.0,
        min=0.1,
        max=1000.0,
        help="Draws per sequence of a --corpus shard before the next shard is computed.",
    ),
    live_features: bool = typer.Option(
        False,
        "--live-features",
        help="Compute a training regeneration's target features when a step draws it "
        "instead of caching every one's first: no feature cache on disk and no hours of "
        "prefill before a short fine-tune; each step runs the target over its sequences.",
    ),
    init_from_target: bool = typer.Option(
        False, "--init-from-target", help="Start the drafter layers from the target's top layers."
    ),
    init_from: Optional[Path] = typer.Option(
        None,
        help="Start from this drafter folder's "
        "weights (same kind and shapes; its block size may "
        "differ), e.g. to fine-tune for a larger block. A drafter with fewer layers grows to "
        "--layers: the new layers start as the identity.",
    ),
    ablation: bool = typer.Option(
        False,
        "--ablation",
        help="Train DFlash, DFlash2 conv-only, selector-only and both at "
        "this same budget into OUT/<variant>/ and write OUT/ablation.json (held-out τ side by "
        "side).",
    ),
    full_vocab: bool = typer.Option(
        False,
        "--full-vocab",
        help="Full-vocabulary softmax (slower) instead of seen vocabulary + sampled negatives.",
    ),
    skip_bad_lines: bool = typer.Option(
        False, "--skip-bad-lines", help="Skip malformed prompt lines (default: stop)."
    ),
    seed: int = typer.Option(TrainConfig.seed, min=0),
):
    """Distil a drafter: regenerate responses with the target, cache its features, train.

    Example: dflash2 train smollm2-135m --out my-drafter --steps 3000
    """
    ids = number_list(layer_ids, int, "--layer-ids", "1,8,15") if layer_ids is not None else None
    temps = number_list(temperatures, float, "--temperatures", "0,0.7")
    _refuse_idle_flags(given_params(ctx), prompts, corpus, corpus_ratio, corpus_distill)
    if not out.name:  # "." or "..": the folder it names
        out = out.resolve()
    work = work or out.with_name(out.name + ".work")
    from dflash2_mlx.registry import target_of

    pc = PipelineConfig(
        target=target_of(target),
        out=out,
        work=work,
        prompts=prompts,
        heldout=heldout,
        max_new_tokens=max_new_tokens,
        temperatures=temps,
        regen_batch=regen_batch,
        skip_bad_lines=skip_bad_lines,
        corpus=str(corpus) if corpus else None,
        corpus_tokens=corpus_tokens,
        stream_disk_bytes=int(stream_disk_gb * 1e9),
        stream_passes=stream_passes,
        live_features=live_features,
    )
    tc = TrainConfig(
        version=version,
        layers=layers,
        block_size=block_size,
        target_layer_ids=ids,
        mask_token_id=mask_token_id,
        steps=steps,
        batch_seqs=batch,
        anchors_per_seq=anchors,
        lr=lr,
        vocab_subset=not full_vocab,
        seed=seed,
        selector_weight=1.0 if selector else 0.0,
        train_conv=conv,
        distill_weight=distill,
        dropout=dropout,
        fixed_ratio=corpus_ratio if corpus else 0.0,
        fixed_distill_weight=corpus_distill,
        init_from_target=init_from_target,
        init_from=str(init_from) if init_from else None,
        command=_command_line(ctx.params),
    )
    _run_training(pc, tc, ablation=ablation, target=target)


def _refuse_idle_flags(given, prompts: str, corpus, corpus_ratio: float, corpus_distill) -> None:
    """Refuses a flag given (`given`: the parameters named on the command line) that would
    change nothing: a --corpus flag without --corpus, one that acts on corpus batches with
    --corpus-ratio 0 (none holds corpus text), --temperatures when every --prompts set names
    its own."""
    corpus_flags = (
        "corpus_ratio",
        "corpus_tokens",
        "corpus_distill",
        "stream_disk_gb",
        "stream_passes",
    )
    used = ["--" + n.replace("_", "-") for n in corpus_flags if n in given]
    if corpus is None and used:
        fail(f"{', '.join(used)} only {'applies' if len(used) == 1 else 'apply'} with --corpus")
    idle = [f for f in used if f in ("--corpus-distill", "--stream-disk-gb", "--stream-passes")]
    if corpus_distill == 0 and "--corpus-distill" in idle:  # off, as the ratio makes it
        idle.remove("--corpus-distill")
    if corpus is not None and corpus_ratio == 0 and idle:
        fail(f"{', '.join(idle)}: no effect with --corpus-ratio 0 (no batch holds corpus text)")
    if "temperatures" in given and all(t for _, t in prompt_parts(prompts, ())):
        fail("--temperatures has no effect: every --prompts set names its own @temperatures")


def _size(folder: Path) -> str:
    total = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return f"{total / 1e9:.1f} GB" if total >= 1e8 else f"{total / 1e6:.0f} MB"


def _run_training(pc, tc, *, ablation: bool, target: str) -> None:
    """The pipeline (or the ablation) with a progress display; Ctrl-C as an exit (errors
    reach the app's handler: one line on stderr). `target` as typed (an alias stays one in
    the suggested chat command)."""
    from rich.console import Console

    from dflash2_mlx.train.pipeline import run_ablation, run_pipeline

    console = Console(soft_wrap=True)  # a log keeps whole lines (a terminal wraps its own)
    progress, on_step = training_progress(console, tc.steps)

    def say(text: str) -> None:  # the pipeline's lines are text: a path's [x] is no markup
        console.print(text, markup=False)

    try:
        with terminate_as_interrupt(), progress:
            if ablation:
                summary = run_ablation(pc, tc, log=say, on_step=on_step)
            else:
                result = run_pipeline(pc, tc, log=say, on_step=on_step)
    except KeyboardInterrupt as e:
        console.print("[yellow]stopped; rerun the same command to resume[/]")
        raise typer.Exit(interrupt_status(e))
    except OSError as e:  # a read-only or vanished --work or --out: its path, no traceback
        if e.filename is None:
            raise
        fail(
            f"{e.filename}: {e.strerror or e}; what was done so far is kept: rerun the same "
            "command once that is fixed"
        )
    if ablation:
        for name, r in summary["variants"].items():
            gain = r["gain_over_dflash"]
            vs = "no DFlash τ to compare" if gain is None else f"{gain:+.1%} vs DFlash"
            console.print(f"{name:<24} τ {r['proxy_tau']:.3f}  ({vs})")
        console.print(escape(f"ablation written to {pc.out / 'ablation.json'}"))
        return
    if not result.get("unchanged"):
        console.print(escape(f"drafter written to {result['out']}"))
    target, drafter = shlex.quote(target), shlex.quote(str(result["out"]))  # as typed
    console.print(
        escape(f"try it: dflash2 chat --target {target} --drafter {drafter}\n{_work_note(pc.work)}")
    )


def _work_note(work: Path) -> str:
    """What --work holds and what to delete: never a user's own files beside the work."""
    from dflash2_mlx.train.preflight import WORK_IDENTITY, WORK_PREFIXES, files_not_ours

    theirs = files_not_ours(work)
    delete = (
        f"delete its {', '.join(f'{p}*' for p in WORK_PREFIXES)} and {WORK_IDENTITY} once this "
        f"drafter is final (other files there are not train's: {', '.join(theirs[:3])})"
        if theirs
        else "delete it once this drafter is final"
    )
    return (
        f"{work} ({_size(work)}) holds the regenerations, features and checkpoint a rerun "
        f"resumes from: {delete}"
    )


def register(app: typer.Typer) -> None:
    app.command()(train)
