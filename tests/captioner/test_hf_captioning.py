"""`pacs caption` with transformers image-to-text folders (issue 26, item 4): tiny random BLIP and GIT models.

The expected captions are computed here the way each model's documentation does it (the processor, the model's
own `generate`, `batch_decode`, all images in one batch), and the echoed prompt is cut off the decoded text by
hand; `pacs caption` must write exactly those captions, for any batch size.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from PIL import Image

WORDS = ["a", "an", "the", "dog", "cat", "man", "woman", "boy", "girl", "runs", "sits", "on", "in", "of", "with",
         "grass", "water", "red", "blue", "picture", "photo", "two", "is", "are", "playing"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]  # ids 0..5: [DEC] is BLIP's decoder start
PROMPT = "a picture of"
N_IMAGES = 5
MAX_NEW_TOKENS = "8"
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37,
        "initializer_range": 1.0}  # large random weights: captions that differ from image to image
VISION = TINY | {"image_size": 32, "patch_size": 8}


def _tokenizer(folder: Path):
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + WORDS) + "\n")
    return transformers.BertTokenizer(str(vocab), bos_token="[DEC]")


@pytest.fixture(scope="module")
def blip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BLIP captioner (BlipForConditionalGeneration + BlipProcessor), saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("blip")
    tokenizer = _tokenizer(tmp_path_factory.mktemp("blip-vocab"))
    text = TINY | {"vocab_size": len(SPECIAL) + len(WORDS), "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 3,
                   "sep_token_id": 3, "max_position_embeddings": 64}
    config = transformers.BlipConfig(text_config=text, vision_config=VISION, projection_dim=32, initializer_range=1.0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.BlipForConditionalGeneration(config)
    processor = transformers.BlipProcessor(transformers.BlipImageProcessor(size={"height": 32, "width": 32}),
                                           tokenizer)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def git_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GIT captioner (GitForCausalLM + GitProcessor: CLIPImageProcessor + BertTokenizer)."""
    folder = tmp_path_factory.mktemp("git")
    tokenizer = _tokenizer(tmp_path_factory.mktemp("git-vocab"))
    config = transformers.GitConfig(vision_config=VISION, vocab_size=len(SPECIAL) + len(WORDS),
                                    max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                    **TINY)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.GitForCausalLM(config)
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                                      crop_size={"height": 32, "width": 32})
    model.save_pretrained(folder)
    transformers.GitProcessor(image_processor, tokenizer).save_pretrained(folder)
    return folder


LLAVA_WORDS = WORDS + ["describe", "image", "user", "assistant", ":", "."]
LLAVA_PROMPT = "describe the image ."
LLAVA_TEMPLATE = ("{% for m in messages %}user : {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
                  "{% else %}{{ c['text'] }}{% endif %}{% endfor %} assistant :{% endfor %}")


