"""Issue 41, "every value bounded, every structure bounded": the attacks on YAML recipes, CLI values and resume states.

YAML: a 1 KB "billion laughs" recipe (10 levels x 10 aliases) hung `pacs train --config` in `expand_env`; YAML
nested 100,000 deep was a RecursionError; `_base_: 5` a TypeError; a non-UTF-8 recipe a UnicodeDecodeError;
`_base_: /etc/shadow` was read and its first line echoed. CLI: `--beam-size 100000`, `--bootstrap 1000000000`,
`--seed -1` and `--max-new-tokens 1000000000` went past the bounds the configs have; `scst.temperature=1e-300` is 0
in float32. Resume: a state claiming step 10**12 ended XE with its early weights, step -5 trained from -5. Each is
one line and exit 2 now, before any work, and nothing given is changed.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import typing
from pathlib import Path

import pytest
from cli_errors import one_error_line
from script_modules import load_captioner_testkit

from pacs import cli as pacs_cli
from pacs.metric.common.config import MAX_BASE_FILES, MAX_YAML_DEPTH, MAX_YAML_VALUES, describe_type, load_yaml
from pacs.metric.common.errors import InputError, PacsError

TESTS = Path(__file__).resolve().parents[1]
SECRET = "root:$6$SECRETHASH:19000:0:99999:7:::"


def _laughs(levels: int = 10, width: int = 10) -> str:
    """The 'billion laughs' YAML: level i holds `width` aliases of level i - 1 (width**levels values, ~600 bytes)."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _train(config: Path, *overrides: str) -> int:
    return pacs_cli.main(["--log-level", "ERROR", "train", "--config", str(config), *overrides])


# --- YAML: aliases, nesting, `_base_`, encodings --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["recipe", "demo"])
def test_a_billion_laughs_recipe_is_one_line_at_once(kind, tmp_path, capsys):
    """The recipe (which went on to `expand_env`) and the demo config (refused by its unknown keys) meet the same
    bound in the loader: one line naming the file and the line where the expansion passes it, in well under a
    second, and no run directory."""
    text = _laughs()
    assert len(text.encode()) < 1024
    config = tmp_path / "bomb.yaml"
    runs = tmp_path / "runs"
    config.write_text(text + (f"run_dir: {runs}\n" if kind == "recipe" else f"demo:\n  runs_dir: {runs}\n"))
    started = time.monotonic()
    assert _train(config) == 2
    assert time.monotonic() - started < 5
    line = one_error_line(capsys, "train")
    assert line == (f"pacs train: error: {config}: refused: line 5, column 5: its aliases expand to more than "
                    f"{MAX_YAML_VALUES} values (a 'billion laughs' document?): write the values out, or use fewer "
                    "aliases")
    assert not runs.exists()


def test_aliases_a_recipe_really_uses_still_load(tmp_path):
    """Control: shared sections (the packaged recipes use `&tiny_clip`) and a width**levels below the bound load."""
    config = tmp_path / "ok.yaml"
    config.write_text(_laughs(levels=4) + "again: *l3\n")  # 10**4 values, twice
    data = load_yaml(config)
    assert len(data["l3"]) == 10 and data["again"] is data["l3"]
    assert load_yaml("flickr8k_tiny")["features"]["source"]["random_config"]["embed_dim"] == 32


def test_an_alias_inside_its_own_anchor_is_one_line(tmp_path, capsys):
    config = tmp_path / "loop.yaml"
    config.write_text("a: &a [1, *a]\n")
    assert _train(config) == 2
    assert one_error_line(capsys, "train") == (f"pacs train: error: {config}: refused: line 1, column 11: an alias "
                                                "refers to the node that contains it (a recursive anchor)")


