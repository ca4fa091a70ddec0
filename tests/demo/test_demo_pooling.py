"""tools/pool_seeds.py / `pacs.captioner.demo.pooling`: the seeds of several finished demo runs evaluated as one run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from script_modules import load_tool

from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.demo.pipeline import REPO_CONFIGS, load_demo_config, run_demo
from pacs.captioner.demo.pooling import SeedSource, check_same_experiment, parse_source
from pacs.metric.common.errors import InputError
from pacs.metric.common.run_lock import RunDirectoryLock


@pytest.fixture(scope="module")
def tool():
    """tools/pool_seeds.py as a module."""
    return load_tool("pool_seeds")


@pytest.mark.parametrize(("text", "expected"), [
    ("runs/demo", SeedSource(Path("runs/demo"))),
    ("runs/demo:3,4,5", SeedSource(Path("runs/demo"), (3, 4, 5))),
    ("runs/demo:0", SeedSource(Path("runs/demo"), (0,))),
    ("runs/a:b", SeedSource(Path("runs/a:b"))),  # no seed list after the last ':': all of it is the folder
])
def test_a_source_is_a_run_folder_and_optionally_its_seeds(text: str, expected: SeedSource) -> None:
    assert parse_source(text) == expected


def test_a_bad_seed_list_is_one_error_naming_it() -> None:
    with pytest.raises(InputError, match=r"'runs/demo:1,,2': expected RUN or RUN:S,S,\.\.\. with integer seeds"):
        parse_source("runs/demo:1,,2")


def test_runs_may_differ_in_where_and_how_they_ran_but_not_in_what_they_trained() -> None:
    base = load_demo_config(REPO_CONFIGS / "demo_smoke.yaml", [])
    moved = load_demo_config(REPO_CONFIGS / "demo_smoke.yaml", ["name=other", "seeds=[5]", "threads=2",
                                                                  "parallel_seeds=1"])
    check_same_experiment({Path("a"): base, Path("b"): moved})  # no error
    retuned = load_demo_config(REPO_CONFIGS / "demo_smoke.yaml", ["xe.schedule.peak_lr=0.002"])
    with pytest.raises(InputError, match=r"^b: setting xe\.schedule\.peak_lr differs from a \(only run_dir, name, runs_dir, seeds"):
        check_same_experiment({Path("a"): base, Path("b"): retuned})
    assert isinstance(retuned, DemoConfig)


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


@pytest.mark.slow
def test_pooled_seeds_of_two_runs_give_the_table_and_findings_of_one_run_of_those_seeds(tmp_path: Path, tool,
                                                                                           capsys) -> None:
    run_demo(str(REPO_CONFIGS / "demo_smoke.yaml"), [f"runs_dir={tmp_path}", "threads=1"])
    native = tmp_path / "demo_smoke"
    copy = tmp_path / "copy"  # a copy of the run: the same metric stages, its seed 1 taken from here
    shutil.copytree(native, copy)
    capsys.readouterr()

    out = tmp_path / "pooled"
    assert tool.main([f"{native}:0", f"{copy}:1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    pooled, expected = _results(out), _results(native)
    # the same models and the evaluate stage's code: every row, interval, per-seed row and finding of the run
    # that trained both seeds, exactly (same floats: same batches, one thread)
    for key in ("rows", "seed_rows", "per_seed", "reward_gains", "share_of_oracle", "findings", "replication",
                "versus_human", "guarded", "seeds"):
        assert pooled[key] == expected[key], key
    assert json.loads((out / "pooled.json").read_text())["seeds"] == {"0": str(native), "1": str(copy)}
    assert printed.startswith((out / "results.md").read_text()[:200])
    assert not list(native.glob("**/pooled.json"))  # nothing written into a source run

    def refused(args: list[str], message: str, target: Path) -> None:
        existed = target.exists()
        assert tool.main([*args, "--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
        assert target.exists() == existed and not list(tmp_path.glob(f".{target.name}.*"))  # no partial output

    refused([f"{native}:0", f"{copy}:0"], f"seed 0 is taken from both {native} and {copy}", tmp_path / "twice")
    refused([f"{native}:7"], f"{native}: has no seed 7 (its seeds: [0, 1])", tmp_path / "seven")
    refused([f"{native}:0", f"{native}/:1"], "a run is named twice; take several seeds from it as RUN:S,S,...",
            tmp_path / "same")
    lock = RunDirectoryLock(copy)  # a run training in a source: its seeds are not read meanwhile
    lock.acquire()
    refused([f"{native}:0", f"{copy}:1"], f"run directory {copy} is in use by", tmp_path / "busy")
    lock.release()
    refused([str(native)], f"{out}: exists", out)
    assert _results(out) == pooled  # the earlier pooling is kept as it was
    # a seed's model changed after its stage finished: named, and nothing pooled
    model = copy / "seed-1" / "xe" / "best" / "model.safetensors"
    original = model.read_bytes()
    model.write_bytes(original + b"\0")
    refused([f"{native}:0", f"{copy}:1"], f"{copy / 'seed-1' / 'xe'}: changed since its stage finished",
            tmp_path / "tampered")
    model.write_bytes(original)
    # other metric weights (another machine's rounding): the seeds were not trained or scored alike
    checkpoint = copy / "pacs" / "checkpoint.safetensors"
    weights = load_file(checkpoint)
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-6
    save_file(weights, checkpoint)
    refused([f"{native}:0", f"{copy}:1"], f"{checkpoint}: not the weights of {native / 'pacs'}", tmp_path / "metric")


@pytest.mark.slow
def test_a_transformers_captioner_runs_seeds_pool_alike(tmp_path: Path, tool, capsys) -> None:
    run_demo(str(REPO_CONFIGS / "demo_hf_smoke.yaml"), [f"runs_dir={tmp_path}"])
    native = tmp_path / load_demo_config(REPO_CONFIGS / "demo_hf_smoke.yaml", []).run_path().name
    copy = tmp_path / "copy"
    shutil.copytree(native, copy)
    out = tmp_path / "pooled"
    assert tool.main([f"{native}:0", f"{copy}:1", "--out", str(out)]) == 0
    pooled, expected = _results(out), _results(native)
    for key in ("rows", "seed_rows", "per_seed", "findings", "replication", "guarded", "seeds"):
        assert pooled[key] == expected[key], key
