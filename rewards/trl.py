"""pacs rewards as TRL reward functions: `reward_function(spec, **model_options)` for `trl.GRPOTrainer`.

`GRPOTrainer` calls each reward function as
`reward_func(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_extra=..., log_metric=...,
**columns)`, with one list entry per completion (each prompt repeated `num_generations` times) and every
dataset column other than `prompt` passed as a keyword list; it expects one float (or None: "does not apply")
per completion. The callable returned here reads the images from the `image` column (one path, PIL image, image
tensor — uint8 `[C, H, W]` raw, or float `[3, H, W]` already preprocessed, see `pacs.metric.scoring.image_sources` — or
`datasets` image dict per row; or the `images` column with one image per row) and the reference captions from
the `references` column; both names are configurable. It builds the reward once with `pacs.rewards.build_reward`,
so image embeddings are cached across calls (an image is encoded once per run, whatever the number of
generations and steps). Nothing here imports `trl`: the callable follows its calling convention.

A mix such as `"pac-s++:1,rep-penalty:0.5,length-penalty:0.25"` (the guards as reward components) is one
function returning the weighted sum; `reward_functions(spec)` gives one function per component and their
weights instead, for `GRPOConfig(reward_weights=weights, multi_objective_aggregation="normalize_then_sum")`, TRL's
GDPO normalisation of each component within the prompt's generations (`pacs.rewards.mix` has the formula; pacs SCST's
`scst.mix_normalisation: normalize_then_sum` is the same). `monitor=pacs.rewards.monitor.CompletionMonitor()` gives a
TRL run pacs' hacking-monitor signals: length, Rep-n, distinct-n and %Incorrect of the completions of every call
(logged through TRL's `log_metric`), and a WARNING when the reward rises while they drift.
"""
from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.registry import METRICS
from pacs.rewards.base import Reward, WeightedReward
from pacs.rewards.monitor import CompletionMonitor
from pacs.rewards.registry import build_reward, parse_reward_spec
from pacs.rewards.resources import RewardResources

logger = logging.getLogger(__name__)

IMAGE_COLUMNS = ("image", "images")  # TRL's own image columns, tried in this order when none is named
REFERENCE_BASED_TEXT_REWARDS = frozenset({"cider", "length-penalty"})  # length-penalty: the refs limit
TRL_CONTROL_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})


def completion_text(completion: Any, row: int) -> str:
    """The caption of one completion: a plain string, or the text of the last assistant message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion and all(isinstance(m, dict) for m in completion):
        assistant = [message for message in completion if message.get("role", "assistant") == "assistant"]
        content = (assistant or list(completion))[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, (list, tuple)):
            return " ".join(part["text"] for part in content if isinstance(part, dict)
                            and part.get("type") == "text" and isinstance(part.get("text"), str))
        if content is None:
            return ""
    raise InputError(f"completions[{row}]: expected a string or a list of message dicts with 'content', "
                     f"got {type(completion).__name__}")


def decode_image(value: Any, row: int, column: str) -> Any:
    """One row's image as the scorer takes it: a path string or a PIL image (a `datasets` image dict is opened)."""
    from os import PathLike

    from PIL import Image

    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise InputError(f"column {column!r}, row {row}: {len(value)} images; the pacs reward scores the caption "
                             f"of one image per prompt")
        value = value[0]
    if isinstance(value, PathLike):
        return str(value)
    if isinstance(value, (str, Image.Image)):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):  # an image tensor
        return value
    if isinstance(value, dict) and (value.get("path") or value.get("bytes")):  # datasets.Image(decode=False)
        if value.get("bytes"):
            return Image.open(io.BytesIO(value["bytes"])).convert("RGB")
        return str(value["path"])
    raise InputError(f"column {column!r}, row {row}: expected an image path, a PIL image, an image tensor or a "
                     f"datasets image dict, got {type(value).__name__}")