@pytest.mark.parametrize("style", ["flow", "block"])
def test_yaml_nested_too_deep_is_one_line(style, tmp_path, capsys):
    config = tmp_path / "deep.yaml"
    if style == "flow":
        config.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")  # a RecursionError before
    else:
        config.write_text("".join(f"{' ' * level}k{level}:\n" for level in range(150)) + " " * 150 + "v: 1\n")
    assert _train(config) == 2
    line = one_error_line(capsys, "train")
    assert line.startswith(f"pacs train: error: {config}: refused: line ")
    assert line.endswith(f": nested more than {MAX_YAML_DEPTH} levels deep")


def test_an_override_nested_too_deep_is_one_line_naming_the_key(tmp_path, capsys):
    value = "[" * 1000 + "]" * 1000
    assert pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={tmp_path / 'runs'}", f"seeds={value}"]) == 2
    assert one_error_line(capsys, "train") == (f"pacs train: error: override seeds=...: refused: line 1, column "
                                                f"{MAX_YAML_DEPTH + 1}: nested more than {MAX_YAML_DEPTH} levels deep")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("base, shown", [("5", "5"), ("[1, 2]", "[1, 2]"), ("{a: b.yaml}", "{'a': 'b.yaml'}"),
                                         ("[base.yaml, '']", "['base.yaml', '']")])
