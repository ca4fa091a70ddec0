"""Issue 41, hostile folders and files: transformers captioner folders, special files, report inputs, feature caches.

Each attack is run at smoke size and must be one line (`pacs CMD: error: ...`, exit 2) naming the folder or file
and the key, with nothing written: absurd config sizes (a million layers hung `pacs caption`), processor sizes,
token ids outside the vocabulary, NaN generation parameters, `max_time`, quantization methods whose package is
absent, eight malformed safetensors files, tokenizers that fail (regex errors, panics), a tokenizer.json linked
outside the folder, FIFOs where files are read, run files of the wrong JSON type and unbounded report inputs, and
NaN features (named by cache and image, not blamed on the learning rate).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_errors import one_error_line
from PIL import Image
from script_modules import load_captioner_testkit

from pacs import cli as pacs_cli
from pacs.metric.common.errors import InputError, NonFiniteError, TrainingDivergedError

TESTS = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs longer than `seconds`: the hang attacks."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s: the attack hangs")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def blip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BLIP captioner folder (built once; each test tampers with its own copy)."""
    from tests.captioner.hf_tiny import build_blip

    return build_blip(tmp_path_factory.mktemp("hf") / "blip")


@pytest.fixture
def folder(blip: Path, tmp_path: Path) -> Path:
    """This test's copy of the tiny BLIP folder."""
    return Path(shutil.copytree(blip, tmp_path / "model"))


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A folder of one image."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(tmp_path / "images" / "a.png")
    return tmp_path / "images"


def _caption(checkpoint: Path, images: Path, out: Path) -> int:
    """`pacs caption` of `images` with `checkpoint` (refused within 60 s, whatever the attack)."""
    with _deadline(60):
        return pacs_cli.main(["caption", "--checkpoint", str(checkpoint), "--images", str(images), "--out", str(out)])


def _edit_json(path: Path, edit: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text())
    replaced = edit(data)
    path.write_text(json.dumps(data if replaced is None else replaced))


def _refused(folder: Path, images: Path, capsys: pytest.CaptureFixture, *expected: str) -> str:
    out = folder.parent / "captions.json"
    assert _caption(folder, images, out) == 2
    line = one_error_line(capsys, among_other_lines=True, command="caption")
    assert str(folder) in line and all(text in line for text in expected), line
    assert not out.exists()
    return line


# --- transformers folders: config sizes, processor, generation config, quantization ----------------------------

CONFIG_ATTACKS = {
    # hung `pacs caption` (4.3 GB and growing) before the bounds
    "a million layers": (lambda c: c["text_config"].update(num_hidden_layers=1_000_000),
                         ("config.json text_config.num_hidden_layers = 1000000 is out of bounds: expected an integer "
                          "from 0 to 256")),
    "vocabulary 10^9": (lambda c: c["text_config"].update(vocab_size=10 ** 9),
                        "text_config.vocab_size = 1000000000 is out of bounds: expected an integer from 1 to 1048576"),
    "hidden 10^6": (lambda c: c["vision_config"].update(hidden_size=10 ** 6),
                    "vision_config.hidden_size = 1000000 is out of bounds: expected an integer from 1 to 32768"),
    "image 10^5, patch 1": (lambda c: c["vision_config"].update(image_size=10 ** 5, patch_size=1),
                            "vision_config.image_size = 100000 is out of bounds: expected an integer from 1 to 16384"),
    "image of 2^24 patches": (lambda c: c["vision_config"].update(image_size=4096, patch_size=1),
                              ("vision_config.image_size = 4096 with vision_config.patch_size = 1 is 16777216 "
                               "patches, above the bound of 65536")),
    "vocabulary -5": (lambda c: c["text_config"].update(vocab_size=-5),
                      "text_config.vocab_size = -5 is out of bounds: expected an integer from 1 to 1048576"),
    "layers as text": (lambda c: c["text_config"].update(num_hidden_layers="2"),
                       "text_config.num_hidden_layers = '2' is out of bounds: expected an integer"),
    "pad token outside the vocabulary": (lambda c: c["text_config"].update(pad_token_id=10 ** 9),
                                         ("config.json text_config pad_token_id = 1000000000 is outside the "
                                          "vocabulary of 19 tokens")),
}


