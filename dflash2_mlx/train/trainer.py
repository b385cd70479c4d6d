"""Distil a DFlash2 (or DFlash v1) drafter for an mlx-lm target from cached target features.

Resumable: `out/checkpoint/` holds the drafter, optimizer state and step; Ctrl-C saves it.
The result is an official-format drafter folder (config.json + model.safetensors + README.md).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..checkpoint import load_drafter, save_drafter
from ..drafter.model import Drafter
from ..errors import DFlash2Error
from ..target.adapter import TargetAdapter

# Re-exported: callers build drafters through the trainer module.
from .config import TrainConfig  # noqa: F401
from .drafter_init import (  # noqa: F401
    drafter_config_for,
    init_drafter,
    init_from_drafter,
    init_from_target,
)
from .batches import make_blocks, make_subset, sample_anchors
from .features import StoredSequence
from .interrupts import whole_step
from .fixed_text import sample_text_anchors
from .objective import Blocks, Teacher, cosine_lr, decay_weights, loss_terms, proxy_acceptance
from .preflight import check_resumable
from .resume import read_arrays, read_state, restored_rng, rng_state
from .stream import FixedTextStream


def head_weight(adapter: TargetAdapter) -> mx.array:
    head = adapter.head
    w = getattr(head, "weight", None)
    if w is None:  # tied: embed_tokens.as_linear
        w = adapter.embed_tokens.weight
    if hasattr(head, "scales") or hasattr(adapter.embed_tokens, "scales"):
        raise DFlash2Error(
            "training needs an unquantized target (its LM head is quantized): train on its "
            "bf16 weights, or dequantize it first (mlx_lm.convert --hf-path TARGET "
            "--mlx-path OUT --dequantize); the drafter then serves the quantized target too"
        )
    return w


def check_distillable(adapter: TargetAdapter, off: str = "--distill 0") -> None:
    """Distillation reads the target's logits off its last layer's cached output. `off`:
    how the user turns the distillation asked for off."""
    last = len(adapter.layers) - 1
    if not adapter.layer_ids or adapter.layer_ids[-1] != last:
        raise DFlash2Error(
            f"distillation needs the target's last layer ({last}) as the last of "
            f"the layer ids (--layer-ids; got {list(adapter.layer_ids)}): add it, or "
            f"train with {off}"
        )
    if adapter.final_norm() is None:
        raise DFlash2Error(
            f"distillation is not supported for {adapter.model_type!r} targets "
            f"(their logits are not head(norm(h))): train with {off}"
        )


FIT_PROBE = 24  # training sequences whose τ is logged beside the held-out τ


def evaluate_proxy(
    drafter: Drafter, seqs: list[StoredSequence], scale: mx.array, max_seqs: int = 24
) -> dict:
    taus, per_pos = [], []
    cfg = drafter.config
    for s in seqs[:max_seqs]:
        anchors = sample_anchors(s, 0, cfg.block_size, random.Random(0), every=2)
        if anchors is None:
            continue
        b = make_blocks([s], [anchors], cfg.block_size, cfg.mask_token_id, scale)
        tau, acc = proxy_acceptance(drafter, b)
        taus.append((tau, len(anchors)))
        per_pos.append(acc)
    total = sum(n for _, n in taus)
    return {
        "proxy_tau": sum(t * n for t, n in taus) / max(total, 1),
        "position_accuracy": np.mean(np.array(per_pos), axis=0).round(3).tolist()
        if per_pos
        else [],
    }


def folded_copy(drafter: Drafter, scale: mx.array) -> Drafter:
    """A drafter whose fc absorbs the feature scaling: fc(F * s) == fc'(F)."""
    out = Drafter(drafter.config)
    params = dict(tree_flatten(drafter.parameters()))
    params["fc.weight"] = params["fc.weight"] * scale[None, :]
    out.load_weights(list(params.items()), strict=True)
    return out


def _start_drafter(
    drafter: Drafter, adapter: TargetAdapter, cfg: TrainConfig, scale: mx.array
) -> None:
    """The drafter's starting weights (cfg.init_from_target or cfg.init_from, else its own
    random init) and, with cfg.train_conv off, its frozen DFlash2 convs."""
    if cfg.init_from_target and cfg.init_from:
        raise DFlash2Error("init_from_target and init_from are exclusive: pick one start")
    if cfg.init_from_target:
        init_from_target(drafter, adapter, scale)
    if cfg.init_from:
        init_from_drafter(drafter, cfg.init_from, scale)
    if not cfg.train_conv:
        if drafter.config.version != 2:
            raise DFlash2Error(
                "train_conv=False freezes DFlash2's convs; a DFlash (v1) drafter has none"
            )
        for layer in drafter.layers:
            layer.attention_conv.freeze()
            layer.mlp_conv.freeze()