def test_a_base_that_is_not_file_names_is_one_line_naming_base(base, shown, tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("seed: 1\n")
    config = tmp_path / "child.yaml"
    config.write_text(f"_base_: {base}\nseed: 2\n")
    assert _train(config) == 2
    assert one_error_line(capsys, "train") == (f"pacs train: error: {config}: _base_ must be a YAML file name or "
                                                f"a list of them, got {shown}")


@pytest.mark.parametrize("where", ["recipe", "base"])
def test_a_config_that_is_not_utf8_is_one_line(where, tmp_path, capsys):
    latin = tmp_path / ("latin.yaml" if where == "recipe" else "base.yaml")
    latin.write_bytes(b"name: caf\xe9\n")
    config = latin if where == "recipe" else tmp_path / "child.yaml"
    if where == "base":
        config.write_text("_base_: base.yaml\n")
    assert _train(config) == 2
    assert one_error_line(capsys, "train") == (f"pacs train: error: {latin}: not UTF-8 text (byte 9 cannot be "
                                                "decoded): save the config as UTF-8")


def test_a_base_that_is_a_secret_file_is_refused_and_never_echoed(tmp_path, capsys):
    """`_base_: /etc/shadow` was read and its first line printed in the 'unknown key' error: a `_base_` must be a
    .yaml / .yml file (after links), so neither a file without the suffix nor a .yaml link to it is read."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    (tmp_path / "link.yaml").symlink_to(secret)
    for base in (str(secret), "link.yaml"):
        config = tmp_path / "child.yaml"
        config.write_text(f"_base_: {base}\n")
        assert _train(config) == 2
        line = one_error_line(capsys, "train")
        assert line == (f"pacs train: error: {config}: _base_ {secret} is not a YAML file (a _base_ names a .yaml "
                        "or .yml file)")
        assert "SECRET" not in line
    assert secret.read_text() == SECRET + "\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_base_that_is_a_fifo_or_a_device_is_one_line_and_never_opened(tmp_path, capsys):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it would block: nobody writes
    for base, path, kind in ((fifo.name, fifo, "a FIFO (named pipe)"), ("/dev/zero", Path("/dev/zero"),
                                                                        "a character device")):
        config = tmp_path / "child.yaml"
        config.write_text(f"_base_: {base}\n")
        assert _train(config) == 2
        assert one_error_line(capsys, "train") == (f"pacs train: error: {config}: _base_ {path} is {kind}, not a "
                                                    "regular file: pacs reads only regular files and folders")


def test_invalid_yaml_names_the_line_but_never_prints_it(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("seed: 1\ntoken: SECRET: x\n")
    assert _train(config) == 2
    line = one_error_line(capsys, "train")
    assert line == (f"pacs train: error: {config}: invalid YAML: mapping values are not allowed here "
                    "(line 2, column 14)")


def test_a_base_named_again_and_again_at_every_level_is_bounded(tmp_path, capsys):
    """The `_base_` form of the bomb: each file names the next one ten times (10**4 loads at depth 4)."""
    (tmp_path / "b4.yaml").write_text("seed: 1\n")
    for level in range(4):
        (tmp_path / f"b{level}.yaml").write_text(f"_base_: [{', '.join([f'b{level + 1}.yaml'] * 10)}]\n")
    assert _train(tmp_path / "b0.yaml") == 2
    line = one_error_line(capsys, "train")
    assert line.endswith(f": _base_: more than {MAX_BASE_FILES} base files over the chain (a base named many times "
                         "at every level?)")


# --- CLI values: the configs' bounds from one table ----------------------------------------------------------------

def test_the_flag_table_holds_the_configs_own_bounds():
    """`flags.FLAG_BOUNDS` is the one table; its bounds are those the recipe configs give the same settings."""
    from pacs.captioner.orchestration.pipeline_config import EvalConfig, PipelineConfig
    from pacs.metric.commands.flags import FLAG_BOUNDS

    def config_type(cls: type, key: str) -> typing.Any:
        return typing.get_type_hints(cls, include_extras=True)[key]

    assert describe_type(FLAG_BOUNDS["beam_size"][0]) == describe_type(config_type(EvalConfig, "beam_size"))
    assert describe_type(FLAG_BOUNDS["bootstrap"][0]) == describe_type(config_type(EvalConfig, "bootstrap"))
    assert describe_type(FLAG_BOUNDS["seed"][0]) == describe_type(config_type(PipelineConfig, "seed"))


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """References and two systems' captions of two images."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "refs.json").write_text(json.dumps({"a": ["a red square", "a red box"], "b": ["a blue circle"]}))
    (folder / "s1.json").write_text(json.dumps({"a": "a red square", "b": "a blue circle"}))
    (folder / "s2.json").write_text(json.dumps({"a": "red", "b": "a circle"}))
    return folder


def _evaluate(texts: Path, out: Path, *extra: str) -> int:
    return pacs_cli.main(["evaluate", "--candidates", f"s1={texts / 's1.json'}", f"s2={texts / 's2.json'}",
                          "--references", str(texts / "refs.json"), "--metrics", "length", "--out", str(out),
                          *extra])


@pytest.mark.parametrize("flags, message", [
    (["--bootstrap", "1000000000"], ("--bootstrap 1000000000: expected int >= 0 and <= 100000 (the bound of bootstrap "
                                     "resamples, as in the configs; 0: none)")),
    (["--bootstrap", "0", "--seed", "-1"], ("--seed -1: expected int >= 0 and <= 4294967295 (the bound of random "
                                            "seeds, as in the configs)")),
    (["--bootstrap", "0", "--seed", str(2**32)], (f"--seed {2**32}: expected int >= 0 and <= 4294967295 (the bound "
                                                  "of random seeds, as in the configs)")),
])
def test_evaluate_values_past_the_configs_bounds_are_one_line(flags, message, texts, tmp_path, capsys):
    out = tmp_path / "table.json"
    assert _evaluate(texts, out, *flags) == 2
    assert one_error_line(capsys, "evaluate") == f"pacs evaluate: error: {message}"
    assert not out.exists() and not out.with_suffix(".csv").exists()  # no partial output


def test_evaluate_at_the_bounds_runs(texts, tmp_path, capsys):
    """Control: the lowest seed and no bootstrap are inside the bounds."""
    out = tmp_path / "table.json"
    assert _evaluate(texts, out, "--bootstrap", "0", "--seed", "0") == 0, capsys.readouterr().err
    assert [row["system"] for row in json.loads(out.read_text())["rows"]] == ["s1", "s2"]


def test_correlate_bootstrap_past_the_bound_is_one_line(tmp_path, capsys):
    assert pacs_cli.main(["correlate", "flickr8k-expert", "--data", str(tmp_path / "none"), "--metrics", "length",
                          "--bootstrap", "1000000000"]) == 2
    assert one_error_line(capsys, "correlate") == ("pacs correlate: error: --bootstrap 1000000000: expected int >= 0 "
                                                    "and <= 100000 (the bound of bootstrap resamples, as in the "
                                                    "configs; 0: none)")


@pytest.mark.parametrize("flags, message", [
    (["--beam-size", "100000"], ("--beam-size 100000: expected int >= 1 and <= 64 (the bound of beam sizes, as in "
                                 "the configs)")),
    (["--beam-size", "0"], "--beam-size 0: expected int >= 1 and <= 64 (the bound of beam sizes, as in the configs)"),
    (["--max-new-tokens", "1000000000"], ("--max-new-tokens 1000000000: expected int >= 1 and <= 512 (the bound of "
                                          "caption lengths in tokens, as in the configs)")),
    (["--min-length", "-1"], ("--min-length -1: expected int >= 0 and <= 512 (the bound of caption lengths in tokens, "
                              "as in the configs)")),
])
def test_caption_values_past_the_configs_bounds_are_one_line_before_any_model_loads(flags, message, tmp_path,
                                                                                     capsys):
    """Refused before the checkpoint (here a folder that does not exist) or the images are looked at."""
    out = tmp_path / "captions.json"
    assert pacs_cli.main(["caption", "--checkpoint", str(tmp_path / "no-model"), "--images", str(tmp_path / "none"),
                          "--out", str(out), *flags]) == 2
    assert one_error_line(capsys, "caption") == f"pacs caption: error: {message}"
    assert not out.exists()


def test_a_temperature_that_is_zero_in_float32_is_refused_at_load(tmp_path, capsys, monkeypatch):
    """1e-300 passed `PositiveFloat` and is 0 in float32 (a traceback at the first SCST step): the floor is 1e-4."""
    import torch

    from pacs.captioner.modeling.decoding import sample

    assert float(torch.tensor(1e-300, dtype=torch.float32)) == 0.0  # why a floor above 0
    monkeypatch.setenv("PACS_SHARED", str(tmp_path))
    runs = tmp_path / "runs"
    assert _train(Path("flickr8k_tiny"), f"run_dir={runs}", "scst.temperature=1e-300") == 2
    from pacs.metric.common.config_files import packaged_config

    assert one_error_line(capsys, "train") == (f"pacs train: error: {packaged_config('flickr8k_tiny')}: "
                                                "scst.temperature=1e-300: expected float >= 0.0001 (Input should be "
                                                "greater than or equal to 0.0001)")
    assert not runs.exists()
    kit = load_captioner_testkit()
    from pacs.captioner.modeling.checkpoints import load_captioner

    model, _, _ = load_captioner(kit.tiny_checkpoint(tmp_path))
    with pytest.raises(InputError, match=r"temperature must be >= 0.0001, got 1e-300"):
        sample(model, torch.zeros(1, 5, 16), k=2, temperature=1e-300)


# --- resume states: steps outside 0..max_steps ---------------------------------------------------------------------

def _reseal(checkpoint: Path) -> None:
    """Rewrite the checkpoint's manifest for its current files, as an attacker would (sizes and sha256 match)."""
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                         for p in sorted(checkpoint.iterdir()) if p.name != "manifest.json"}
    manifest_path.write_text(json.dumps(manifest))