@pytest.mark.parametrize("attack", list(CONFIG_ATTACKS))
def test_absurd_config_sizes_are_refused_before_a_model_is_built(attack, folder, images, capsys):
    edit, message = CONFIG_ATTACKS[attack]
    _edit_json(folder / "config.json", edit)
    _refused(folder, images, capsys, message)


@pytest.mark.parametrize("method, package", [("bitsandbytes", "bitsandbytes"), ("gptq", "gptqmodel")])
def test_a_quantization_needing_an_absent_package_is_one_line(method, package, folder, images, capsys):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    _edit_json(folder / "config.json", lambda c: c.update(quantization_config={"quant_method": method, "bits": 4}))
    _refused(folder, images, capsys, f"quantization_config.quant_method = {method!r} needs the package",
             package, "not installed")


FILE_ATTACKS = {
    "processor resize 100000": ("processor_config.json",
                                lambda c: c["image_processor"].update(size={"height": 100000, "width": 100000}),
                                ("processor_config.json image_processor.size.height = 100000 is out of bounds: "
                                 "expected an integer from 1 to 16384")),
    "processor config a list": ("processor_config.json", lambda c: [c],
                                "processor_config.json must be a JSON object, not an array"),
    "generation pad token 10^9": ("generation_config.json", lambda c: c.update(pad_token_id=10 ** 9),
                                  ("generation_config.json pad_token_id = 1000000000 is outside the vocabulary of 19 "
                                   "tokens (0 to 18)")),
    "repetition penalty NaN": ("generation_config.json", lambda c: c.update(repetition_penalty=float("nan")),
                               "generation_config.json repetition_penalty = nan is not a finite number"),
    "max_time cuts captions": ("generation_config.json", lambda c: c.update(max_time=0.5),
                               "generation_config.json sets max_time = 0.5", "cut captions short"),
    "several captions per image": ("generation_config.json", lambda c: c.update(num_return_sequences=3),
                                   "generation_config.json num_return_sequences = 3"),
    "tokenizer config a list": ("tokenizer_config.json", lambda c: [c],
                                "tokenizer_config.json must be a JSON object, not an array"),
}


@pytest.mark.parametrize("attack", list(FILE_ATTACKS))
def test_processor_and_generation_files_are_checked(attack, folder, images, capsys):
    name, edit, *messages = FILE_ATTACKS[attack]
    _edit_json(folder / name, edit)
    _refused(folder, images, capsys, *messages)


# --- transformers folders: safetensors headers parsed before safetensors reads them ----------------------------

def _safetensors(header: dict | bytes, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _f32(offsets: list[int], shape: list[int]) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": offsets}


SAFETENSORS_ATTACKS = {
    "header length 2^60": (lambda real: struct.pack("<Q", 2 ** 60) + b"{}",
                           "its header length 1152921504606846976 is above the bound of 100000000 bytes"),
    "offsets out of bounds": (lambda real: _safetensors({"w": _f32([0, 1000], [250])}, bytes(8)),
                              "tensor 'w': data_offsets [0, 1000] are outside the 8 data bytes"),
    "overlapping offsets": (lambda real: _safetensors({"a": _f32([0, 8], [2]), "b": _f32([4, 12], [2])}, bytes(12)),
                            "tensor 'b' starts at byte 4 of the data, expected 8 (offsets overlap"),
    "truncated": (lambda real: real[:-100], "data bytes (truncated, or offsets past the end)"),
    "bytes left over": (lambda real: real + bytes(16), "bytes (truncated, or bytes left over)"),
    "shape 10^9 x 10^9": (lambda real: _safetensors({"w": _f32([0, 8], [10 ** 9, 10 ** 9])}, bytes(8)),
                          "shape [1000000000, 1000000000] of F32 is 4e+18 bytes, its data_offsets span 8"),
    "bad header JSON": (lambda real: _safetensors(b"{not json", bytes(8)), "its header is not JSON"),
    "empty file": (lambda real: b"", "0 bytes, shorter than the 8-byte header length"),
    "deep header": (lambda real: _safetensors(b"[" * 100_000 + b"]" * 100_000), "its header is not JSON"),
    "unknown dtype": (lambda real: _safetensors({"w": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}},
                                                bytes(8)), "tensor 'w': unknown dtype 'F99'"),
}


