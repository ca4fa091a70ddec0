"""One CLI: `pacs --version`, `--out` on every command that writes a file (`--json` a deprecated alias), the default
w stated next to the official scripts' value, and docs/cli.md's ✓ `score-video` example run as written."""
from __future__ import annotations

import json
import shlex
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pacs import cli as pacs_cli

ROOT = Path(__file__).resolve().parents[1]
#: every sub-command that writes a file the user names
WRITERS = ("score", "score-video", "correlate", "evaluate", "caption", "export", "report")
#: the w of the official PAC-S / PAC-S++ evaluation scripts (their scoring function's w, for every checkpoint)
OFFICIAL_SCRIPTS_W = 2.0


def _commands() -> dict:
    """The sub-parsers of `pacs`, by name."""
    parser = pacs_cli.build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return action.choices


def _flat(text: str) -> str:
    """`text` with every run of whitespace one space (argparse wraps help at the terminal width)."""
    return " ".join(text.split())


def test_version_prints_the_installed_distribution_version(capsys):
    with pytest.raises(SystemExit) as done:
        pacs_cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"pacs-captioning {metadata.version('pacs-captioning')}"


def test_every_command_that_writes_a_file_takes_out_and_json_is_only_its_alias():
    commands = _commands()
    for name in WRITERS:
        assert "--out" in commands[name]._option_string_actions, name
    for name, command in commands.items():
        options = command._option_string_actions
        if "--json" in options:  # correlate and evaluate: the 0.5 flag, the same option as --out
            assert options["--json"] is options["--out"], name
    assert {name for name, command in commands.items() if "--json" in command._option_string_actions} == {
        "correlate", "evaluate"}


def test_correlate_parses_out_and_json_alike_and_only_json_prints_a_notice(capsys):
    parser = pacs_cli.build_parser()
    base = ["correlate", "flickr8k-expert", "--data", "d", "--metrics", "bleu1"]
    with_out = parser.parse_args([*base, "--out", "table.json"])
    assert capsys.readouterr().err == ""
    with_json = parser.parse_args([*base, "--json", "table.json"])
    assert with_out.json == with_json.json == "table.json"
    assert capsys.readouterr().err.splitlines() == [
        "pacs correlate: --json is deprecated, use --out (the same file is written)"]


def test_evaluate_writes_the_same_table_with_out_and_with_the_deprecated_json(tmp_path, capsys):
    candidates, references = tmp_path / "c.json", tmp_path / "r.json"
    candidates.write_text(json.dumps({"1": "a dog runs on the grass", "2": "two cats"}))
    references.write_text(json.dumps({"1": ["a dog runs", "a dog"], "2": ["two cats sleep", "cats"]}))
    common = ["evaluate", "--candidates", str(candidates), "--references", str(references), "--metrics", "length"]
    assert pacs_cli.main([*common, "--out", str(tmp_path / "out.json")]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert pacs_cli.main([*common, "--json", str(tmp_path / "json.json")]) == 0
    err = capsys.readouterr().err
    assert err.count("deprecated") == 1 and "pacs evaluate: --json is deprecated, use --out" in err
    new, old = (json.loads((tmp_path / name).read_text()) for name in ("out.json", "json.json"))
    assert new["metrics"] == old["metrics"] == {"length": (6 + 2) / 2}  # words per caption, by hand
    assert new["n"] == old["n"] == 2


def test_w_help_states_each_default_with_the_official_scripts_value():
    from pacs.metric.scoring.registry import METRICS, PAC_S_PLUS_PLUS_W_LARGE

    commands = _commands()
    for name in ("score", "correlate", "evaluate"):  # the shared model options
        text = _flat(commands[name].format_help())
        assert f"clip-s {METRICS['clip-s'].default_w}" in text, name
        assert f"pac-s {METRICS['pac-s'].default_w} (as the paper and the official scripts)" in text, name
        assert (f"pac-s++ {METRICS['pac-s++'].default_w} for ViT-B/32 and {PAC_S_PLUS_PLUS_W_LARGE} for ViT-L/14 "
                f"(as the paper; the official evaluation scripts use {OFFICIAL_SCRIPTS_W}") in text, name
    assert "score weight w (default 1:" in _flat(commands["score-video"].format_help())
    metric_doc = _flat((ROOT / "docs" / "metric.md").read_text(encoding="utf-8"))
    assert (f"the official PAC-S / PAC-S++ evaluation scripts use {OFFICIAL_SCRIPTS_W} for both, so `--w "
            f"{OFFICIAL_SCRIPTS_W}` reproduces their numbers") in metric_doc
    cli_page = _flat((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert (f"while the official PAC-S / PAC-S++ evaluation scripts use {OFFICIAL_SCRIPTS_W} for both (`--w "
            f"{OFFICIAL_SCRIPTS_W}` reproduces their numbers)") in cli_page


def _readme_command(marker: str) -> list[str]:
    """The command line of docs/cli.md (backslash continuations joined) that ends with the comment `marker`."""
    lines = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").splitlines()
    (end,) = [i for i, line in enumerate(lines) if line.rstrip().endswith(marker)]
    start = end
    while lines[start - 1].rstrip().endswith("\\"):
        start -= 1
    command = " ".join(line.rstrip().removesuffix("\\") for line in lines[start:end + 1])
    return shlex.split(command.split("#")[0])


def test_the_readme_score_video_example_runs_as_marked(shared, tmp_path, monkeypatch, capsys):
    argv = [arg.replace("$PACS_SHARED", str(shared)) for arg in _readme_command("# ✓ on frame folders")]
    assert argv[:2] == ["pacs", "score-video"] and "--checkpoint" in argv
    rng = np.random.default_rng(0)
    for video in ("v1", "v2"):  # frame folders: three frames each
        (tmp_path / "videos" / video).mkdir(parents=True)
        for frame in range(3):
            pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "videos" / video / f"{frame:03d}.png")
    (tmp_path / "vcaps.json").write_text(json.dumps({"v1": "a red stripe moves", "v2": "a blue square"}))
    (tmp_path / "vrefs.json").write_text(json.dumps({"v1": ["a red stripe", "stripes"], "v2": ["a blue box"]}))
    monkeypatch.chdir(tmp_path)
    assert pacs_cli.main(argv[1:]) == 0
    result = json.loads((tmp_path / argv[argv.index("--out") + 1]).read_text())
    assert result["metric"] == "ref-pac-s++" and result["w"] == 1.0 and result["n_videos"] == 2
    assert [row["video_id"] for row in result["per_instance"]] == ["v1", "v2"]
    for row in result["per_instance"]:  # PAC-S++ Eqs. 13-14 with w = 1
        assert row["video_score"] == pytest.approx((row["coarse"] + row["fine"]) / 2, abs=1e-6)
        assert row["score"] == pytest.approx((row["video_score"] + row["ref_term"]) / 2, abs=1e-6)
    assert "ref-pac-s++ video (w=1" in capsys.readouterr().out
