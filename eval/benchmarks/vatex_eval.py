"""VATEX-EVAL (EMScore release): loader for its pickles and the correlation protocol (Kendall tau_b and Spearman).

Released files in the data folder (`--data DIR`), as read by EMScore's `VATEX-EVAL-demo.py`:
- `candidates_list.pkl`: numpy array `[N]` of candidate captions (3,000 videos x 6 candidates);
- `gts_list.pkl`: numpy array `[N, R]` of reference captions per candidate (the first k are used with k refs);
- `human_scores.pkl`: numpy array of the 3 annotators' 1-5 ratings, laid out annotator-major:
  `reshape(3, -1).T` gives `[N, 3]`;
- `video_ids.pkl`: numpy array `[N]` of the video id of every candidate (video file `<id>.mp4`);
- optional `vatex_train_en_annotations.json` (`{video_id: [captions]}`): EMScore's IDF corpus; without it the
  benchmark's own references are the IDF corpus.
Pickles are read with a restricted unpickler (builtin containers, strings, numbers, numpy arrays only).

Protocol (EMScore's `compute_correlation_uniquehuman`): metric scores are rounded to 4 decimals; Kendall tau_b
(and tau_c) and Spearman rho are computed against each annotator separately and averaged over the 3.
Settings: no reference (reference-free metrics), 1 and 9 references (the first k of each row).
"""
from __future__ import annotations

import importlib
import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval import intervals
from pacs.eval.benchmarks import Benchmark, register_benchmark
from pacs.eval.caption_scoring import MetricSuite
from pacs.eval.registry import get_metric
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.scoring.registry import metric_spec
from pacs.metric.video.frames import FrameSampling, find_videos
from pacs.metric.video.options import VideoOptions, build_video_scorer, frame_sampling, idf_corpus

REFERENCE_SETTINGS = (0, 1, 9)
N_ANNOTATORS = 3
SCORE_DECIMALS = 4
FILES = ("candidates_list.pkl", "gts_list.pkl", "human_scores.pkl", "video_ids.pkl")
IDF_CORPUS_FILE = "vatex_train_en_annotations.json"

_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric")
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"), ("collections", "OrderedDict")}
    | {(module, name) for module in _NUMPY_CORE for name in ("_reconstruct", "scalar", "_frombuffer")}
    | {("builtins", name) for name in ("list", "dict", "tuple", "set", "frozenset", "str", "bytes", "bytearray",
                                       "int", "float", "complex", "bool")}
)


class RestrictedUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only the globals in `ALLOWED_GLOBALS`."""

    def __init__(self, handle: io.BufferedIOBase, where: str) -> None:
        super().__init__(handle, encoding="latin1")
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        """Resolve an allowed global; refuse everything else."""
        if (module, name) not in ALLOWED_GLOBALS:
            raise InputError(f"{self.where}: refusing to unpickle {module}.{name} "
                             "(only builtin containers, strings, numbers and numpy arrays are allowed)")
        if module.startswith("numpy.core."):  # pickles written by numpy 1.x; numpy 2 keeps these in numpy._core
            try:
                return getattr(importlib.import_module(module.replace("numpy.core.", "numpy._core.")), name)
            except ImportError:
                pass
        return getattr(importlib.import_module(module), name)


def load_pickle(path: str | os.PathLike) -> Any:
    """Load a pickle file with the restricted unpickler (InputError naming the file on any failure)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"file not found: {path}")
    try:
        with open(path, "rb") as handle:
            return RestrictedUnpickler(handle, str(path)).load()
    except InputError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        raise InputError(f"{path}: not a readable pickle ({error})") from None


@dataclass
class VatexEvalData:
    """The judged pairs: video id, candidate, references (in release order) and the 3 ratings of each."""

    video_ids: list[str]
    candidates: list[str]
    references: list[list[str]]
    human_scores: np.ndarray
    idf_corpus: list[str] | None = None

    def __len__(self) -> int:
        return len(self.candidates)

    def references_at(self, n_refs: int) -> list[list[str]]:
        """The first `n_refs` references of every candidate (an error when a row has fewer)."""
        for index, group in enumerate(self.references):
            if len(group) < n_refs:
                raise InputError(f"VATEX-EVAL row {index}: {len(group)} references, {n_refs} requested")
        return [group[:n_refs] for group in self.references]

    def subset(self, keep: np.ndarray) -> VatexEvalData:
        """The rows where `keep` is True (for skipped videos)."""
        rows = np.flatnonzero(keep)
        return VatexEvalData([self.video_ids[i] for i in rows], [self.candidates[i] for i in rows],
                             [self.references[i] for i in rows], self.human_scores[rows], self.idf_corpus)


def _strings(value: Any, where: str) -> list[str]:
    items = value.tolist() if isinstance(value, np.ndarray) else list(value)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise InputError(f"{where}: entry {index} is not a string ({type(item).__name__})")
    return items