def _word_tokenizer(vocab: dict[str, int], **special: object):
    """A word-level tokenizer (tokenizers' WordLevel, split on spaces and punctuation) that appends nothing."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", unk_token="<unk>",
                                                **special)


@pytest.fixture(scope="module")
def blip2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BLIP-2 (vision tower + Q-Former + OPT) with a word-level tokenizer."""
    folder = tmp_path_factory.mktemp("blip2")
    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "</s>", "<image>", *WORDS])}
    tokenizer = _word_tokenizer(vocab, bos_token="</s>", eos_token="</s>")
    processor = transformers.Blip2Processor(transformers.BlipImageProcessor(size={"height": 32, "width": 32}),
                                            tokenizer, num_query_tokens=4)  # "<image>" x 4 before the prompt
    text = {"model_type": "opt", "vocab_size": len(vocab), "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "ffn_dim": 37, "word_embed_proj_dim": 32, "max_position_embeddings": 64,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 2, "init_std": 1.0}
    config = transformers.Blip2Config(vision_config=VISION, text_config=text, num_query_tokens=4,
                                      qformer_config=TINY | {"encoder_hidden_size": 32, "vocab_size": len(vocab)},
                                      image_token_index=3, initializer_range=1.0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.Blip2ForConditionalGeneration(config)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LLaVA (CLIP vision tower + Llama) with a word-level tokenizer and a chat template."""
    folder = tmp_path_factory.mktemp("llava")
    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "<s>", "</s>", "<image>", *LLAVA_WORDS])}
    tokenizer = _word_tokenizer(vocab, bos_token="<s>", eos_token="</s>", extra_special_tokens={"image_token": "<image>"})
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                                      crop_size={"height": 32, "width": 32})
    processor = transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                            chat_template=LLAVA_TEMPLATE, patch_size=8,
                                            vision_feature_select_strategy="default", num_additional_image_tokens=1)
    text = TINY | {"model_type": "llama", "vocab_size": len(vocab), "num_key_value_heads": 2,
                   "max_position_embeddings": 128, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
    config = transformers.LlavaConfig(vision_config=VISION | {"model_type": "clip_vision_model"}, text_config=text,
                                      image_token_index=4, vision_feature_layer=-1,
                                      vision_feature_select_strategy="default", initializer_range=1.0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlavaForConditionalGeneration(config)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def images(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five real Flickr8k photographs."""
    folder = tmp_path_factory.mktemp("images")
    for source in sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:N_IMAGES]:
        shutil.copy(source, folder / source.name)
    return folder


def _pictures(folder: Path) -> list[Image.Image]:
    return [Image.open(path).convert("RGB") for path in sorted(folder.iterdir())]


def _without_prompt(texts: list[str], prompt: str | None) -> list[str]:
    """Cut the echoed prompt off each decoded text, checking that the model did echo it."""
    if prompt is None:
        return [text.strip() for text in texts]
    assert all(text == prompt or text.startswith(prompt + " ") for text in texts), texts
    return [text[len(prompt):].strip() for text in texts]


def blip_reference(folder: Path, pictures: list[Image.Image], beam: int, prompt: str | None,
                   min_new_tokens: int = 0) -> list[str]:
    """BLIP's documented captioning: processor(images[, text]) -> generate -> batch_decode, one batch."""
    model = transformers.BlipForConditionalGeneration.from_pretrained(folder).eval()
    processor = transformers.BlipProcessor.from_pretrained(folder)
    inputs = processor(images=pictures, text=[prompt] * len(pictures) if prompt else None, return_tensors="pt")
    extra = {"min_new_tokens": min_new_tokens} if min_new_tokens else {}
    with torch.no_grad():
        out = model.generate(**inputs, num_beams=beam, max_new_tokens=int(MAX_NEW_TOKENS), do_sample=False, **extra)
    return _without_prompt(processor.batch_decode(out, skip_special_tokens=True), prompt)


def blip2_reference(folder: Path, pictures: list[Image.Image], beam: int, prompt: str | None) -> list[str]:
    """BLIP-2's documented captioning: processor(images[, text]) -> generate -> batch_decode, one batch."""
    model = transformers.Blip2ForConditionalGeneration.from_pretrained(folder).eval()
    processor = transformers.Blip2Processor.from_pretrained(folder)
    inputs = processor(images=pictures, text=[prompt] * len(pictures) if prompt else None, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, num_beams=beam, max_new_tokens=int(MAX_NEW_TOKENS), do_sample=False)
    return _without_prompt(processor.batch_decode(out, skip_special_tokens=True), prompt)


def git_reference(folder: Path, pictures: list[Image.Image], beam: int, prompt: str | None,
                  min_new_tokens: int = 0) -> list[str]:
    """GIT's documented captioning: pixel_values, input_ids = [CLS] + prompt tokens (no [SEP]) -> generate."""
    model = transformers.GitForCausalLM.from_pretrained(folder).eval()
    processor = transformers.GitProcessor.from_pretrained(folder)
    pixel_values = processor(images=pictures, return_tensors="pt").pixel_values
    extra = {"min_new_tokens": min_new_tokens} if min_new_tokens else {}
    if prompt:
        tokenizer = processor.tokenizer
        ids = [tokenizer.cls_token_id] + tokenizer(prompt, add_special_tokens=False).input_ids
        extra["input_ids"] = torch.tensor([ids] * len(pictures))
    with torch.no_grad():
        out = model.generate(pixel_values=pixel_values, num_beams=beam, max_new_tokens=int(MAX_NEW_TOKENS),
                             do_sample=False, **extra)
    return _without_prompt(processor.batch_decode(out, skip_special_tokens=True), prompt)


def llava_reference(folder: Path, pictures: list[Image.Image], beam: int, prompt: str) -> list[str]:
    """LLaVA's documented captioning: the chat template, processor, generate, decode the tokens after the input."""
    model = transformers.LlavaForConditionalGeneration.from_pretrained(folder).eval()
    processor = transformers.LlavaProcessor.from_pretrained(folder)
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=pictures, text=[text] * len(pictures), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, num_beams=beam, max_new_tokens=int(MAX_NEW_TOKENS), do_sample=False)
    return [caption.strip() for caption in
            processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)]