def check_references(value: Any, row: int, column: str) -> list[str]:
    """One row's reference captions as a list of strings."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) \
            or not all(isinstance(caption, str) for caption in value):
        raise InputError(f"column {column!r}, row {row}: expected a list of reference captions, "
                         f"got {type(value).__name__}")
    return list(value)


class PacsRewardFunction:
    """A pacs reward (any spec) with TRL's reward-function calling convention; see `reward_function`."""

    def __init__(self, spec: str, image_column: str | None = None, references_column: str = "references",
                 name: str | None = None, monitor: CompletionMonitor | None = None, **model_options: Any) -> None:
        if model_options.pop("mix_normalisation", "weighted_sum") != "weighted_sum":
            raise InputError("reward_function: mix_normalisation= is not used by TRL's calling convention (one "
                             "reward per completion, groups unknown); use reward_functions(spec), which returns one "
                             "function per component and the weights, with GRPOConfig(reward_weights=weights, "
                             "multi_objective_aggregation='normalize_then_sum')")
        for key in ("image_loader", "image_paths", "image_embeddings"):
            if key in model_options:
                raise InputError(f"reward_function: {key}= is not used; the images arrive in the dataset column "
                                 f"{image_column or ' or '.join(map(repr, IMAGE_COLUMNS))}")
        terms = [term for term, _ in parse_reward_spec(spec)]
        self.spec = spec.strip()
        self.image_column = image_column
        self.references_column = references_column
        self.needs_images = any(term in METRICS for term in terms)
        self.needs_references = any(term in REFERENCE_BASED_TEXT_REWARDS
                                    or (term in METRICS and METRICS[term].reference_based) for term in terms)
        self.__name__ = name or self.spec.replace(" ", "")  # TRL logs rewards/<__name__>/mean
        self.resources: RewardResources = model_options.pop("resources", None) or RewardResources()
        self._batch_images: dict[str, Any] = {}
        self._load_image: Callable[[str], Any] = self._batch_images.__getitem__  # one object: one image cache
        self.reward: Reward = build_reward(spec, image_loader=self._load_image, resources=self.resources,
                                           **model_options)
        self.last_truncated: list[bool | None] = []  # per completion of the last call (None: not scored)
        self.n_truncated = 0  # completions cut to the text context, over all calls
        self.last_values: list[float | None] = []  # the rewards of the last call
        self.monitor = monitor
        # reward_functions: the (function, weight) pairs of the mix whose weighted sum the monitor observes
        self.monitor_group: list[tuple[PacsRewardFunction, float]] | None = None

    def _truncated_rows(self, n_rows: int) -> list[bool]:
        """Whether each scored row's caption was cut to the text context by any contrastive term."""
        rewards = [term for _, _, term in self.reward.components] if isinstance(self.reward, WeightedReward) \
            else [self.reward]
        flags = [False] * n_rows
        for reward in rewards:
            marks = getattr(reward.fn, "last_truncated", None)
            if marks is not None and marks.numel() == n_rows:
                flags = [flag or bool(mark) for flag, mark in zip(flags, marks.reshape(-1).tolist())]
        return flags

    def __repr__(self) -> str:
        return f"PacsRewardFunction({self.spec!r}, name={self.__name__!r})"

    @property
    def n_encoded(self) -> int:
        """How many distinct images the reward has encoded so far (over all calls)."""
        return sum(cache.n_encoded for cache in self.resources.image_caches.values())

    def _column(self, columns: dict[str, Any], names: Sequence[str], what: str, n: int) -> tuple[str, list[Any]]:
        """The first of `names` present in the batch, checked to hold one value per completion."""
        for column in names:
            if column in columns:
                values = list(columns[column])
                if len(values) != n:
                    raise InputError(f"reward {self.__name__!r}: column {column!r} has {len(values)} rows for "
                                     f"{n} completions")
                return column, values
        present = sorted(key for key in columns if key not in TRL_CONTROL_KWARGS)
        option = "image_column" if what == "images" else "references_column"
        raise InputError(f"reward {self.__name__!r} ({self.spec}) needs the {what} in the dataset column "
                         f"{' or '.join(map(repr, names))}, which the batch lacks (columns: {present or 'none'}); "
                         f"add it to the dataset or pass {option}= to reward_function")

    def _image_ids(self, images: list[Any], column: str) -> list[str | None]:
        """The id of each row's image (the scorer's identity of it: resolved path or pixel hash); None: no image."""
        from pacs.metric.scoring.scorer import Scorer

        ids: list[str | None] = []
        by_object: dict[int, str] = {}
        for row, value in enumerate(images):
            if value is None:
                ids.append(None)
                continue
            if id(value) not in by_object:
                source = decode_image(value, row, column)
                key = Scorer.image_key(source)  # the same identity the scorer caches the embedding under
                self._batch_images[key] = source
                by_object[id(value)] = key
            ids.append(by_object[id(value)])
        return ids

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 completion_ids: Sequence[Any] | None = None, trainer_state: Any = None,
                 log_extra: Callable[[str, list], None] | None = None,
                 log_metric: Callable[[str, float], None] | None = None, **columns: Any) -> list[float | None]:
        """One reward per completion (None where the row's image or references are None), as GRPOTrainer expects."""
        if completions is None:
            raise InputError(f"reward {self.__name__!r}: called without completions=")
        captions = [completion_text(completion, row) for row, completion in enumerate(completions)]
        n = len(captions)
        try:
            if self.needs_images:
                image_column, images = self._column(columns, [self.image_column] if self.image_column
                                                    else IMAGE_COLUMNS, "images", n)
                image_ids = self._image_ids(images, image_column)
            else:
                image_ids = [f"row{row}" for row in range(n)]
            references: list[list[str] | None] = [[] for _ in range(n)]
            if self.needs_references:
                ref_column, raw = self._column(columns, [self.references_column], "references", n)
                references = [None if value is None else check_references(value, row, ref_column)
                              for row, value in enumerate(raw)]
            rows = [row for row in range(n) if image_ids[row] is not None and references[row] is not None]
            values = self.reward([image_ids[row] for row in rows], [[captions[row]] for row in rows],
                                 [references[row] for row in rows]) if rows else None
        finally:
            self._batch_images.clear()  # the embeddings stay cached; the decoded images do not
        result: list[float | None] = [None] * n
        self.last_truncated = [None] * n
        cut = self._truncated_rows(len(rows)) if rows else []
        for index, row in enumerate(rows):
            result[row] = float(values[index, 0])
            self.last_truncated[row] = cut[index]
        self.n_truncated += sum(cut)
        if log_metric is not None and rows and self.needs_images:
            log_metric(f"{self.__name__}/truncated", float(sum(cut)) / len(rows))
        if log_metric is not None and isinstance(self.reward, WeightedReward) and rows:
            for term, term_values in self.reward.last_components.items():
                log_metric(f"{self.__name__}/{term}", float(term_values.mean()))
        self.last_values = result
        if self.monitor is not None:
            step = getattr(trainer_state, "global_step", None)
            prefix = "monitor" if self.monitor_group else f"{self.__name__}/monitor"
            self.monitor.observe(captions, self._monitored_rewards(result), step=step, log_metric=log_metric,
                                 prefix=prefix)
        return result

    def _monitored_rewards(self, result: list[float | None]) -> list[float | None]:
        """The rewards the monitor sees: this function's, or the weighted sum of the `reward_functions` group."""
        if not self.monitor_group:
            return result
        total: list[float | None] = [0.0] * len(result)
        for function, weight in self.monitor_group:
            values = function.last_values
            if len(values) != len(result):
                return [None] * len(result)
            total = [None if t is None or v is None else t + weight * v for t, v in zip(total, values)]
        return total