def load_vatex_eval(data_dir: str | os.PathLike) -> VatexEvalData:
    """Load the released VATEX-EVAL files from a folder (every check names the file and the row)."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise InputError(f"VATEX-EVAL data folder not found: {folder}")
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{folder}: VATEX-EVAL files missing: {', '.join(missing)}")
    candidates = _strings(load_pickle(folder / "candidates_list.pkl"), str(folder / "candidates_list.pkl"))
    video_ids = [str(v) for v in np.asarray(load_pickle(folder / "video_ids.pkl")).reshape(-1).tolist()]
    raw_refs = load_pickle(folder / "gts_list.pkl")
    rows = raw_refs.tolist() if isinstance(raw_refs, np.ndarray) else list(raw_refs)
    references = [_strings(row, f"{folder / 'gts_list.pkl'} row {i}") for i, row in enumerate(rows)]
    scores = np.asarray(load_pickle(folder / "human_scores.pkl"), dtype=np.float64)
    n = len(candidates)
    if len(video_ids) != n or len(references) != n:
        raise InputError(f"{folder}: {n} candidates but {len(video_ids)} video ids and {len(references)} "
                         "reference rows")
    if scores.size != N_ANNOTATORS * n:
        raise InputError(f"{folder / 'human_scores.pkl'}: {scores.size} ratings for {n} candidates "
                         f"(expected {N_ANNOTATORS} per candidate)")
    human = scores.reshape(N_ANNOTATORS, -1).T
    return VatexEvalData(video_ids, candidates, references, human, _idf_corpus(folder))


def _idf_corpus(folder: Path) -> list[str] | None:
    path = folder / IDF_CORPUS_FILE
    if not path.is_file():
        return None
    data = read_json_file(path, "IDF corpus")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected {{video_id: [captions]}}")
    corpus: list[str] = []
    for video_id, captions in data.items():
        corpus.extend(_strings(captions, f"{path} video {video_id}"))
    return corpus


def correlations(metric_scores: np.ndarray, human_scores: np.ndarray,
                 decimals: int | None = SCORE_DECIMALS) -> dict[str, float]:
    """Kendall tau_b / tau_c and Spearman rho (x100) of scores against each annotator, averaged over annotators."""
    predictions = np.asarray(metric_scores, dtype=np.float64)
    if decimals is not None:
        predictions = np.around(predictions, decimals=decimals)
    human_scores = np.asarray(human_scores, dtype=np.float64)
    if human_scores.ndim == 1:
        human_scores = human_scores[:, None]
    if len(predictions) != len(human_scores):
        raise InputError(f"{len(predictions)} metric scores for {len(human_scores)} judged pairs")
    from scipy import stats  # imported on use: scipy.stats takes seconds to import

    tau_b, tau_c, rho = [], [], []
    for column in human_scores.T:
        tau_b.append(stats.kendalltau(predictions, column, variant="b").statistic)
        tau_c.append(stats.kendalltau(predictions, column, variant="c").statistic)
        rho.append(stats.spearmanr(predictions, column).statistic)
    return {"tau_b": 100 * float(np.mean(tau_b)), "tau_c": 100 * float(np.mean(tau_c)),
            "spearman": 100 * float(np.mean(rho)), "n": len(predictions)}


def default_idf_corpus(data: VatexEvalData) -> list[str]:
    """EMScore's IDF corpus when released (VATEX train captions), else each video's references once."""
    if data.idf_corpus:
        return data.idf_corpus
    seen: dict[str, list[str]] = {}
    for video_id, group in zip(data.video_ids, data.references):
        seen.setdefault(video_id, group)
    return [sentence for group in seen.values() for sentence in group]


def video_metric_scores(data: VatexEvalData, scorer: Any, videos: dict[str, Any], n_refs: int,
                        idf: Any = None) -> np.ndarray:
    """PAC-S++ video scores of every judged pair with `n_refs` references (0: reference-free, Eq. 13; else Eq. 14)."""
    references = data.references_at(n_refs) if n_refs else None
    result = scorer.score([videos[v] for v in data.video_ids], data.candidates, references, idf=idf)
    return result.scores


def setting_name(metric: str, n_refs: int) -> str:
    """Result key of a metric in a reference setting: the name alone without references, else `name@k`."""
    return metric if n_refs == 0 else f"{metric}@{n_refs}"


# ---------------------------------------------------------------------------------------------------------------
# `pacs correlate vatex-eval`
# ---------------------------------------------------------------------------------------------------------------

def locate_videos(context: Any, video_ids: list[str]) -> tuple[np.ndarray, dict[str, Path]]:
    """Find every video (`videos`, else `images`); a missing one is an error unless `skip_missing_images`."""
    options = context.options if isinstance(context.options, VideoOptions) else VideoOptions()
    folder = options.videos or context.images
    if folder is None and not context.image_map:
        raise InputError("video metrics need the videos: pass videos=", parameter="videos")
    found, missing = find_videos(folder, video_ids, context.image_map)
    keep = np.array([v in found for v in video_ids], dtype=bool)
    if missing:
        if not context.skip_missing_images:
            raise InputError(f"video {missing[0]!r} not found under {folder} ({len(missing)} missing; pass "
                             "skip_missing_images= to skip their pairs for every metric)",
                             parameter="skip_missing_images")
        context.count("skipped_missing_video", len(missing))
        context.count("skipped_pairs", int((~keep).sum()))
    return keep, found


def video_scorers(context: Any, sampling: Any) -> dict[str, Any]:
    """One VideoScorer per backbone family among the requested contrastive metrics (built from the model options)."""
    prompt = context.options.prompt if isinstance(context.options, VideoOptions) else ""
    scorers: dict[str, Any] = {}
    for name in context.metrics:
        if get_metric(name).kind == "contrastive":
            family = metric_spec(name).family
            if family not in scorers:
                scorers[family] = build_video_scorer(context.model, name, sampling, prompt=prompt)
    return scorers


def count_short_videos(context: Any, scorers: dict[str, Any]) -> None:
    """Report the videos that yielded fewer distinct frames than `--num-frames` asked (`counts.short_videos`)."""
    short = {report.source for scorer in scorers.values() for report in scorer.short_videos}
    if short:
        context.count("short_videos", len(short))


def text_scores(context: Any, candidates: list[str], references: list[list[str]]) -> dict[str, np.ndarray]:
    """Per-caption scores of the requested text and baseline metrics (the contrastive ones are scored on video)."""
    names = [name for name in context.metrics if get_metric(name).kind != "contrastive"]
    if not names:
        return {}
    suite = MetricSuite(names, spice_corenlp=context.suite.spice_corenlp)
    scores = suite.score(candidates, references, None)
    context.suite.unavailable.update(suite.unavailable)
    return scores


def _bootstrap(context: Any, table: dict[str, Any], scores: dict[str, np.ndarray], human: np.ndarray) -> None:
    names = list(scores)

    def statistic(indices: np.ndarray) -> dict[str, float]:
        return {name: correlations(scores[name][indices], human[indices])["tau_b"] for name in names}

    samples = intervals.bootstrap(statistic, len(human), context.bootstrap, context.seed)
    best = max(names, key=lambda name: table[name]["tau_b"])
    for name in names:
        table[name]["tau_b_ci"] = intervals.confidence_interval(samples[name])
        table[name]["p_value_vs_best"] = (None if name == best else
                                          intervals.paired_p_value(samples[best], samples[name]))
        table[name]["best"] = best


@register_benchmark("vatex-eval")
class VatexEval(Benchmark):
    """VATEX-EVAL: Kendall tau_b / Spearman rho (annotator-averaged) with 0, 1 and 9 references."""

    description = "VATEX-EVAL (video): Kendall tau-b and Spearman rho with 0, 1 and 9 references"
    default_sampling = FrameSampling(fps=None, num_frames=10)  # EMScore: 10 frames uniformly over the video
    options_class = VideoOptions  # sampling default: 10 frames spread uniformly

    def run(self, context: Any) -> dict[str, Any]:
        """`{metric: {...}}` for reference-free metrics, `{metric@k: {...}}` for k = 1, 9 references."""
        data = load_vatex_eval(context.data)
        videos: dict[str, Path] = {}
        if context.suite.needs_images:
            keep, videos = locate_videos(context, data.video_ids)
            data = data.subset(keep) if not keep.all() else data
        if len(data) == 0:
            raise InputError(f"{context.data}: no VATEX-EVAL pair left to score")
        options = self.options_of(context)
        scorers = video_scorers(context, frame_sampling(options, self.default_sampling))
        corpus, _ = idf_corpus(options, default_idf_corpus(data))
        idf_tables = {family: scorer.idf(corpus) for family, scorer in scorers.items()}
        scores: dict[str, np.ndarray] = {}
        for name in context.metrics:
            metric = get_metric(name)
            if metric.kind == "contrastive":
                family = metric_spec(name).family
                settings = [n for n in REFERENCE_SETTINGS if (n > 0) == metric.reference_based]
                for n_refs in settings:
                    scores[setting_name(name, n_refs)] = video_metric_scores(data, scorers[family], videos, n_refs,
                                                                             idf_tables[family])
        count_short_videos(context, scorers)
        if any(get_metric(name).kind == "baseline" for name in context.metrics):
            scores.update({name: values for name, values in text_scores(context, data.candidates,
                                                                        data.references).items()
                           if get_metric(name).kind == "baseline"})
        if any(get_metric(name).kind == "text" for name in context.metrics):  # (`length` alone needs no refs)
            for n_refs in REFERENCE_SETTINGS[1:]:
                for name, values in text_scores(context, data.candidates, data.references_at(n_refs)).items():
                    if get_metric(name).kind == "text":
                        scores[setting_name(name, n_refs)] = values
        scores = {key: scores[key] for name in context.metrics for key in
                  (name, setting_name(name, 1), setting_name(name, 9)) if key in scores}
        table: dict[str, Any] = {}
        for key, values in scores.items():
            base = key.split("@")[0]
            if base in context.suite.unavailable:
                table[key] = {"tau_b": None, "tau_c": None, "spearman": None, "n": 0,
                              "unavailable": context.suite.unavailable[base]}
            else:
                table[key] = correlations(values, data.human_scores)
        available = {k: v for k, v in scores.items() if table[k].get("tau_b") is not None}
        if context.bootstrap and available:
            _bootstrap(context, table, available, data.human_scores)
        return table