@pytest.mark.parametrize("attack", list(SAFETENSORS_ATTACKS))
def test_malformed_safetensors_are_one_line_naming_the_file(attack, folder, images, capsys):
    make, message = SAFETENSORS_ATTACKS[attack]
    weights = folder / "model.safetensors"
    weights.write_bytes(make(weights.read_bytes()))
    _refused(folder, images, capsys, "model.safetensors is not a valid safetensors file: ", message)


def test_a_sharded_index_names_only_files_of_the_folder(folder, images, capsys):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../outside.safetensors"}}))
    _refused(folder, images, capsys, "model.safetensors.index.json weight_map['w'] = '../outside.safetensors' is not "
                                     "a file name of the folder")


# --- transformers folders: tokenizers and the files themselves -------------------------------------------------

def test_a_tokenizer_regex_error_is_one_line(folder, images, capsys):
    _edit_json(folder / "tokenizer.json", lambda t: t.update(pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated", "invert": False}))
    _refused(folder, images, capsys, "its tokenizer tokenizer.json does not load: Oniguruma error")


def test_a_tokenizer_that_panics_is_one_line_before_the_model_is_built(folder, images, capsys, monkeypatch):
    import transformers

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", no_model)
    template = {"type": "TemplateProcessing", "special_tokens": {},
                "single": [{"SpecialToken": {"id": "[MISSING]", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}]}
    _edit_json(folder / "tokenizer.json", lambda t: t.update(post_processor=template))
    # a generic fast tokenizer runs tokenizer.json as it is (a BertTokenizer rebuilds its own post-processor)
    _edit_json(folder / "tokenizer_config.json", lambda t: t.update(tokenizer_class="PreTrainedTokenizerFast"))
    _refused(folder, images, capsys, "its tokenizer fails on a short sentence (a panic in the tokenizers library)")


def test_a_tokenizer_linked_outside_the_folder_is_refused(folder, images, capsys):
    outside = folder.parent / "elsewhere.json"
    (folder / "tokenizer.json").rename(outside)
    (folder / "tokenizer.json").symlink_to(outside)
    _refused(folder, images, capsys, "tokenizer.json is a symbolic link that leads outside the folder")


def test_a_link_inside_a_hub_snapshot_may_point_into_its_blobs(blip, tmp_path):
    from pacs.captioner.modeling.hf_captioning import check_folder

    snapshot = tmp_path / "models--x--blip" / "snapshots" / "abc"
    (tmp_path / "models--x--blip" / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in blip.iterdir():
        blob = tmp_path / "models--x--blip" / "blobs" / path.name
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", path.name))
    assert check_folder(snapshot, None) == ("blip", "AutoModelForImageTextToText")


def test_a_fifo_in_a_transformers_folder_is_refused(folder, images, capsys):
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")
    _refused(folder, images, capsys, "tokenizer.json is not a regular file (a FIFO")


def test_the_checks_pass_a_good_folder_through(blip):
    from pacs.captioner.modeling.hf_captioning import check_folder

    assert check_folder(blip, None) == ("blip", "AutoModelForImageTextToText")


# --- pacs captioner folders: the feature source of captioner.json ----------------------------------------------

@pytest.fixture
def captioner(tmp_path: Path) -> Path:
    """A tiny pacs captioner folder (model.safetensors + captioner.json)."""
    return load_captioner_testkit().tiny_checkpoint(tmp_path / "kit")


def test_a_fifo_feature_checkpoint_in_captioner_json_is_one_line(captioner, images, tmp_path, capsys):
    fifo = tmp_path / "weights.safetensors"
    os.mkfifo(fifo)  # reading it blocked `pacs caption` forever
    _edit_json(captioner / "captioner.json", lambda info: info["features"].update(checkpoint=str(fifo)))
    assert _caption(captioner, images, tmp_path / "out.json") == 2
    line = one_error_line(capsys, among_other_lines=True, command="caption")
    assert f"{captioner / 'captioner.json'}: features.checkpoint {fifo} is a FIFO (named pipe), not a regular " \
           "file" in line, line
    assert not (tmp_path / "out.json").exists()


def test_a_feature_checkpoint_of_the_wrong_type_is_one_line(captioner, images, tmp_path, capsys):
    _edit_json(captioner / "captioner.json", lambda info: info["features"].update(checkpoint=5))
    assert _caption(captioner, images, tmp_path / "out.json") == 2
    line = one_error_line(capsys, among_other_lines=True, command="caption")
    assert f"{captioner / 'captioner.json'}: features.checkpoint must be a string, not 5" in line, line


def test_load_backbone_refuses_a_fifo_checkpoint(tmp_path):
    from pacs.metric.models.factory import load_backbone

    os.mkfifo(tmp_path / "clip.pt")
    with _deadline(60), pytest.raises(InputError, match="is a FIFO"):
        load_backbone(checkpoint=str(tmp_path / "clip.pt"))


def test_a_fifo_planted_as_a_feature_shard_is_one_line(tmp_path):
    from pacs.captioner.modeling.features import FeatureCache

    load_captioner_testkit().tiny_data(tmp_path)
    shard = next((tmp_path / "feats" / "shards").glob("shard-*.safetensors"))
    shard.unlink()
    os.mkfifo(shard)
    with _deadline(60), pytest.raises(InputError, match="is unreadable \\(not a regular file") as error:
        FeatureCache(tmp_path / "feats")
    assert str(shard) in str(error.value)


# --- feature caches: NaN / inf is named by cache and image -----------------------------------------------------

def _poisoned_cache(tmp_path: Path, image_ids: list[str], value: float):
    """The tiny data's features with `value` in those of `image_ids`; (cache, train pairs, val references)."""
    from pacs.captioner.modeling.features import write_feature_cache

    cache, train, val = load_captioner_testkit().tiny_data(tmp_path)
    features = {i: cache.get([i])[0] for i in cache.ids()}
    for image_id in image_ids:
        features[image_id][0, 0] = value
    return write_feature_cache(features, tmp_path / "poisoned"), train, val


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_feature_is_named_by_cache_and_image(value, tmp_path):
    cache, _, _ = _poisoned_cache(tmp_path, ["img3"], value)
    assert cache.get(["img1"]).shape[0] == 1  # the other images still read
    with pytest.raises(NonFiniteError) as error:
        cache.get(["img1", "img3"])
    assert f"feature cache {tmp_path / 'poisoned'}: the features of image id 'img3'" in str(error.value)
    assert "NaN or infinite" in str(error.value)


def test_xe_on_a_poisoned_cache_names_the_image_instead_of_blaming_the_learning_rate(tmp_path):
    from pacs.captioner.modeling.train_xe import XEConfig, train_xe
    from pacs.captioner.modeling.vocab import build_vocab

    cache, train, val = _poisoned_cache(tmp_path, [f"img{i}" for i in range(40)], float("nan"))
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(tmp_path / "xe"), max_steps=4, batch_size=16, micro_batch_size=8, eval_every=0,
                      val_beam_size=1, val_max_images=2, save_every=0, log_every=1, trackers=[])
    with pytest.raises(NonFiniteError, match=r"poisoned: the features of image id 'img\d+'") as error:
        train_xe(config, load_captioner_testkit().tiny_model_config(), vocab, cache, train, val)
    assert not isinstance(error.value, TrainingDivergedError) and "learning rate" not in str(error.value)
    assert not (tmp_path / "xe" / "final").exists()


# --- pacs report: wrong JSON types and bounded inputs ----------------------------------------------------------

def _run(tmp_path: Path, files: dict[str, object]) -> Path:
    """A run directory with a one-row results table and `files` ({relative path: JSON value or CSV text})."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"columns": ["C"], "rows": [{"model": "xe", "C": 1.0}]}))
    for name, content in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return run


def _gallery(info: dict) -> list:
    return [{"image_id": "a", "references": ["a red square"], "captions": {"xe": {"caption": "a red square", **info}}}]


ROWS = [{"model": "xe", "C": 1.0}]
REPORT_ATTACKS = {
    "columns 5": ("results.json", {"columns": 5, "rows": ROWS},
                  "results.json: columns must be a list of column names (strings), not a number"),
    "columns [1, null]": ("results.json", {"columns": [1, None], "rows": ROWS},
                          ("results.json: columns must be a list of column names (strings), not a list holding a "
                           "number, null")),
    "delta [1, 2]": ("results.json", {"rows": [{"model": "xe", "C": 1.0, "delta": [1, 2]}]},
                     "results.json: rows[0] (model 'xe'): delta must be an object {column: ...}, not a list"),
    "ci not a pair": ("results.json", {"rows": [{"model": "sc", "C": 1.0, "ci": {"C": 0.5}}]},
                      "results.json: rows[0] (model 'sc'): ci['C'] must be [low, high] (numbers), not 0.5"),
    "seeds 5": ("results.json", {"rows": ROWS, "seeds": 5}, "results.json: seeds must be a list, not a number"),
    "correlation a list": ("correlation/correlation.json", [1, 2],
                           ("correlation.json: expected an object {metric: {'tau_b': ..., 'tau_c': ..., 'n': ...}}, "
                            "not a list")),
    "highlights 5": ("gallery.json", _gallery({"highlights": 5}),
                     ("gallery.json: entry #0 (image id 'a'): captions['xe'].highlights must be a list of [start, end, "
                      "kind] spans, not a number")),
    "highlights [[0, 1]]": ("gallery.json", _gallery({"highlights": [[0, 1]]}),
                            ("captions['xe'].highlights[0] must be [start, end, kind] (two integers and a string), not "
                             "[0, 1]")),
    "scores a list": ("gallery.json", _gallery({"scores": [1, 2]}),
                      "captions['xe'].scores must be an object {metric: value}, not a list"),
}


@pytest.mark.parametrize("attack", list(REPORT_ATTACKS))
def test_report_files_of_the_wrong_json_type_are_one_line(attack, tmp_path, capsys):
    name, content, message = REPORT_ATTACKS[attack]
    run = _run(tmp_path, {name: content})
    assert pacs_cli.main(["report", str(run)]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="report")
    assert str(run / name) in line and message in line, line
    assert not (run / "report.html").exists()


def _csv(columns: int, rows: int = 3) -> str:
    header = ["step", *(f"c{i}" for i in range(columns - 1))]
    return "\n".join([",".join(header)] + [",".join(str(r * (c + 1)) for c in range(columns))
                                           for r in range(rows)]) + "\n"


def test_report_refuses_a_csv_of_900_columns_at_once(tmp_path, capsys):
    run = _run(tmp_path, {"logs/xe.csv": _csv(900)})  # 250 s and 1.3 GB before the bound
    with _deadline(60):
        assert pacs_cli.main(["report", str(run)]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="report")
    assert f"{run / 'logs' / 'xe.csv'}: 900 columns, above the 64 the report reads" in line, line
    assert not (run / "report.html").exists()


@pytest.mark.parametrize("bound, value, files, message", [
    ("MAX_INPUT_BYTES", 1000, {"logs/xe.csv": _csv(4, 200)}, ("logs/xe.csv: {size} bytes, above the 1000 bytes the "
                                                              "report reads from one file")),
    ("MAX_CSV_ROWS", 10, {"logs/xe.csv": _csv(4, 11)}, "logs/xe.csv: more than 10 rows"),
    ("MAX_PLOT_PANELS", 2, {"logs/xe.csv": _csv(2), "logs/scst.csv": _csv(2), "logs/kl.csv": _csv(2)},
     "its training curves make 3 plot panels, above the 2 the report draws"),
    ("MAX_TOTAL_BYTES", 100, {"gallery.json": _gallery({})}, "the report's input files and gallery images are"),
])
def test_report_bounds_what_it_reads(bound, value, files, message, tmp_path, capsys, monkeypatch):
    from pacs.eval import report_inputs

    monkeypatch.setattr(report_inputs, bound, value)
    run = _run(tmp_path, files)
    assert pacs_cli.main(["report", str(run)]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="report")
    size = (run / "logs" / "xe.csv").stat().st_size if (run / "logs" / "xe.csv").exists() else 0
    assert message.format(size=size) in line, line
    assert not (run / "report.html").exists()


def test_a_report_within_the_bounds_is_written(tmp_path, capsys):
    run = _run(tmp_path, {"logs/xe.csv": _csv(3), "gallery.json": _gallery({"highlights": [[0, 1, "absent"]],
                                                                             "scores": {"C": 1.0}})})
    assert pacs_cli.main(["report", str(run)]) == 0, capsys.readouterr().err
    assert '<mark class="hl-absent">a</mark>' in (run / "report.html").read_text()