def reward_function(spec: str, *, image_column: str | None = None, references_column: str = "references",
                    name: str | None = None, monitor: CompletionMonitor | None = None,
                    **model_options: Any) -> PacsRewardFunction:
    """A TRL `GRPOTrainer` reward function scoring completions with the pacs reward `spec` (e.g. `"pac-s++"`).

    `model_options` are `pacs.rewards.build_reward`'s context (`backbone=`, `checkpoint=`, `scorer=`, `w=`,
    `device=`, `score=` "cosine" or "sigmoid", `long_captions=` "truncate" or "chunk", `train_references=` for
    `cider`, ...). After each call, `last_truncated` marks the completions cut to the text context (None where
    not scored) and `n_truncated` counts them over all calls; with TRL's `log_metric`, the share is logged as
    `<name>/truncated`. Images come from the dataset column `image_column`
    (default: `image`, else `images`), references from `references_column`; `name` is the name TRL logs
    (`rewards/<name>/mean`; default: the spec). `monitor` (`pacs.rewards.monitor.CompletionMonitor`) observes the
    completions and rewards of every call (module docstring).

    >>> from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    >>> from PIL import Image
    >>> fn = reward_function("clip-s", backbone=build_backbone_from_config(tiny_clip_config(), seed=0))
    >>> red = Image.new("RGB", (64, 64), (255, 0, 0))
    >>> scores = fn(prompts=["Describe."] * 2, completions=["a red square", "a dog"], completion_ids=[[1], [2]],
    ...             image=[red, red], trainer_state=None)
    >>> len(scores), fn.__name__, fn.n_encoded
    (2, 'clip-s', 1)
    """
    return PacsRewardFunction(spec, image_column=image_column, references_column=references_column, name=name,
                              monitor=monitor, **model_options)


def reward_functions(spec: str, *, image_column: str | None = None, references_column: str = "references",
                     monitor: CompletionMonitor | None = None,
                     **model_options: Any) -> tuple[list[PacsRewardFunction], list[float]]:
    """One TRL reward function per component of the mix `spec` (named by its term) and the weights, for
    `GRPOTrainer(reward_funcs=functions, args=GRPOConfig(reward_weights=weights,
    multi_objective_aggregation="normalize_then_sum"))`: TRL normalises each component within the prompt's
    generations before the weighting (GDPO; `pacs.rewards.mix`). The functions share one `RewardResources` (each image
    encoded once per reward model); `monitor` observes the weighted sum of the components (after the last one).

    >>> functions, weights = reward_functions("rep-penalty:1,length-penalty:0.5")
    >>> [f.__name__ for f in functions], weights
    (['rep-penalty', 'length-penalty'], [1.0, 0.5])
    >>> [f(prompts=["p"], completions=["a dog dog a dog"], references=[["a dog"]]) for f in functions]  # unweighted
    [[-1.0], [-3.0]]
    """
    terms = parse_reward_spec(spec)
    resources = model_options.pop("resources", None) or RewardResources()
    functions = [PacsRewardFunction(term, image_column=image_column, references_column=references_column,
                                    name=term, resources=resources, **model_options) for term, _ in terms]
    weights = [weight for _, weight in terms]
    if monitor is not None:
        functions[-1].monitor = monitor  # TRL calls the functions in order: the last one sees every component
        functions[-1].monitor_group = list(zip(functions, weights))
    return functions, weights