def _set_step(state_file: Path, step: int) -> None:
    state = json.loads(state_file.read_text())
    state["step"] = step
    state_file.write_text(json.dumps(state))


def test_an_xe_resume_state_outside_0_to_max_steps_is_refused_naming_the_file(tmp_path):
    from pacs.captioner.modeling.train_xe import XEConfig, train_xe
    from pacs.captioner.modeling.training_setup import ScheduleConfig
    from pacs.captioner.modeling.vocab import build_vocab

    kit = load_captioner_testkit()
    cache, train, _ = kit.tiny_data(tmp_path)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(tmp_path / "xe"), max_steps=2, batch_size=16, micro_batch_size=16,
                      schedule=ScheduleConfig(warmup_steps=0, constant_until=2, decay_until=2, peak_lr=1e-3,
                                              final_lr=1e-3), eval_every=0, save_every=1, keep_checkpoints=5,
                      trackers=[])
    train_xe(config, kit.tiny_model_config(), vocab, cache, train, {})
    checkpoint = tmp_path / "xe" / "checkpoints" / "step-00000002"
    state_file = checkpoint / "trainer_state.json"
    final = tmp_path / "xe" / "final" / "model.safetensors"
    weights = final.read_bytes()
    longer = XEConfig(**{**config.__dict__, "max_steps": 3})
    for step in (10**12, -5, 4):
        _set_step(state_file, step)
        _reseal(checkpoint)  # past the manifest check: the step itself must be refused
        with pytest.raises(PacsError) as error:
            train_xe(longer, kit.tiny_model_config(), vocab, cache, train, {})
        assert str(error.value) == (f"{state_file}: step {step} is outside 0..3 (this run's 3 steps): the resume "
                                    "state was altered, or written by a run with more steps; remove it, or resume "
                                    "from another one")
        assert final.read_bytes() == weights  # nothing written
    _set_step(state_file, 2)
    _reseal(checkpoint)
    assert train_xe(longer, kit.tiny_model_config(), vocab, cache, train, {}).steps == 3  # control: 2 of 3 resumes


