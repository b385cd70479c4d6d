"""The training configuration of `dflash2 train` (typed; the CLI's defaults are these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    version: int = 2
    layers: int = 2
    block_size: int = 8
    target_layer_ids: tuple[int, ...] | None = None
    mask_token_id: int | None = None
    steps: int = 2000
    batch_seqs: int = 8
    anchors_per_seq: int = 32
    lr: float = 6e-4
    warmup: float = 0.04
    clip: float = 1.0
    selector_weight: float = 1.0
    distill_weight: float = 0.0  # KL to the target's distribution (needs its last layer captured)
    fixed_ratio: float = 0.0  # share of each batch's sequences drawn from fixed text (a stream)
    fixed_distill_weight: float = 1.0  # KL weight on fixed text's supervised positions
    dropout: float = 0.0  # on context rows and attention / MLP outputs (objective.block_hidden)
    vocab_subset: bool = True
    negatives: int = 2048
    qk_norm_init: float = 2.0
    init_from_target: bool = False  # copy the target's top layers (see init_from_target)
    init_from: str | None = None  # start from this drafter folder's weights (see init_from_drafter)
    start_layout: dict | None = None  # init_from's geometry and attention, kept (adopt_start)
    train_conv: bool = True  # False: DFlash2 convs stay identity (ablation "selector only")
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 64
    selector_top_k: int = 16
    eval_every: int = 100
    checkpoint_every: int = 100
    seed: int = 0
    command: str = ""  # recorded in the model card
