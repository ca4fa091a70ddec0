"""A transformers captioner folder is checked before a model is built: every refusal is one line naming the folder,
the file, the key and the bound.

What is checked (`check_folder_files`, called by `hf_captioning.check_folder` and `load_hf_captioner`):

* the files: every file at the top of the folder is a regular file (a FIFO or a device would block or never end)
  that resolves inside the folder (a `tokenizer.json` linked to a file elsewhere is refused; a hub cache snapshot,
  `models--*/snapshots/<rev>/`, may point into its own `models--*/blobs/`), of a bounded size;
* `config.json`, the processor files and `generation_config.json` are JSON objects without NaN / inf, and every
  size of `CONFIG_BOUNDS` (layers, widths, heads, vocabulary, positions, image and patch sizes) is an integer
  within its bound, at any depth (`text_config`, `vision_config`, ...); an image is at most `MAX_PATCHES` patches;
* the processor's resize / crop sizes are at most `MAX_EDGE` pixels a side (`MAX_PIXELS` for processors that
  count pixels: `min_pixels` / `max_pixels`);
* token ids (`*_token_id`, `*_token_ids`, `*_token_index`, `suppress_tokens`, ...) of config.json, its
  `text_config` and generation_config.json lie in the text model's vocabulary; generation_config.json holds no
  `max_time` (it silently cuts captions short) and no `num_return_sequences` other than 1 (the captions of one
  batch would be shifted onto the wrong images);
* a `quantization_config` names a method whose package is installed (bitsandbytes, gptq, ...);
* every `*.safetensors` file has a well-formed header, parsed here (8-byte little-endian length, a JSON object,
  known dtypes, shapes whose bytes match `data_offsets`, offsets that tile the data exactly as safetensors
  requires), and a sharded index names only files of the folder;
* `tokenizer.json` loads (`tokenizers.Tokenizer.from_file`: a regex the Oniguruma engine refuses is one line).

`check_tokenizer` runs after the processor is loaded (still before the model): a tokenizer that fails on a short
sentence (a panic in the Rust tokenizer: a missing special token, a regex that exhausts its retry limit) is one line.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pacs.metric.common.contained_paths import ConfinedRoot
from pacs.metric.common.errors import InputError

#: (low, high) of every integer size of a config, whatever sub-config it is in
LAYERS, WIDTH, FFN, HEADS = (0, 256), (1, 32768), (1, 131072), (1, 1024)
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "num_encoder_layers", "num_decoder_layers", "depth", "depths"), LAYERS),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "projection_dim", "encoder_hidden_size",
                     "image_text_hidden_size", "word_embed_proj_dim", "d_kv", "head_dim"), WIDTH),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
                     "moe_intermediate_size"), FFN),
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), HEADS),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok"), (1, 1024)),
    "vocab_size": (1, 2 ** 20),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), (1, 2 ** 21)),
    **dict.fromkeys(("image_size", "patch_size"), (1, 2 ** 14)),
    "num_channels": (1, 64),
    **dict.fromkeys(("num_query_tokens", "image_seq_length", "num_image_tokens"), (1, 2 ** 16)),
}
MAX_PATCHES = 2 ** 16  # (image_size / patch_size) ** 2 of one vision config
MAX_EDGE = 2 ** 14  # a side of the processor's resize / crop, in pixels
MAX_PIXELS = 2 ** 28  # a processor that counts pixels (min_pixels / max_pixels)
PROCESSOR_SIZE_KEYS = ("size", "crop_size", "max_image_size", "pad_size")
PROCESSOR_JSON = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
MAX_JSON_BYTES = 64 * 2 ** 20  # a config, processor or index file
MAX_TOKENIZER_BYTES = 512 * 2 ** 20  # tokenizer.json (a few large vocabularies reach 30 MB)
MAX_HEADER_BYTES = 100_000_000  # a safetensors header (safetensors' own limit)
TOKEN_ID_LISTS = ("suppress_tokens", "begin_suppress_tokens", "bad_words_ids", "force_words_ids")
#: the packages a quantization method needs (the import names transformers checks for)
QUANTIZATION_PACKAGES: dict[str, tuple[str, ...]] = {
    "bitsandbytes": ("bitsandbytes",), "bitsandbytes_4bit": ("bitsandbytes",), "bitsandbytes_8bit": ("bitsandbytes",),
    "gptq": ("optimum", "gptqmodel"), "awq": ("gptqmodel",), "aqlm": ("aqlm",), "quanto": ("optimum.quanto",),
    "eetq": ("eetq",), "hqq": ("hqq",), "higgs": ("flute",), "torchao": ("torchao",), "vptq": ("vptq",),
    "compressed-tensors": ("compressed_tensors",), "fbgemm_fp8": ("fbgemm_gpu",), "spqr": ("spqr_quant",),
    "quark": ("quark",), "auto-round": ("auto_round",), "fp_quant": ("fp_quant",),
}
#: safetensors dtypes and their size in bits
SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
                    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
                    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
MAX_WALK_DEPTH = 32  # nesting of a config the checks look into (transformers uses a few levels)


def _error(folder: Path, message: str) -> InputError:
    """The one-line refusal of a folder (`checkpoint=` is the flag --checkpoint on the command line)."""
    return InputError(f"checkpoint={folder}: {message}", parameter="checkpoint")


def check_folder_files(folder: str | os.PathLike) -> dict[str, Any]:
    """Check a transformers folder before anything is built from it (see the module docstring); its config.json."""
    folder = Path(folder)
    check_entries(folder)
    config = read_object(folder, "config.json")
    check_sizes(folder, "config.json", config)
    vocab = text_vocabulary(config)
    check_token_ids(folder, "config.json", config, vocab)
    if isinstance(config.get("text_config"), dict):
        check_token_ids(folder, "config.json text_config", config["text_config"], vocab)
    check_generation_keys(folder, "config.json", config)
    check_quantization(folder, config)
    for name in PROCESSOR_JSON:
        if (folder / name).is_file():
            check_processor(folder, name, read_object(folder, name))
    if (folder / "generation_config.json").is_file():
        generation = read_object(folder, "generation_config.json")
        check_token_ids(folder, "generation_config.json", generation, vocab)
        check_generation_keys(folder, "generation_config.json", generation)
    for name in TOKENIZER_JSON:
        if (folder / name).is_file():
            read_object(folder, name)
    check_weight_files(folder)
    if (folder / "tokenizer.json").is_file():
        check_tokenizer_file(folder, folder / "tokenizer.json")
    return config


# --- files --------------------------------------------------------------------------------------------------------
def confinement_root(folder: Path) -> Path:
    """The folder the files must resolve inside: the folder, or its `models--*` repository for a hub snapshot."""
    repository = folder.parent.parent
    if folder.parent.name == "snapshots" and (repository / "blobs").is_dir():
        return repository
    return folder


def check_entries(folder: Path) -> None:
    """Every top-level file is a regular file that resolves inside the folder (or its hub repository)."""
    root = ConfinedRoot(confinement_root(folder))
    try:
        entries = sorted(folder.iterdir())
    except OSError as error:
        raise _error(folder, f"cannot list the folder ({error.strerror or error})") from None
    for path in entries:
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            continue
        if stat.S_ISLNK(info.st_mode) and not root.contains(path):
            raise _error(folder, f"{path.name} is a symbolic link that leads outside the folder: pacs reads only "
                                 "the folder's own files (copy the file in)")
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise _error(folder, f"{path.name} is a broken link") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise _error(folder, f"{path.name} is not a regular file (a FIFO, socket or device): reading it would "
                                 "block or never end")


def read_object(folder: Path, name: str) -> dict[str, Any]:
    """The JSON object `folder/name` (bounded size, no NaN / inf anywhere); one line for anything else."""
    from pacs.metric.common.json_input import read_json_file

    path = folder / name
    _bounded_size(folder, path, MAX_JSON_BYTES)
    data = read_json_file(path, f"transformers {name}")
    if not isinstance(data, dict):
        raise _error(folder, f"{name} must be a JSON object, not {_json_type(data)}")
    bad = _non_finite(data, 0)
    if bad is not None:
        raise _error(folder, f"{name} {bad[0]} = {bad[1]} is not a finite number")
    return data


def _bounded_size(folder: Path, path: Path, limit: int) -> None:
    """One line naming the file when it is larger than `limit` bytes."""
    size = path.stat().st_size
    if size > limit:
        raise _error(folder, f"{path.name} is {size} bytes, above the bound of {limit} bytes")


def _json_type(value: Any) -> str:
    """The JSON name of a value's type (list -> an array)."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _items(data: Any) -> Iterator[tuple[str, Any]]:
    """(key, value) of an object, (index, item) of an array."""
    if isinstance(data, dict):
        yield from ((str(k), v) for k, v in data.items())
    elif isinstance(data, list):
        yield from ((str(i), v) for i, v in enumerate(data))