class Trainer:
    def __init__(
        self,
        adapter: TargetAdapter,
        drafter: Drafter,
        train: list[StoredSequence],
        heldout: list[StoredSequence],
        cfg: TrainConfig,
        out: Path,
        log: Callable[[str], None] = print,
        fixed: FixedTextStream | None = None,
    ):
        """`fixed`: a stream of target-labelled fixed text; cfg.fixed_ratio of each batch's
        sequences come from it (at ratio 0 it only widens the vocabulary subset, so that
        runs with and without it share one training softmax)."""
        self.adapter, self.drafter, self.cfg, self.out, self.log = adapter, drafter, cfg, out, log
        self.train, self.heldout, self.fixed = train, heldout, fixed
        if cfg.fixed_ratio > 0 and fixed is None:
            raise DFlash2Error(
                f"fixed_ratio {cfg.fixed_ratio} needs a fixed-text stream (a corpus)"
            )
        if not 0 <= cfg.fixed_ratio < 1:
            raise DFlash2Error(
                f"fixed_ratio must be in [0, 1) (got {cfg.fixed_ratio}): every "
                "batch keeps some regenerations"
            )
        drafter.bind(adapter.binding())
        from .features import feature_scale

        self.scale = mx.array(feature_scale(train))
        _start_drafter(drafter, adapter, cfg, self.scale)
        tokens = [s.tokens for s in train] + (fixed.tokens if fixed is not None else [])
        self.subset = (
            make_subset(tokens, head_weight(adapter), cfg.negatives, cfg.seed)
            if cfg.vocab_subset
            else None
        )
        self.known = None  # target labels outside the subset are masked, not remapped
        if self.subset is not None:
            self.known = np.zeros(adapter.vocab_size, dtype=np.float32)
            self.known[np.array(self.subset.ids)] = 1.0
        self.weights = decay_weights(cfg.block_size)
        if self.distills:
            check_distillable(adapter)
        self.opt = optim.AdamW(learning_rate=cfg.lr, betas=[0.9, 0.95], weight_decay=0.0)
        self.step = 0
        self.history: list[dict] = []
        self.rng = random.Random(cfg.seed)
        # τ on training sequences beside the held-out τ: the gap shows memorisation (data-bound)
        self.fit_probe = random.Random(cfg.seed + 1).sample(train, min(FIT_PROBE, len(train)))

    @property
    def distills(self) -> bool:
        c = self.cfg
        return c.distill_weight > 0 or (c.fixed_ratio > 0 and c.fixed_distill_weight > 0)

    # ------------------------------------------------------------- checkpoints
    @property
    def ckpt(self) -> Path:
        return self.out / "checkpoint"

    def save_checkpoint(self) -> None:
        tmp = self.out / "checkpoint.tmp"
        try:
            self._write_checkpoint(tmp)
            _swap_in(tmp, self.ckpt)
        except (OSError, RuntimeError, DFlash2Error) as e:  # a full disk: the last one stays
            why = str(e).removeprefix(f"{tmp}: ")
            raise DFlash2Error(
                f"{self.ckpt}: cannot save the checkpoint at step {self.step} ({why}); free "
                "space and rerun: training resumes from the last one saved"
            ) from None

    def _write_checkpoint(self, tmp: Path) -> None:
        save_drafter(self.drafter, tmp)
        mx.savez(str(tmp / "optimizer.npz"), **dict(tree_flatten(self.opt.state)))
        np.save(tmp / "feature_scale.npy", np.array(self.scale))
        (tmp / "state.json").write_text(
            json.dumps(
                {
                    "step": self.step,
                    "history": self.history,
                    "config": asdict(self.cfg),
                    "stream": self.fixed.state() if self.fixed is not None else None,
                    "rng": rng_state(self.rng),
                    "mlx_key": mx.random.state[0].tolist(),  # dropout's draws
                },
                default=str,
            )
        )

    def try_resume(self) -> bool:
        old = self.ckpt.with_name(self.ckpt.name + ".old")
        if not (self.ckpt / "state.json").exists() and (old / "state.json").exists():
            old.rename(self.ckpt)  # killed between _swap_in's renames: the last good one
        if not (self.ckpt / "state.json").exists():
            return False
        state = read_state(self.ckpt / "state.json")
        check_resumable(state, self.cfg, self.ckpt)
        loaded = load_drafter(self.ckpt)
        self.drafter.load_weights(list(tree_flatten(loaded.parameters())), strict=True)
        optimizer, scale = read_arrays(self.ckpt, self.scale.shape[0])
        self.opt.state, self.scale = tree_unflatten(list(optimizer.items())), mx.array(scale)
        self.step, self.history = state["step"], state["history"]
        if self.fixed is not None and state.get("stream"):
            self.fixed.restore(state["stream"])
        self.rng = restored_rng(state.get("rng"), self.cfg.seed + self.step)
        if state.get("mlx_key"):  # MLX's generator: seeding with a key's two words sets it
            high, low = state["mlx_key"]
            mx.random.seed((int(high) << 32) | int(low))
        return True

    # ------------------------------------------------------------- training
    def teacher(self) -> Teacher | None:
        """Built from the current feature scaling (a resumed run restores its own)."""
        if not self.distills:
            return None
        h = self.adapter.hidden_size
        w = self.subset.head_weight if self.subset is not None else head_weight(self.adapter)
        return Teacher(self.adapter.final_norm(), w, 1.0 / self.scale[-h:])

    def _loss(self, model, batch: list[Blocks], teacher: Teacher | None = None):
        # One sequence per call: padding a batch to a common context length measured slower.
        total, parts_sum = 0.0, {}
        for b in batch:
            distill = self.cfg.fixed_distill_weight if b.fixed else self.cfg.distill_weight
            loss, parts = loss_terms(
                model,
                b,
                self.weights,
                self.subset,
                self.cfg.selector_weight,
                teacher,
                distill,
                self.cfg.dropout,
            )
            total = total + loss
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v
        n = len(batch)
        return total / n, {k: v / n for k, v in parts_sum.items()}

    def next_batch(self) -> list[Blocks]:
        """batch_seqs sequences: round(fixed_ratio x batch_seqs) of fixed text (anchors where
        it agrees with the target preferred), the rest regenerations."""
        cfg, seqs, anchors = self.cfg, [], []
        n_fixed = round(cfg.fixed_ratio * cfg.batch_seqs) if self.fixed is not None else 0
        while len(seqs) < n_fixed:
            s = self.fixed.draw(self.rng)
            a = sample_text_anchors(
                s.tokens,
                s.greedy,
                s.spans,
                s.response_start,
                cfg.anchors_per_seq,
                cfg.block_size,
                self.rng,
            )
            if a is not None:
                seqs.append(s)
                anchors.append(a)
        while len(seqs) < cfg.batch_seqs:
            s = self.rng.choice(self.train)
            a = sample_anchors(s, cfg.anchors_per_seq, cfg.block_size, self.rng)
            if a is not None:
                seqs.append(s)
                anchors.append(a)
        return [
            make_blocks(
                [s],
                [a],
                cfg.block_size,
                self.drafter.config.mask_token_id,
                self.scale,
                pad_to=1,
                known=self.known,
            )
            for s, a in zip(seqs, anchors)
        ]

    def run(self, on_step: Callable[[dict], None] | None = None) -> dict:
        cfg = self.cfg
        teacher = self.teacher()
        grad_fn = nn.value_and_grad(self.drafter, lambda m, batch: self._loss(m, batch, teacher))
        t0, tokens = time.perf_counter(), 0
        try:
            while self.step < cfg.steps:
                with whole_step():  # Ctrl-C waits for the step's end: resumes give the same
                    loss, parts, gnorm, trained = self._step(grad_fn)
                    tokens += trained
                    rec = {
                        "step": self.step,
                        "loss": float(loss),
                        "lr": float(self.opt.learning_rate),
                        "grad_norm": float(gnorm),
                        "tok_s": tokens / (time.perf_counter() - t0),
                        **{k: float(v) for k, v in parts.items()},
                    }
                    if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                        self._evaluate(rec)
                    if on_step:
                        on_step(rec)
                    if self.step % cfg.checkpoint_every == 0:  # a save is whole too
                        self.save_checkpoint()
        except KeyboardInterrupt:
            self.save_checkpoint()
            self.log(f"interrupted: checkpoint saved at step {self.step} in {self.ckpt}")
            raise
        self.save_checkpoint()
        return self.history[-1] if self.history else {}

    def _step(self, grad_fn) -> tuple:
        """One optimizer step: (loss, its parts, the gradient's norm, tokens trained on)."""
        cfg = self.cfg
        batch = self.next_batch()
        self.opt.learning_rate = cosine_lr(self.step, cfg.steps, cfg.lr, cfg.warmup)
        (loss, parts), grads = grad_fn(self.drafter, batch)
        grads, gnorm = optim.clip_grad_norm(grads, cfg.clip)
        self.opt.update(self.drafter, grads)
        mx.eval(self.drafter.parameters(), self.opt.state, loss, parts)
        self.step += 1
        trained = sum(b.labels.size if b.mask is None else int(b.mask.sum().item()) for b in batch)
        return loss, parts, gnorm, trained

    def _evaluate(self, rec: dict) -> None:
        """Held-out proxy τ (every held-out sequence at the last step) and the training
        probe's into `rec`, kept in the history."""
        final = self.step == self.cfg.steps
        held = len(self.heldout) if final else 24
        rec.update(evaluate_proxy(self.drafter, self.heldout, self.scale, held))
        fit = evaluate_proxy(self.drafter, self.fit_probe, self.scale, FIT_PROBE)
        rec["train_tau"] = fit["proxy_tau"]
        self.history.append(rec)

    def export(self, folder: Path, dtype=mx.bfloat16, extra_files=()) -> Path:
        """The drafter (feature scaling folded into fc) and `extra_files` (name, text), all
        written or none (checkpoint.save_drafter)."""
        return save_drafter(
            folded_copy(self.drafter, self.scale), folder, dtype=dtype, extra_files=extra_files
        )


def _swap_in(new: Path, dest: Path) -> None:
    """`new` becomes `dest` by renames only, the old checkpoint deleted last: a kill at any
    point leaves a complete checkpoint at `dest` or at `dest`.old (try_resume takes it)."""
    import shutil

    old = dest.with_name(dest.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    if old.exists():
        shutil.rmtree(old)
