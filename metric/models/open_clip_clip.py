"""The open_clip CLIP family (OpenAI BPE text tower): ``NAME[/TAG|/FILE]``, ``tiny-random`` and CLIP local-dir folders.

Model: open_clip's `create_model` (a built-in name with a pretrained tag or a local weights file, random weights
without one; ``tiny-random[/SEED]`` is built in code) or a ``local-dir:`` folder whose text config names no Hugging
Face tokenizer. Tokenizer: pacs' OpenAI-spelled CLIP BPE (`pacs.metric.models.tokenizer.ClipTokenizer`). Preprocessing:
open_clip's preprocess config of the model (`pacs.metric.models.preprocess.ImagePreprocess`). Traits: those of the
model (`pacs.metric.models.open_clip_traits`).
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import open_clip

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import (
    Backbone,
    assemble_backbone,
    build_backbone_from_config,
    open_clip_name_config,
    parse_backbone_spec,
    tiny_clip_config,
)
from pacs.metric.models.families import (
    NOT_ESTABLISHED,
    SOURCE_BUILT,
    SOURCE_OPEN_CLIP,
    SOURCE_USER,
    check_declared_family,
    check_family_name,
)
from pacs.metric.models.loader_registry import LoadRequest
from pacs.metric.models.open_clip_local import (
    LOCAL_DIR,
    assemble_local_dir,
    is_open_clip_folder,
    open_clip_errors_silenced,
    read_local_dir,
)
from pacs.metric.models.open_clip_traits import wrap_open_clip_tokenizer
from pacs.metric.models.preprocess import ImagePreprocess
from pacs.metric.models.weights_only import quiet_pickle_protocol_warning, torch_load_error

TINY_RANDOM_NAME = "tiny-random"


def _missing_pretrained_message(name: str, tag: str, error: Exception) -> str:
    cfg = open_clip.get_pretrained_cfg(name, tag)
    hub = cfg.get("hf_hub") or ""
    if hub:
        repo, _, filename = hub.rstrip("/").rpartition("/") if not hub.endswith("/") else (hub.rstrip("/"), "", "")
        where = f"file {filename or 'open_clip_pytorch_model.bin'} of the Hugging Face repo {repo or hub}"
    else:
        url = cfg.get("url") or "the open_clip pretrained registry"
        where = f"file {os.path.basename(url)} from {url}"
    return (f"pretrained weights {name}/{tag} are not available locally: missing {where} "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}). Download it once, then point at the local "
            f"copy with backbone={name}/PATH_TO_FILE (or backbone={name} and checkpoint=PATH_TO_FILE)")


def load_open_clip_backbone(spec: str, device: str = "cpu", family: str | None = None) -> Backbone:
    """Build an open_clip model `NAME[/PRETRAINED]` (tag or local file); random weights without PRETRAINED.

    A pretrained tag (or no weights) is family CLIP; a local weights file has the family `family` (--family)
    or none established.
    """
    name, pretrained = parse_backbone_spec(spec)
    family = check_family_name(family)
    if pretrained and os.path.isfile(pretrained) and not open_clip.get_pretrained_cfg(name, pretrained):
        own_family, own_source = (family, SOURCE_USER) if family else (None, NOT_ESTABLISHED)
    else:
        own_family, own_source = "clip", (f"{SOURCE_OPEN_CLIP} {spec}" if pretrained else SOURCE_BUILT)
        check_declared_family(own_family, own_source, family, spec)
    if name == TINY_RANDOM_NAME:
        seed = int(pretrained) if pretrained and pretrained.isdigit() else 0
        return build_backbone_from_config(tiny_clip_config(), seed=seed, name=spec, device=device or "cpu")
    if not name.startswith(("hf-hub:", "local-dir:")):
        config = open_clip_name_config(name)
    else:
        config = {}
    if pretrained and not open_clip.get_pretrained_cfg(name, pretrained) and not os.path.isfile(pretrained):
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(name)) or "none"
        raise InputError(f"backbone= {spec}: {pretrained!r} is neither a pretrained tag of {name} "
                         f"(known: {tags}) nor an existing file", parameter="backbone")
    try:
        with open_clip_errors_silenced(), quiet_pickle_protocol_warning():  # download failures: one error below
            model = open_clip.create_model(name, pretrained=pretrained, precision="fp32", device="cpu",
                                           weights_only=True)
    except (pickle.UnpicklingError, EOFError) as error:  # a local file torch.load(weights_only=True) refused
        raise torch_load_error(pretrained, error, parameter="backbone") from None
    except RuntimeError as error:
        if pretrained and open_clip.get_pretrained_cfg(name, pretrained):
            raise MissingResourceError(_missing_pretrained_message(name, pretrained, error),
                                       parameter=("backbone", "checkpoint")) from None
        raise InputError(f"backbone= {spec}: cannot build the model: {str(error).splitlines()[0]}",
                         parameter="backbone") from None
    except (FileNotFoundError, OSError, ValueError) as error:
        raise MissingResourceError(f"backbone= {spec}: {str(error).splitlines()[0]}", parameter="backbone") from None
    preprocess_cfg = open_clip.get_model_preprocess_cfg(model)
    if not config:  # hf-hub / local-dir: the config came with the weights
        config = {"model_name": name}
    else:
        config = {**config, "preprocess_cfg": {k: list(v) if isinstance(v, tuple) else v
                                               for k, v in preprocess_cfg.items()}}
    preprocess = ImagePreprocess.from_open_clip_cfg(preprocess_cfg)
    source = {"kind": "open_clip", "name": name, "pretrained": pretrained,
              "sha256": sha256_file(pretrained) if pretrained and os.path.isfile(pretrained) else None,
              "family_source": own_source}
    return assemble_backbone(model, config, preprocess=preprocess, name=spec, family=own_family, source=source,
                             device=device, tokenizer=None if config.get("text_cfg") else
                             open_clip.get_tokenizer(name), family_source=own_source)


def load_local_dir_clip(folder: str | os.PathLike, device: str = "cpu", family: str | None = None) -> Backbone:
    """A CLIP ``local-dir`` folder: config, preprocessing and weights from the folder, open_clip's CLIP BPE."""
    local = read_local_dir(folder)
    tokenizer = wrap_open_clip_tokenizer(open_clip.get_tokenizer(local.name))
    return assemble_local_dir(local, tokenizer, device, family)


class OpenClipClipLoader:
    """Loader of the open_clip CLIP family (`pacs.metric.models.loader_registry`); after the SigLIP loader.

    Takes every ``backbone=`` name without ``checkpoint=`` that the SigLIP loader left (so also a ``local-dir:``
    folder it cannot read, whose error `read_local_dir` names) and a checkpoint folder in open_clip's layout.
    """

    name = "open_clip-clip"

    def detect(self, request: LoadRequest) -> bool:
        """A name alone, or an open_clip local-dir checkpoint folder."""
        if request.checkpoint is None:
            return request.backbone is not None
        return request.checkpoint.is_dir() and is_open_clip_folder(request.checkpoint)

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """The open_clip CLIP backbone of a name or local-dir folder."""
        if request.checkpoint is not None:
            return load_local_dir_clip(request.checkpoint, device=device, family=request.family)
        spec = str(request.backbone)
        if spec.startswith(LOCAL_DIR):
            return load_local_dir_clip(Path(spec[len(LOCAL_DIR):]), device=device, family=request.family)
        return load_open_clip_backbone(spec, device=device, family=request.family)