def pacs_caption(checkpoint: Path, images: Path, out: Path, *options: str) -> int:
    """Run `pacs caption` in-process."""
    from pacs.cli import main

    return main(["caption", "--checkpoint", str(checkpoint), "--images", str(images), "--out", str(out),
                 "--max-new-tokens", MAX_NEW_TOKENS, *options])


@pytest.mark.parametrize("prompt", [None, PROMPT], ids=["no-prompt", "prompt"])
@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("family", ["blip", "git", "blip-2"])
def test_captions_equal_the_models_own_generate_for_any_batch_size(family, beam, prompt, images, tmp_path, request):
    folder = request.getfixturevalue(family.replace("-", "") + "_folder")
    reference = {"blip": blip_reference, "git": git_reference, "blip-2": blip2_reference}[family]
    expected = reference(folder, _pictures(images), beam, prompt)
    assert len(set(expected)) > 1  # the captions depend on the image: a mix-up of ids would show
    stems = [path.stem for path in sorted(images.iterdir())]
    for batch_size in (1, 2, N_IMAGES):  # 5 images in batches of 2: 2 + 2 + 1
        out = tmp_path / f"results-{batch_size}.json"
        options = ["--beam-size", str(beam), "--batch-size", str(batch_size)] + (["--prompt", prompt] if prompt else [])
        assert pacs_caption(folder, images, out, *options) == 0
        results = json.loads(out.read_text())
        assert [row["image_id"] for row in results] == stems
        assert [row["caption"] for row in results] == expected, f"batch size {batch_size}"


@pytest.mark.parametrize("beam", [1, 3])
def test_llava_captions_equal_its_own_generate_with_the_chat_template(beam, llava_folder, images, tmp_path):
    expected = llava_reference(llava_folder, _pictures(images), beam, LLAVA_PROMPT)
    assert len(set(expected)) > 1 and not any(caption.startswith("user") for caption in expected)
    for batch_size in (1, 2, N_IMAGES):
        out = tmp_path / f"results-{batch_size}.json"
        assert pacs_caption(llava_folder, images, out, "--beam-size", str(beam), "--batch-size", str(batch_size),
                            "--prompt", LLAVA_PROMPT) == 0
        assert [row["caption"] for row in json.loads(out.read_text())] == expected, f"batch size {batch_size}"


@pytest.mark.parametrize("family", ["blip", "git"])
def test_min_length_is_min_new_tokens(family, blip_folder, git_folder, images, tmp_path):
    folder, reference = (blip_folder, blip_reference) if family == "blip" else (git_folder, git_reference)
    expected = reference(folder, _pictures(images), 1, PROMPT, min_new_tokens=6)
    assert pacs_caption(folder, images, tmp_path / "out.json", "--beam-size", "1", "--prompt", PROMPT,
                        "--min-length", "6") == 0
    assert [row["caption"] for row in json.loads((tmp_path / "out.json").read_text())] == expected
    assert all(len(caption.split()) >= 1 for caption in expected)  # no empty caption once 6 new tokens are forced


def test_an_empty_caption_is_written_and_counted(git_folder, images, tmp_path, capsys):
    expected = git_reference(git_folder, _pictures(images), 1, None)
    empty = expected.count("")
    assert empty  # this tiny GIT ends one of the five captions at once (checked, so the test keeps its point)
    assert pacs_caption(git_folder, images, tmp_path / "out.json", "--beam-size", "1") == 0
    assert [row["caption"] for row in json.loads((tmp_path / "out.json").read_text())] == expected
    assert f"captioned {N_IMAGES} images" in (printed := capsys.readouterr().out) and f"({empty} empty" in printed


def test_coco_and_json_ids_name_the_results(blip_folder, images, tmp_path):
    coco = tmp_path / "val2014"
    coco.mkdir()
    originals = sorted(images.iterdir())
    cocoids = [391895, 42, 7, 100000, 5]
    for path, cocoid in zip(originals, cocoids):
        shutil.copy(path, coco / f"COCO_val2014_{cocoid:012d}.jpg")
    assert pacs_caption(blip_folder, coco, tmp_path / "coco.json", "--ids", "coco", "--beam-size", "1") == 0
    by_coco = {row["image_id"]: row["caption"] for row in json.loads((tmp_path / "coco.json").read_text())}
    expected = blip_reference(blip_folder, _pictures(images), 1, None)
    assert by_coco == dict(zip(cocoids, expected))  # integer ids, each with its own image's caption
    mapping = tmp_path / "ids.json"
    mapping.write_text(json.dumps({path.name: f"n-{i}" for i, path in enumerate(originals)}))
    assert pacs_caption(blip_folder, images, tmp_path / "mapped.json", "--ids", str(mapping), "--beam-size", "1") == 0
    by_name = {row["image_id"]: row["caption"] for row in json.loads((tmp_path / "mapped.json").read_text())}
    assert by_name == {f"n-{i}": caption for i, caption in enumerate(expected)}


