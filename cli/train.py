"""`dflash2 train`: distil a DFlash2 (default) or DFlash drafter for any mlx-lm target."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer


def train(
    target: str = typer.Argument(..., help="mlx-lm target: a folder or a Hugging Face repo id "
                                 "('smollm2-135m' = the embedded default)."),
    out: Path = typer.Option(..., "--out", "-o", help="Drafter folder to write."),
    work: Optional[Path] = typer.Option(None, help="Work folder for regenerations, features and "
                                        "checkpoints (default: OUT.work). Reruns resume from it."),
    prompts: str = typer.Option("train", help="Bundled split name or a JSONL file of prompts."),
    heldout: str = typer.Option("heldout", help="Held-out prompts (never trained on)."),
    version: int = typer.Option(2, min=1, max=2, help="2 = DFlash2 (conv + selector), 1 = DFlash."),
    layers: int = typer.Option(2, min=1, max=16, help="Drafter layers."),
    block_size: int = typer.Option(8, min=2, max=32, help="Trained block size."),
    layer_ids: Optional[str] = typer.Option(None, help="Target layer ids, e.g. '1,8,15,22,29'."),
    mask_token_id: Optional[int] = typer.Option(None, min=0, help="Mask token id (default: a "
                                                "reserved token of the tokenizer)."),
    steps: int = typer.Option(2000, min=1), batch: int = typer.Option(8, min=1),
    anchors: int = typer.Option(32, min=1, help="Anchors (blocks) per sequence and step."),
    lr: float = typer.Option(6e-4, min=0.0), max_new_tokens: int = typer.Option(256, min=8),
    temperatures: str = typer.Option("0,0.7", help="Regeneration temperatures."),
    full_vocab: bool = typer.Option(False, help="Full-vocabulary softmax (slower) instead of "
                                    "seen vocabulary + sampled negatives."),
    skip_bad_lines: bool = typer.Option(False, help="Skip malformed prompt lines (default: stop)."),
    seed: int = typer.Option(0, min=0),
):
    """Distil a drafter: regenerate responses with the target, cache its features, train.

    Example: dflash2 train smollm2-135m --out my-drafter --steps 3000
    """
    from dflash2_mlx.errors import DFlash2Error
    from dflash2_mlx.train.pipeline import PipelineConfig, run_pipeline
    from dflash2_mlx.train.trainer import TrainConfig

    try:
        ids = tuple(int(x) for x in layer_ids.split(",")) if layer_ids else None
        temps = tuple(float(x) for x in temperatures.split(","))
    except ValueError:
        raise typer.BadParameter("--layer-ids and --temperatures take comma-separated numbers")
    if target == "smollm2-135m":
        from dflash2_mlx.embedded import ensure_smollm2

        target = str(ensure_smollm2())
    pc = PipelineConfig(target=target, out=out, work=work or out.with_name(out.name + ".work"),
                        prompts=prompts, heldout=heldout, max_new_tokens=max_new_tokens,
                        temperatures=temps, skip_bad_lines=skip_bad_lines)
    tc = TrainConfig(version=version, layers=layers, block_size=block_size, target_layer_ids=ids,
                     mask_token_id=mask_token_id, steps=steps, batch_seqs=batch,
                     anchors_per_seq=anchors, lr=lr, vocab_subset=not full_vocab, seed=seed,
                     command="dflash2 train " + " ".join(shlex.quote(a) for a in sys.argv[2:]))
    from rich.console import Console

    console = Console()

    def on_step(rec: dict):
        if rec["step"] % 10 == 0 or "proxy_tau" in rec:
            extra = f"  τ(held-out) {rec['proxy_tau']:.3f}" if "proxy_tau" in rec else ""
            console.print(f"step {rec['step']:>6}/{steps}  loss {rec['loss']:.3f}  "
                          f"lr {rec['lr']:.2e}  {rec['tok_s']:.0f} tok/s{extra}")

    try:
        result = run_pipeline(pc, tc, log=console.print, on_step=on_step)
    except KeyboardInterrupt:
        console.print("[yellow]stopped; rerun the same command to resume[/]")
        raise typer.Exit(130)
    except DFlash2Error as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    console.print(f"drafter written to {result['out']}")


def register(app: typer.Typer) -> None:
    app.command()(train)
