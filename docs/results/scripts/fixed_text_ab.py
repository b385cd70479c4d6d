"""A/B: does target-labelled fixed text help the shipped SmolLM2 drafter (stage 8)?

Both arms start from the shipped drafter (fresh AdamW), same seed, same budget (STEPS steps
of 8 sequences x 8 anchors, lr 3e-4, warm-up then cosine) and the same vocabulary subset;
arm `regen` draws all 8 sequences from regenerations, arm `mixed` 4 from regenerations and 4
from the packaged corpus (chitchat + wiki + Python docs), labelled by the target (greedy
labels up to the first off-path position + KL at those positions), features streamed.

    python fixed_text_ab.py prep  W CORPUS_DIR   # regen + held-out features, step-0 tau
    python fixed_text_ab.py regen W CORPUS_DIR   # the two arms (may run concurrently)
    python fixed_text_ab.py mixed W CORPUS_DIR
    python fixed_text_ab.py report W             # -> docs/results/smollm2-fixed-text-ab.json

The regeneration pool is a seeded sample of N_REGEN of the stage-8 training regenerations
(data/smollm2/*, the files stage 8 trained on); a CPU session cannot featurize all 4,366.
"""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import json
import os
import random
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load

from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.features import build_feature_cache, load_feature_cache, read_regenerations
from dflash2_mlx.train.fixed_text import corpus_sequences
from dflash2_mlx.train.stream import FixedTextStream
from dflash2_mlx.train.trainer import (
    TrainConfig,
    Trainer,
    drafter_config_for,
    evaluate_proxy,
    init_drafter,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "dflash2_mlx/assets/drafters/smollm2-135m-dflash2"
STAGE8_FILES = [
    "regen_train.jsonl",
    "regen_train-t07.jsonl",
    "regen_train-extra.jsonl",
    "regen_train-more.jsonl",
    "regen_extra-more-t07.jsonl",
    "regen_train-wide.jsonl",
]
IDS = (1, 8, 15, 22, 29)
STEPS, BATCH, ANCHORS, LR, SEED = 300, 8, 8, 3e-4, 0
N_REGEN = 200
CORPUS_TOKENS = 60_000
DISK_BYTES = 150_000_000  # ~26k tokens of features a shard
EVAL_EVERY = 100
if os.environ.get("AB_SMOKE"):  # a minute-long check of the whole flow
    STEPS, N_REGEN, CORPUS_TOKENS, DISK_BYTES, EVAL_EVERY = 4, 6, 4000, 10_000_000, 2


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def target():
    model, tok = load(str(ensure_smollm2()))
    return model, tok, TargetAdapter(model, IDS)


def prep(W: Path):
    model, tok, adapter = target()
    seqs = []
    for name in STAGE8_FILES:
        seqs += read_regenerations(REPO / "data/smollm2" / name, 512)
    pool = random.Random(SEED).sample(seqs, N_REGEN)
    log(
        f"regen pool: {N_REGEN} of {len(seqs)} stage-8 regenerations, "
        f"{sum(len(s.tokens) for s in pool):,} tokens"
    )
    held = read_regenerations(REPO / "data/smollm2/regen_heldout.jsonl", 512)
    build_feature_cache(adapter, held, W / "features_heldout", log=log)
    build_feature_cache(adapter, pool, W / "features_regen", log=log)
    (W / "prep.done").write_text("ok")
    log("features done")


def tc_for(arm: str, mask_id: int) -> TrainConfig:
    return TrainConfig(
        version=2,
        layers=2,
        block_size=8,
        target_layer_ids=IDS,
        mask_token_id=mask_id,
        steps=STEPS,
        batch_seqs=BATCH,
        anchors_per_seq=ANCHORS,
        lr=LR,
        seed=SEED,
        init_from=str(SHIPPED),
        eval_every=EVAL_EVERY,
        checkpoint_every=25,
        fixed_ratio=0.5 if arm == "mixed" else 0.0,
        command=f"python docs/results/scripts/fixed_text_ab.py {arm} W CORPUS",
    )


def arm(name: str, W: Path, corpus: Path):
    model, tok, adapter = target()
    mask_id = json.loads((SHIPPED / "config.json").read_text())["dflash_config"]["mask_token_id"]
    fixed_seqs = corpus_sequences(tok, corpus, max_tokens=CORPUS_TOKENS, seed=SEED)
    draws = STEPS * round(0.5 * BATCH)
    passes = max(1.0, draws / len(fixed_seqs))
    stream = FixedTextStream(
        adapter, fixed_seqs, W / f"stream-{name}", max_disk_bytes=DISK_BYTES, passes=passes, log=log
    )
    log(
        f"corpus: {len(fixed_seqs)} sequences, {sum(len(s.tokens) for s in fixed_seqs):,} tokens, "
        f"{len(stream.shards)} shards, {passes:.2f} passes a shard"
    )
    tc = tc_for(name, mask_id)
    if tc.fixed_ratio > 0:
        stream.pool()  # the first shard's features while `prep` may still be running
    while not (W / "prep.done").exists():
        time.sleep(20)
    train = load_feature_cache(W / "features_regen")
    held = [s for s in load_feature_cache(W / "features_heldout") if s.temperature == 0.0]
    dcfg = drafter_config_for(
        adapter, json.loads((ensure_smollm2() / "config.json").read_text()), tc
    )
    trainer = Trainer(
        adapter, init_drafter(dcfg, tc), train, held, tc, W / f"run-{name}", log, stream
    )
    out = W / f"result-{name}.json"
    if trainer.try_resume():
        log(f"resumed at step {trainer.step}")
    elif name == "regen" and not (W / "step0.json").exists():  # the shared start, measured once
        r = evaluate_proxy(trainer.drafter, held, trainer.scale, len(held))
        (W / "step0.json").write_text(json.dumps(r))
        log(f"step 0: held-out tau on all {len(held)}: {r['proxy_tau']:.4f}")
    t0 = time.perf_counter()

    def on_step(rec):
        if rec["step"] % 10 == 0 or "proxy_tau" in rec:
            log(
                json.dumps(
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}
                )
            )
        if "proxy_tau" in rec:
            out.write_text(
                json.dumps(
                    {
                        "arm": name,
                        "config": tc.__dict__,
                        "history": trainer.history,
                        "seconds": time.perf_counter() - t0,
                    },
                    default=str,
                    indent=1,
                )
            )

    final = trainer.run(on_step)
    out.write_text(
        json.dumps(
            {
                "arm": name,
                "config": tc.__dict__,
                "history": trainer.history,
                "final": final,
                "stream": stream.state(),
                "seconds_this_run": round(time.perf_counter() - t0, 1),
            },
            default=str,
            indent=1,
        )
    )
    trainer.export(W / f"drafter-{name}", dtype=mx.bfloat16)
    stream.close()
    log(f"{name}: done, held-out tau {final.get('proxy_tau')}")