def _refused(capsys: pytest.CaptureFixture, checkpoint: Path, images: Path, out: Path, *options: str) -> str:
    """Run `pacs caption`, check exit 2, one error line and no output file; return the line."""
    assert pacs_caption(checkpoint, images, out, *options) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pacs caption:")]
    assert len(lines) == 1 and lines[0].startswith("pacs caption: error: "), lines  # (progress bars aside)
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(("model_type", "why"), [
    ("no-such-model", "is not an image-to-text model that transformers can load"),
    ("bert", "a causal LM type, but the folder holds no image processor"),
    ("clip", "is not an image-to-text model that transformers can load"),
])
def test_an_unknown_model_type_is_one_clear_error(model_type, why, images, tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    line = _refused(capsys, folder, images, tmp_path / "out.json")
    assert f"--checkpoint {folder}: model_type {model_type!r}" in line and why in line


def test_a_folder_of_neither_kind_is_one_clear_error(images, tmp_path, capsys):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"not a model")
    line = _refused(capsys, folder, images, tmp_path / "out.json")
    assert f"--checkpoint {folder} is neither a pacs captioner folder" in line and "config.json" in line
    assert "is not a captioner checkpoint: no such folder" in _refused(capsys, tmp_path / "missing", images, tmp_path / "out.json")
    (folder / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    assert "its config.json has no model_type" in _refused(capsys, folder, images, tmp_path / "out.json")


def test_a_transformers_folder_without_weights_is_one_clear_error(blip_folder, images, tmp_path, capsys):
    folder = tmp_path / "blip-no-weights"
    shutil.copytree(blip_folder, folder)
    (folder / "model.safetensors").unlink()
    line = _refused(capsys, folder, images, tmp_path / "out.json")
    assert f"--checkpoint {folder}: transformers cannot load this blip folder" in line


@pytest.mark.parametrize(("options", "message"), [
    (["--beam-size", "0"], "--beam-size 0: expected int >= 1 and <= 64"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0: expected int >= 1 and <= 512"),
    (["--min-length", "9"], "--min-length 9 is above --max-new-tokens 8"),
    (["--prompt", " "], "--prompt is empty"),
])
def test_bad_decoding_options_are_refused_before_loading(options, message, blip_folder, images, tmp_path, capsys):
    assert message in _refused(capsys, blip_folder, images, tmp_path / "out.json", *options)


def test_an_instruction_tuned_model_needs_a_prompt(images, tmp_path, capsys):
    folder = tmp_path / "llava"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llava"}))
    line = _refused(capsys, folder, images, tmp_path / "out.json")
    assert "model_type 'llava' is an instruction-tuned model: pass --prompt" in line


def test_transformers_options_are_refused_for_a_pacs_captioner(images, tmp_path, capsys):
    folder = tmp_path / "captioner"
    folder.mkdir()
    (folder / "captioner.json").write_text("{}")
    line = _refused(capsys, folder, images, tmp_path / "out.json", "--prompt", "a photo of")
    assert "--prompt and --max-new-tokens: only for transformers models" in line


def test_an_unreadable_image_leaves_no_output(blip_folder, images, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(images, broken)
    (broken / "zzz.jpg").write_bytes(b"not a jpeg")
    line = _refused(capsys, blip_folder, broken, tmp_path / "out.json", "--batch-size", "2")
    assert "zzz.jpg" in line


def test_inputs_of_different_shapes_are_never_padded_together():
    from pacs.captioner.modeling.hf_captioning import stack_without_padding

    short, long = torch.tensor([[1, 2]]), torch.tensor([[1, 2, 3]])
    encoded = [{"input_ids": short, "pixel_values": torch.zeros(1, 3)},
               {"input_ids": long, "pixel_values": torch.ones(1, 3)},
               {"input_ids": short + 10, "pixel_values": torch.full((1, 3), 2.0)}]
    groups = stack_without_padding(encoded)
    assert [positions for positions, _ in groups] == [[0, 2], [1]]
    first, second = groups[0][1], groups[1][1]
    assert torch.equal(first["input_ids"], torch.tensor([[1, 2], [11, 12]]))
    assert torch.equal(first["pixel_values"], torch.tensor([[0.0] * 3, [2.0] * 3]))
    assert torch.equal(second["input_ids"], long) and torch.equal(second["pixel_values"], torch.ones(1, 3))