def _non_finite(data: Any, depth: int, where: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first NaN / inf in `data` (objects and arrays, down to MAX_WALK_DEPTH)."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "(the value)", data
    if depth >= MAX_WALK_DEPTH:
        return None
    for key, value in _items(data):
        if isinstance(value, (dict, list, float)):
            found = _non_finite(value, depth + 1, f"{where}.{key}" if where else key)
            if found is not None:
                return found
    return None


# --- config sizes ---------------------------------------------------------------------------------------------------
def _integer(folder: Path, name: str, key: str, value: Any, low: int, high: int) -> int:
    """`value` when it is an integer in [low, high]; one line naming file, key and bound otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _error(folder, f"{name} {key} = {value!r:.40} is out of bounds: expected an integer from {low} to "
                             f"{high}")
    return value


def check_sizes(folder: Path, name: str, config: dict[str, Any], where: str = "", depth: int = 0) -> None:
    """Every key of `CONFIG_BOUNDS` in `config` and its sub-configs within its bound; images of <= MAX_PATCHES."""
    for key, value in config.items():
        dotted = f"{where}.{key}" if where else key
        if key in CONFIG_BOUNDS and value is not None:
            low, high = CONFIG_BOUNDS[key]
            for index, item in enumerate(value if isinstance(value, list) else [value]):
                _integer(folder, name, f"{dotted}[{index}]" if isinstance(value, list) else dotted, item, low, high)
        elif isinstance(value, dict) and depth < MAX_WALK_DEPTH and key != "quantization_config":
            check_sizes(folder, name, value, dotted, depth + 1)
    image, patch = config.get("image_size"), config.get("patch_size")
    if image is not None and isinstance(patch, int) and not isinstance(patch, bool):
        sides = image if isinstance(image, list) else [image, image]
        patches = math.prod(side // patch for side in sides[:2])
        if patches > MAX_PATCHES:
            prefix = f"{where}." if where else ""
            raise _error(folder, f"{name} {prefix}image_size = {image!r} with {prefix}patch_size = {patch} is "
                                 f"{patches} patches, above the bound of {MAX_PATCHES}")


def text_vocabulary(config: dict[str, Any]) -> int | None:
    """The text model's vocabulary size (`text_config.vocab_size`, else `vocab_size`), None when not recorded."""
    text = config.get("text_config")
    vocab = text.get("vocab_size") if isinstance(text, dict) else None
    return vocab if vocab is not None else config.get("vocab_size")


def _is_token_key(key: str) -> bool:
    """Whether a config key holds token ids."""
    return key.endswith(("_token_id", "_token_ids", "_token_index")) or key in TOKEN_ID_LISTS


def _token_ids(value: Any, depth: int = 0) -> Iterator[Any]:
    """The ids of a token-id value (an id, or nested lists of ids)."""
    if isinstance(value, list) and depth < 4:
        for item in value:
            yield from _token_ids(item, depth + 1)
    elif value is not None:
        yield value


def check_token_ids(folder: Path, name: str, config: dict[str, Any], vocab: int | None) -> None:
    """Every token id of `config` (top level) an integer in [0, vocab) (any integer >= 0 without a vocabulary)."""
    high = vocab - 1 if isinstance(vocab, int) and not isinstance(vocab, bool) else 2 ** 63 - 1
    for key, value in config.items():
        if _is_token_key(key):
            for token in _token_ids(value):
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= high:
                    bound = f"the vocabulary of {vocab} tokens (0 to {high})" if high < 2 ** 63 - 1 else "ids >= 0"
                    raise _error(folder, f"{name} {key} = {token!r:.40} is outside {bound}")


def check_generation_keys(folder: Path, name: str, config: dict[str, Any]) -> None:
    """No `max_time` (it cuts captions short silently) and no `num_return_sequences` other than 1."""
    if config.get("max_time") is not None:
        raise _error(folder, f"{name} sets max_time = {config['max_time']!r:.40}: generation would stop after that "
                             "many seconds and cut captions short silently; remove the key")
    returned = config.get("num_return_sequences")
    if returned is not None and (isinstance(returned, bool) or returned != 1):
        raise _error(folder, f"{name} num_return_sequences = {returned!r:.40}: pacs writes one caption per image "
                             "(expected 1 or no key)")


def check_quantization(folder: Path, config: dict[str, Any]) -> None:
    """A `quantization_config` is an object whose method's packages are installed (one line naming them)."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return
    if not isinstance(quantization, dict):
        raise _error(folder, f"config.json quantization_config must be an object, not {_json_type(quantization)}")
    method = quantization.get("quant_method")
    if method is None and (quantization.get("load_in_4bit") or quantization.get("load_in_8bit")):
        method = "bitsandbytes"
    if not isinstance(method, str):
        raise _error(folder, f"config.json quantization_config.quant_method = {method!r:.40} is not a method name")
    missing = [package for package in QUANTIZATION_PACKAGES.get(method, ()) if not _installed(package)]
    if missing:
        raise _error(folder, f"config.json quantization_config.quant_method = {method!r:.40} needs the package "
                             f"{' and '.join(missing)}, which is not installed: use an unquantized folder (or "
                             "install it)")


def _installed(module: str) -> bool:
    """Whether `module` (dotted) can be imported, looked up without importing it (nor its parent, when absent)."""
    parent = module.partition(".")[0]
    try:
        return importlib.util.find_spec(parent) is not None and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --- processor sizes ------------------------------------------------------------------------------------------------
def check_processor(folder: Path, name: str, config: dict[str, Any], where: str = "", depth: int = 0) -> None:
    """The resize / crop sizes of a processor file (any nesting: transformers 5 keeps the image processor in
    `processor_config.json` `image_processor`) at most MAX_EDGE a side, or MAX_PIXELS when counting pixels."""
    pixels = any(key in config for key in ("min_pixels", "max_pixels", "merge_size"))
    for key, value in config.items():
        dotted = f"{where}.{key}" if where else key
        if key in PROCESSOR_SIZE_KEYS and value is not None:
            entries = (value.items() if isinstance(value, dict) else
                       [(str(i), v) for i, v in enumerate(value)] if isinstance(value, list) else [("", value)])
            for side, size in entries:
                counts_pixels = pixels and side in ("shortest_edge", "longest_edge")
                _integer(folder, name, f"{dotted}.{side}" if side else dotted, size, 1,
                         MAX_PIXELS if counts_pixels else MAX_EDGE)
        elif key in ("min_pixels", "max_pixels") and value is not None:
            _integer(folder, name, dotted, value, 1, MAX_PIXELS)
        elif key in ("patch_size", "max_patches", "image_seq_length", "num_image_tokens") and value is not None:
            for index, item in enumerate(value.values() if isinstance(value, dict) else [value]):
                _integer(folder, name, f"{dotted}[{index}]" if isinstance(value, dict) else dotted, item, 1,
                         MAX_PATCHES)
        elif isinstance(value, dict) and depth < MAX_WALK_DEPTH:
            check_processor(folder, name, value, dotted, depth + 1)


# --- weights --------------------------------------------------------------------------------------------------------
def check_weight_files(folder: Path) -> None:
    """Every `*.safetensors` file well formed; a sharded index names only plain files of the folder."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        index = read_object(folder, index_path.name)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise _error(folder, f"{index_path.name} weight_map must be an object {{tensor: file}}")
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", ".."):
                raise _error(folder, f"{index_path.name} weight_map[{tensor!r:.60}] = {shard!r:.60} is not a file "
                                     "name of the folder")
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors(folder, path)


def check_safetensors(folder: Path, path: Path) -> None:
    """One line naming `path` unless its header is well formed (parsed here before safetensors reads the file)."""
    def bad(why: str) -> InputError:
        return _error(folder, f"{path.name} is not a valid safetensors file: {why}")

    size = path.stat().st_size
    if size < 8:
        raise bad(f"{size} bytes, shorter than the 8-byte header length (empty or truncated)")
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise bad(f"its header length {length} is above "
                      + (f"the bound of {MAX_HEADER_BYTES} bytes" if length > MAX_HEADER_BYTES
                         else f"the {size - 8} bytes that follow it (truncated?)"))
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise bad(f"its header is not JSON ({str(error).splitlines()[0][:120]})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is {_json_type(header)}, not an object")
    data_bytes = size - 8 - length
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise bad("__metadata__ must be an object of strings")
            continue
        spans.append((*_tensor_span(entry, data_bytes, lambda why, name=name: bad(f"tensor {name!r:.80}: {why}")),
                      name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise bad(f"tensor {name!r:.80} starts at byte {begin} of the data, expected {position} (offsets overlap "
                      "or leave a gap)")
        position = end
    if position != data_bytes:
        raise bad(f"its tensors cover {position} of the {data_bytes} data bytes (truncated, or bytes left over)")


def _tensor_span(entry: Any, data_bytes: int, bad: Any) -> tuple[int, int]:
    """(begin, end) of a header entry, checked: known dtype, shape of integers >= 0 whose bytes are end - begin,
    offsets within the data."""
    if not isinstance(entry, dict):
        raise bad("its entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_BITS:
        raise bad(f"unknown dtype {dtype!r:.40}")
    if not isinstance(shape, list) or len(shape) > 64 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise bad(f"shape {shape!r:.80} is not a list of integers >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in offsets)):
        raise bad(f"data_offsets {offsets!r:.80} is not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise bad(f"data_offsets [{begin}, {end}] are outside the {data_bytes} data bytes (truncated, or offsets "
                  "past the end)")
    bits = math.prod(shape) * SAFETENSORS_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        raise bad(f"shape {shape} of {dtype} is {bits / 8:g} bytes, its data_offsets span {end - begin}")
    return begin, end


# --- tokenizer ------------------------------------------------------------------------------------------------------
def _first_line(error: BaseException) -> str:
    """The first line of an error's message (its type when empty)."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def _rust_panic(error: BaseException) -> bool:
    """Whether `error` is a panic of a Rust extension (pyo3's PanicException, a BaseException)."""
    return type(error).__name__ == "PanicException"


def check_tokenizer_file(folder: Path, path: Path) -> None:
    """`tokenizer.json` loads with the tokenizers library (a regex it refuses, a malformed model: one line)."""
    from tokenizers import Tokenizer

    _bounded_size(folder, path, MAX_TOKENIZER_BYTES)
    try:
        with _quiet_stderr():
            Tokenizer.from_file(str(path))
    except Exception as error:  # noqa: BLE001 - tokenizers raises plain Exception (Oniguruma, serde errors)
        raise _error(folder, f"its tokenizer {path.name} does not load: {_first_line(error)}") from None
    except BaseException as error:
        if not _rust_panic(error):
            raise
        raise _error(folder, f"its tokenizer {path.name} does not load: {_first_line(error)}") from None


def check_tokenizer(folder: Path, tokenizer: Any) -> None:
    """The loaded tokenizer encodes and decodes a short sentence (one line naming the folder when it fails)."""
    try:
        with _quiet_stderr():
            ids = tokenizer("a picture of a dog on the grass.")["input_ids"]
            tokenizer.decode(ids, skip_special_tokens=True)
    except Exception as error:  # noqa: BLE001 - whatever the tokenizer raises is about the folder's files
        raise _error(folder, f"its tokenizer fails on a short sentence: {_first_line(error)}") from None
    except BaseException as error:
        if not _rust_panic(error):
            raise
        raise _error(folder, f"its tokenizer fails on a short sentence (a panic in the tokenizers library): "
                             f"{_first_line(error)}") from None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to a scratch file meanwhile: a Rust panic prints its message (and a backtrace
    under RUST_BACKTRACE) there, which the one-line error already carries."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)
