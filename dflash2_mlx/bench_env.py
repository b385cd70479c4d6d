"""What a benchmark result depends on and was taken beside: the report's header, the
machine (doctor() and the chip), the measured pair, the load while it ran."""

from __future__ import annotations

import os
import time
from typing import Sequence

from .profiles import chip_name


def report_header(schema: str, argv: Sequence[str]) -> dict:
    """The start of a --json report: its schema, when, the command, the machine."""
    return {
        "schema": schema,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "dflash2 " + " ".join(argv),
        "environment": environment(),
    }


def cpu_clock() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds, all its threads): `machine_load`'s `since`."""
    return time.perf_counter(), time.process_time()


def machine_load(since: tuple[float, float] | None = None) -> dict | None:
    """The 1-minute load average beside the cores (None where the system keeps none). With
    `since` (a `cpu_clock()` taken before a run of a minute or more): also `own_cores`, the
    cores this process kept busy since, which the load average counts too."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    out = {"load_1m": round(load, 2), "cores": os.cpu_count() or 1}
    if since is not None:
        wall = time.perf_counter() - since[0]
        if wall > 0:
            out["own_cores"] = round((time.process_time() - since[1]) / wall, 2)
    return out


# Other work on more cores than this, on average, makes timings swing. Beyond its CPU time a
# run's own threads add ~0.5 to the load while they wait for a core (dflash2 bench alone on 2
# cores: load 1.84-2.21 with 1.66-1.68 cores of CPU time), so half a core is no sign.
BUSY_OTHER_CORES = 1.0


SPEED_BUSY = (
    "speedups may be off by half, prompt by prompt; rerun on a quiet machine (tau and the "
    "identical outputs do not depend on it)"
)


AUTOTUNE_BUSY = (
    "the costs it timed, and so the block it stored, may be off; rerun --autotune on a quiet "
    "machine"
)
CONCURRENCY_BUSY = (
    "the aggregate tok/s and their ratios may be off; rerun on a quiet machine (the identical "
    "outputs do not depend on it)"
)


def busy_note(load: dict | None, effect: str = SPEED_BUSY) -> str | None:
    """What to say of timings whose `load` (machine_load) shows other work beside the run, or
    None: the load above the cores, and more than BUSY_OTHER_CORES of it not the run's own
    (other jobs take turns with the measured one: each prompt's speedup swings by half; on 2
    cores dflash2's decoding alone keeps the load above 2). `effect`: what the load may have
    done to the results. On a Mac the GPU's work is no CPU time: the run's own share reads
    small there."""
    if load is None or load["load_1m"] <= load["cores"]:
        return None
    other = load["load_1m"] - load.get("own_cores", 0.0)
    if other <= BUSY_OTHER_CORES:
        return None
    own = f", {load['own_cores']:g} of it this run's" if "own_cores" in load else ""
    return (
        f"the machine was busy while this ran (load {load['load_1m']:g} on {load['cores']} "
        f"cores{own}): {effect}"
    )


def pair_record(pair, resolved) -> dict:
    """The measured pair (`resolved`: registry.ResolvedPair): names, drafter, drafting
    sources, the weights' quantization."""
    from .quant import describe_quant, quant_signature

    qsig = quant_signature(pair)
    return {
        "name": resolved.name,
        "alias": resolved.alias,
        "target": resolved.target,
        "drafter": resolved.drafter,
        "drafter_version": pair.drafter.config.version,
        "draft_vocab": pair.drafter.draft_vocab_size,
        "lookup": pair.decoder.lookup,
        "datastore": pair.decoder.datastore is not None,
        "trained_block": pair.drafter.config.block_size,
        "quantization": qsig,
        "quantization_text": describe_quant(qsig),
    }


def environment() -> dict:
    """doctor() plus the chip name: what a benchmark result depends on."""
    from .diagnostics import doctor

    info = doctor()
    info["chip"] = chip_name()
    return info
