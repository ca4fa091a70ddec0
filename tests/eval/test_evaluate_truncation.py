"""`pacs evaluate` records the score convention and long-caption mode, and counts truncated captions per system.

Systems are real Flickr8k captions of a few on-disk images; the model is the tiny transformers CLIP folder of
`tests/backbone_fixtures.py` (text context 24 tokens: a two-word caption fits, a long one does not). The expected
counts come from the folder's own tokenizer (transformers' `AutoTokenizer`, nothing cut), never from pacs.
"""
from __future__ import annotations

import collections
import json

import pytest

from pacs import cli as pacs_cli

PROMPT = "A photo depicts "
N_IMAGES = 4


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> str:
    """A tiny transformers CLIP folder (context 24)."""
    from backbone_fixtures import tiny_transformers_clip

    return tiny_transformers_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def siglip(tmp_path_factory) -> str:
    """A tiny open_clip SigLIP-style `local-dir` folder."""
    from backbone_fixtures import tiny_open_clip_siglip

    return tiny_open_clip_siglip(tmp_path_factory.mktemp("siglip"))


@pytest.fixture(scope="module")
def systems(shared_data, tmp_path_factory) -> dict:
    """refs.json and two systems: `long` (the longest caption of half the images, two words for the others) and
    `short` (two words of each image's first caption)."""
    source = shared_data / "flickr8k"
    refs: dict[str, list[str]] = collections.OrderedDict()
    for line in (source / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, caption = line.split("\t")
        refs.setdefault(key.split("#")[0], []).append(caption)
    on_disk = sorted(path.name for path in (source / "images").iterdir())
    images = [image for image in on_disk if image in refs][:N_IMAGES]
    folder = tmp_path_factory.mktemp("systems")
    short = {i: " ".join(refs[i][0].split()[:2]) for i in images}
    long = {i: max(refs[i], key=len) if n % 2 == 0 else short[i] for n, i in enumerate(images)}
    (folder / "refs.json").write_text(json.dumps({i: refs[i][1:] for i in images}))
    (folder / "long.json").write_text(json.dumps(long))
    (folder / "short.json").write_text(json.dumps(short))
    return {"dir": folder, "images": source / "images", "long": long, "short": short}


def _too_long(folder: str, captions: dict[str, str]) -> int:
    """Captions whose prompted tokens (start and end tokens included, nothing cut) exceed the text context."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    context = AutoConfig.from_pretrained(folder, local_files_only=True).text_config.max_position_embeddings
    return sum(len(tokenizer(PROMPT + caption)["input_ids"]) > context for caption in captions.values())


def _evaluate(systems: dict, *argv) -> int:
    return pacs_cli.main(["evaluate", "--references", str(systems["dir"] / "refs.json"), "--images",
                          str(systems["images"]), *map(str, argv)])


def test_table_counts_truncated_captions_per_system_and_notes_them_in_the_header(systems, clip, capsys):
    folder = systems["dir"]
    out = folder / "table.json"
    assert _evaluate(systems, "--candidates", f"long={folder / 'long.json'}", f"short={folder / 'short.json'}",
                     "--metrics", "clip-s,ref-clip-s,length", "--checkpoint", clip, "--bootstrap", "0",
                     "--out", out) == 0
    printed = capsys.readouterr().out
    table = json.loads(out.read_text())
    expected = {name: _too_long(clip, systems[name]) for name in ("long", "short")}
    assert expected == {"long": N_IMAGES // 2, "short": 0}  # the check below tells the systems apart
    for row in table["rows"]:
        assert row["truncated_captions"] == {"clip-s": expected[row["system"]], "ref-clip-s": expected[row["system"]]}
    note = (f"captions cut to the text context (long_captions=truncate): long: clip-s {expected['long']}, "
            f"ref-clip-s {expected['long']}")
    assert note in table["header"] and note in printed.splitlines()[0]
    config = table["provenance"]["config"]
    assert (config["score"], config["long_captions"]) == ("cosine", "truncate")

    # every row equals a run of that system alone, its truncation count included
    for row in table["rows"]:
        single = folder / f"single-{row['system']}.json"
        assert _evaluate(systems, "--candidates", folder / f"{row['system']}.json", "--metrics",
                         "clip-s,ref-clip-s,length", "--checkpoint", clip, "--out", single) == 0
        alone = json.loads(single.read_text())
        # bit-equal: a table embeds each system's captions in fresh batches, as a run of it alone does
        assert alone["metrics"] == row["values"]
        assert alone["truncated_captions"] == row["truncated_captions"]
        assert (alone["provenance"]["config"]["score"], alone["provenance"]["config"]["long_captions"]) == (
            "cosine", "truncate")
    printed = capsys.readouterr().out
    assert f"clip-s: {expected['long']} of {N_IMAGES} captions cut to the text context" in printed
    assert printed.count("cut to the text context") == 2  # clip-s and ref-clip-s of `long`; nothing for `short`


def test_no_note_when_nothing_is_cut_and_sigmoid_chunk_are_recorded(systems, siglip, capsys):
    folder = systems["dir"]
    out = folder / "clip.json"
    assert _evaluate(systems, "--candidates", f"short={folder / 'short.json'}", f"long={folder / 'long.json'}",
                     "--metrics", "clip-s", "--backbone", "tiny-random", "--bootstrap", "0", "--out", out) == 0
    table = json.loads(out.read_text())  # a 77-token context: no Flickr8k caption is cut
    assert [row["truncated_captions"] for row in table["rows"]] == [{"clip-s": 0}, {"clip-s": 0}]
    assert "text context" not in table["header"]
    out = folder / "sigmoid.json"
    assert _evaluate(systems, "--candidates", f"long={folder / 'long.json'}", f"short={folder / 'short.json'}",
                     "--metrics", "clip-s", "--checkpoint", siglip, "--score", "sigmoid", "--long-captions", "chunk",
                     "--bootstrap", "0", "--out", out) == 0
    config = json.loads(out.read_text())["provenance"]["config"]
    assert (config["score"], config["long_captions"]) == ("sigmoid", "chunk")


def test_a_bad_score_is_refused_before_any_work(systems, tmp_path, capsys):
    out = tmp_path / "table.json"
    with pytest.raises(SystemExit) as exit_code:
        _evaluate(systems, "--candidates", f"short={systems['dir'] / 'short.json'}", "--metrics", "length",
                  "--score", "cos", "--out", out)
    assert exit_code.value.code == 2 and not out.exists()