def start_tau_first24(W: Path) -> float:
    """The shared start's held-out tau on the first 24 continuations (the curves' points
    before the last step use those 24)."""
    path = W / "step0-24.json"
    if not path.exists():
        model, tok, adapter = target()
        mask_id = json.loads((SHIPPED / "config.json").read_text())["dflash_config"][
            "mask_token_id"
        ]
        tc = tc_for("regen", mask_id)
        train = load_feature_cache(W / "features_regen")
        held = [s for s in load_feature_cache(W / "features_heldout") if s.temperature == 0.0]
        dcfg = drafter_config_for(
            adapter, json.loads((ensure_smollm2() / "config.json").read_text()), tc
        )
        tr = Trainer(adapter, init_drafter(dcfg, tc), train, held, tc, W / "run-step0", log)
        path.write_text(json.dumps(evaluate_proxy(tr.drafter, held, tr.scale, 24)))
    return json.loads(path.read_text())["proxy_tau"]


def report(W: Path):
    """Both arms' curves (held-out tau on the first 24 continuations every EVAL_EVERY steps,
    on all 61 at the last step) -> docs/results/smollm2-fixed-text-ab.json."""
    import platform

    from dflash2_mlx import _blas

    arms = {}
    for name in ("regen", "mixed"):
        path = W / f"result-{name}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        hist = r["history"]
        arms[name] = {
            "finished": "final" in r,
            "curve": [
                {
                    "step": h["step"],
                    "heldout_tau": round(h["proxy_tau"], 4),
                    "heldout_sequences": 61 if h["step"] == STEPS else 24,
                    "train_tau_24": round(h["train_tau"], 4),
                    "loss": round(h["loss"], 4),
                    **{k: round(h[k], 4) for k in ("base", "selector", "distill") if k in h},
                }
                for h in hist
            ],
            "final_all_61": (
                {
                    "tau": round(r["final"]["proxy_tau"], 4),
                    "position_accuracy": r["final"]["position_accuracy"],
                }
                if "final" in r
                else None
            ),
            "seconds": round(r.get("seconds_this_run", r.get("seconds", 0))),
        }
    step0 = json.loads((W / "step0.json").read_text()) if (W / "step0.json").exists() else None
    b = _blas.info()
    out = {
        "what": "Fixed-text A/B from the shipped stage-8 SmolLM2 drafter: STEPS more steps on "
        "regenerations only vs half of each batch from target-labelled packaged text",
        "start": {
            "drafter": "dflash2_mlx/assets/drafters/smollm2-135m-dflash2 (stage 8)",
            "heldout_tau_all_61": round(step0["proxy_tau"], 4) if step0 else None,
            "heldout_tau_first_24": round(start_tau_first24(W), 4),
        },
        "budget": {
            "steps": STEPS,
            "batch_seqs": BATCH,
            "anchors_per_seq": ANCHORS,
            "lr": LR,
            "schedule": "AdamW (fresh), 4% warm-up, cosine to 10%",
            "seed": SEED,
        },
        "data": {
            "regenerations": f"{N_REGEN} sampled (seed {SEED}) from stage 8's 4,366 "
            f"({', '.join(STAGE8_FILES)})",
            "fixed_text": f"the first {CORPUS_TOKENS:,} tokens of the shuffled corpus "
            "(dflash2 corpus: chitchat + wiki + python-docs), greedy labels "
            "up to the first off-path position + 1 x KL there; anchors "
            "weighted by exact labels; streamed in shards of "
            f"{DISK_BYTES / 1e6:.0f} MB",
            "mixed_ratio": 0.5,
        },
        "heldout": "teacher-forced tau (anchors every 2nd position) on the first 24 held-out "
        "greedy continuations during training, all 61 at the last step; noise ~ +-0.02",
        "arms": arms,
        "hardware": f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs "
        f"(load ~10), fp32, {b.route}, {b.threads} BLAS thread per arm, "
        "both arms concurrently, MLX " + mx.__version__,
        "commands": [
            f"python docs/results/scripts/fixed_text_ab.py {c} W CORPUS"
            for c in ("prep", "regen", "mixed")
        ]
        + ["dflash2 corpus --out CORPUS"],
    }
    if all(a.get("final_all_61") for a in arms.values()) and len(arms) == 2:
        out["mixed_minus_regen_all_61"] = round(
            arms["mixed"]["final_all_61"]["tau"] - arms["regen"]["final_all_61"]["tau"], 4
        )
    out["notes"] = [
        "Both arms end below the start: the regeneration pool (N_REGEN sequences, all seen in "
        "stage 8) is memorised (train tau 2.0 -> 3.1 in the regen arm), so a continuation "
        "on it alone loses held-out tau; the fixed text slows that (train tau 2.3).",
        "The fixed text is small: CORPUS_TOKENS tokens featurized, each sequence drawn ~5 "
        "times; on this shared CPU (load ~11 on 2 cores) target features ran at ~50-70 tok/s "
        "a process, so the 1-2M tokens the issue asks for did not fit in the session.",
    ]
    out["notes"] = [
        n.replace("N_REGEN", str(N_REGEN)).replace("CORPUS_TOKENS", f"{CORPUS_TOKENS:,}")
        for n in out["notes"]
    ]
    dest = REPO / "docs/results/smollm2-fixed-text-ab.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(dest)


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["prep", "regen", "mixed", "report"])
    ap.add_argument("work", type=Path, help="work folder (features, checkpoints, results)")
    ap.add_argument("corpus", type=Path, nargs="?", help="`dflash2 corpus` folder (arms only)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.command == "prep":
        prep(args.work)
    elif args.command == "report":
        report(args.work)
    elif args.corpus is None:
        ap.error(f"{args.command} needs the corpus folder")
    else:
        arm(args.command, args.work, args.corpus)


if __name__ == "__main__":
    main()