def _metric_manifest(folder: Path, n: int = 8) -> Path:
    """A manifest of `n` tiny image pairs (the last two for validation)."""
    from PIL import Image

    words = ["dog", "cat", "man", "woman", "red", "blue", "ball", "grass", "water"]
    (folder / "img").mkdir(parents=True)
    lines = []
    for i in range(n):
        Image.new("RGB", (16, 16), (i * 40, 0, 0)).save(folder / "img" / f"{i}.png")
        Image.new("RGB", (16, 16), (0, i * 40, 0)).save(folder / "img" / f"g{i}.png")
        lines.append(json.dumps({"image_id": str(i), "caption_id": str(i), "real_image": f"img/{i}.png",
                                 "caption": words[i], "gen_caption": words[i + 1], "gen_image": f"img/g{i}.png",
                                 "split": "val" if i >= n - 2 else "train"}))
    path = folder / "manifest.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _train_metric(manifest: Path, out: Path, *extra: str) -> int:
    return pacs_cli.main(["--log-level", "ERROR", "train-metric", "--manifest", str(manifest), "--output-dir",
                          str(out), "backbone=null", "random_init=true", "batch_size=2", "eval_every=1",
                          "log_every=0", *extra])


def test_a_metric_training_resume_step_past_max_steps_is_one_line(tmp_path, capsys):
    manifest = _metric_manifest(tmp_path / "data")
    assert _train_metric(manifest, tmp_path / "run", "max_steps=2", "save_every=2") == 0
    state = tmp_path / "run" / "state" / "step_00000002"
    out = tmp_path / "resumed"
    for step in (10**12, -5):
        _set_step(state / "trainer_state.json", step)
        capsys.readouterr()
        assert _train_metric(manifest, out, f"resume={state}", "max_steps=3") == 2
        assert one_error_line(capsys, "train-metric") == (
            f"pacs train-metric: error: {state / 'trainer_state.json'}: step {step} is outside 0..3 (this run's "
            "3 steps): the resume state was altered, or written by a run with more steps; remove it, or resume "
            "from another one")
        assert not (out / "checkpoint.safetensors").exists()
