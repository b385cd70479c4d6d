"""load_pair: a target and a drafter from folders, repo ids or a registered pair's name, with the
drafting its front ends would resolve for it (this machine's autotune profile, else the pair's
recommended block)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from .api import Pair
from .chat_template import check_chat_template, read_chat_template
from .checkpoint import check_draft_vocab_limit, load_drafter
from .downloads import fetch, is_repo_id
from .engine.datastore import Datastore, find_datastore
from .engine.lookup import DEFAULT_LOOKUP
from .engine.loop import check_lookup
from .errors import CompatibilityError, ConfigError, FetchError, ModelNotFoundError, ParameterError
from .registry import ResolvedPair, closest, lookup, resolve
from .settings import EngineFlags, resolve_engine
from .target.adapter import TargetAdapter
from .target.folder import load_target_folder


_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def load_pair(
    target: str | Path,
    drafter: str | Path | None = None,
    *,
    dtype: str | None = None,
    offline: bool = False,
    full_vocab: bool = False,
    draft_vocab_limit: int | None = None,
    lookup: int = DEFAULT_LOOKUP,
    datastore: bool | None = None,
    chat_template: str | None = None,
    resolve_drafting: bool = True,
) -> Pair:
    """Load an mlx-lm target (folder or repo id) and a DFlash / DFlash2 drafter; with no
    `drafter`, `target` names a pair of `dflash2 models` (e.g. "smollm2-135m", the embedded
    default, or a registered target's repo id). `dtype`: the drafter's weights ("float16",
    ...; default: the target's, or float32 for a half-precision target on the CPU, which has
    no fast half-precision matmul; the target loads as its checkpoint is stored). `offline`:
    never contact the hub.
    `full_vocab`: draft from the whole vocabulary even if the drafter has a draft_vocab.json;
    `draft_vocab_limit`: draft from only its N most frequent tokens; `lookup` > 0: propose the
    context's own continuation where the last `lookup` tokens repeat (engine/lookup.py);
    `datastore`: the drafter folder's response datastore (engine/datastore.py) — None: used
    when it ships one, True: required, False: off. `chat_template`: a Jinja chat template in
    place of the target's own (or for a target that has none; chat_template.read_chat_template
    reads one from a file). `resolve_drafting`: False leaves `pair.drafting` and
    `pair.width_cost` empty (the trained block, the default cost model), for a caller that
    resolves its own settings (the CLI, with its flags)."""

    for name, value in (("target", target), ("drafter", drafter)):
        if not isinstance(value, (str, Path)) and not (name == "drafter" and value is None):
            raise ParameterError(
                f"{name} must be a folder, a repo id or a pair's name (str or Path), got {value!r}"
            )
    if dtype is not None and dtype not in _DTYPES:
        raise ParameterError(f"dtype must be one of {', '.join(_DTYPES)} or None, got {dtype!r}")
    for name, flag in (
        ("offline", offline),
        ("full_vocab", full_vocab),
        ("resolve_drafting", resolve_drafting),
    ):
        if not isinstance(flag, bool):
            raise ParameterError(f"{name} must be True or False, got {flag!r}")
    check_lookup(lookup)  # these before anything loads (a hub target downloads)
    _check_datastore_flag(datastore)
    check_draft_vocab_limit(draft_vocab_limit)
    if chat_template is not None:  # a file's path, or the template's text
        chat_template = read_chat_template(chat_template)
    if drafter is None:  # a registered pair, with its recommended block
        resolved = _registered_pair(str(target), offline)
    elif _names_a_pair(target):  # a pair's name with another drafter: that pair's target
        resolved = resolve(str(target), drafter=str(drafter), offline=offline)
    else:
        resolved = ResolvedPair(str(target), str(drafter))
    target = fetch(resolved.target, "target", offline=offline)
    model, tokenizer = load_target_folder(target, chat_template)
    if chat_template:
        tokenizer._chat_template = None  # a Python renderer (chat_template_type) would win
        check_chat_template(tokenizer, "chat_template")
    adapter_probe = TargetAdapter(model, ())
    weight_dtype = _DTYPES.get(dtype or "", _drafter_dtype(model, adapter_probe))
    folder = fetch(resolved.drafter, "drafter", offline=offline)
    d = load_drafter(
        folder,
        dtype=weight_dtype,
        offline=offline,
        draft_vocab=not full_vocab,
        draft_vocab_limit=draft_vocab_limit,
    )
    try:
        pair = Pair.from_models(
            model, tokenizer, d, lookup=lookup, datastore=_drafter_datastore(folder, datastore)
        )
    except CompatibilityError as exc:  # name the folders: the pair's own message cannot
        raise CompatibilityError(f"target {target}, drafter {folder}: {exc}") from None
    if resolve_drafting:
        settings = resolve_engine(EngineFlags(), pair, resolved, None)  # as chat's, no flags
        pair.drafting, pair.width_cost = settings.drafting, settings.width_cost
    return pair


def _drafter_dtype(model, adapter: TargetAdapter):
    """The target's activation dtype; float32 in place of half precision on the CPU (a bf16
    drafter drafted 3.4x slower there). A quantized target keeps its own: its head's scales
    set the dtype its matmul takes."""
    from .quant import quantized_layers

    native = adapter.embed_tokens(mx.array([[0]])).dtype
    if native in (mx.bfloat16, mx.float16) and mx.default_device() == mx.cpu:
        if not quantized_layers(model):
            return mx.float32
    return native


def _registered_pair(target: str, offline: bool = False):
    """The pair `dflash2 models` lists under `target`: its name, its target's repo id, or the
    folder the embedded target lives in."""
    try:
        return resolve(target, offline=offline)
    except ModelNotFoundError:
        pass
    path = Path(target).expanduser()
    if not path.exists() and target.startswith((".", "/", "~")):  # a path, not a name
        raise FetchError(f"target {target}: no such folder") from None
    try:
        return resolve(None, target, offline=offline)  # a registered pair's target folder
    except ModelNotFoundError:
        near = [] if path.exists() else closest(target)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ModelNotFoundError(
            f"{target}: not a pair `dflash2 models` lists{hint}; pass its drafter too: "
            "load_pair(target, drafter)"
        ) from None


def _names_a_pair(target) -> bool:
    """`target` is an alias `dflash2 models` lists, not a folder or repo id."""
    text = str(target)
    if Path(text).expanduser().exists() or is_repo_id(text):
        return False
    try:
        lookup(text)
    except ModelNotFoundError:
        return False
    return True


def _check_datastore_flag(wanted) -> None:
    if wanted is not None and not isinstance(wanted, bool):
        raise ParameterError(f"datastore must be True, False or None, got {wanted!r}")


def _drafter_datastore(folder: Path, wanted: bool | None) -> Datastore | None:
    """The drafter folder's datastore as `wanted` (checked by `load_pair`) says (True with
    none shipped: an error)."""
    path = find_datastore(folder) if wanted is not False else None
    if wanted and path is None:
        raise ConfigError(
            f"{folder}: the drafter ships no datastore.npz (datastore=True asks for it)"
        )
    return Datastore.load(path) if path is not None else None
