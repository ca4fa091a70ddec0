"""ActivityNet-FOIL (EMScore release): loader for its JSON files and the accuracy protocol.

Released files in the data folder (`--data DIR`), as read by EMScore's `ActivityNet-FOIL_demo.py`:
- `final_right_video_sentences.json` / `final_foil_video_sentences.json`: dense-captioning submissions
  `{"results": {video_id: [{"sentence": ...}, ...]}}`, the correct and the foiled paragraph, segment by segment;
- `anet_entities_test_1.json`: `{video_id: {"duration", "timestamps": [[start, end], ...], "sentences"}}`, whose
  timestamps locate the candidate segments (segment i of a submission is timestamp i);
- `anet_entities_test_2.json`: the second annotated paragraph of each video, used as references;
- optional `train.json` (ActivityNet Captions train, same form): the IDF corpus (sentences of more than 66 words
  are left out, as in EMScore); without it the references are the IDF corpus.

Protocol: each segment is scored against the frames of its time span (frame i of n sampled frames belongs to
`[start*n//duration, end*n//duration)`, at least one frame) and, for reference-based metrics, against the
second paragraph's sentences whose span overlaps it by more than 40% of their own (integer seconds, EMScore's
rule; all of them when none does). A paragraph's score is the mean of its segments' scores. Accuracy is the share
of videos whose correct paragraph scores higher than the foiled one; a tie counts as half.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval import intervals
from pacs.eval.benchmarks import Benchmark, register_benchmark
from pacs.eval.benchmarks.vatex_eval import count_short_videos, locate_videos, text_scores, video_scorers
from pacs.eval.registry import get_metric
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.scoring.registry import metric_spec
from pacs.metric.video.frames import FrameSampling
from pacs.metric.video.options import VideoOptions, frame_sampling, idf_corpus

RIGHT_FILE = "final_right_video_sentences.json"
FOIL_FILE = "final_foil_video_sentences.json"
TIMESTAMPS_FILE = "anet_entities_test_1.json"
REFERENCES_FILE = "anet_entities_test_2.json"
IDF_CORPUS_FILE = "train.json"
MAX_IDF_SENTENCE_WORDS = 66
OVERLAP_THRESHOLD = 0.4


@dataclass
class FoilSegment:
    """One segment: its time span, the correct and the foiled sentence, and its references."""

    timestamp: tuple[float, float]
    right: str
    foil: str
    references: list[str]


@dataclass
class FoilVideo:
    """A video with its duration (seconds) and its segments in paragraph order."""

    video_id: str
    duration: float
    segments: list[FoilSegment] = field(default_factory=list)


@dataclass
class ActivityNetFoilData:
    """The foil-correct paragraph pairs, video by video, and the IDF corpus when released."""

    videos: list[FoilVideo]
    idf_corpus: list[str] | None = None

    def __len__(self) -> int:
        return len(self.videos)

    def all_references(self) -> list[str]:
        """The reference sentences of every video, each once per video (the default IDF corpus)."""
        return [r for video in self.videos
                for r in dict.fromkeys(r for segment in video.segments for r in segment.references)]


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise InputError(f"ActivityNet-FOIL file missing: {path}")
    return read_json_file(path, "ActivityNet-FOIL")


def _submission(path: Path) -> dict[str, list[str]]:
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise InputError(f"{path}: expected {{\"results\": {{video_id: [{{\"sentence\": ...}}]}}}}")
    result: dict[str, list[str]] = {}
    for video_id, segments in data["results"].items():
        if not isinstance(segments, list):
            raise InputError(f"{path}: video {video_id}: expected a list of segments")
        sentences = []
        for index, segment in enumerate(segments):
            if not isinstance(segment, dict) or not isinstance(segment.get("sentence"), str):
                raise InputError(f"{path}: video {video_id} segment {index}: no \"sentence\" string")
            sentences.append(segment["sentence"])
        result[video_id] = sentences
    return result


def _annotation(data: Any, path: Path, video_id: str) -> tuple[float, list[tuple[float, float]], list[str]]:
    entry = data.get(video_id) if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        raise InputError(f"{path}: video {video_id} missing")
    try:
        duration = float(entry["duration"])
        stamps = [(float(s), float(e)) for s, e in entry["timestamps"]]
        sentences = [str(s) for s in entry.get("sentences", [])]
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"{path}: video {video_id}: malformed entry ({error})") from None
    if duration <= 0:
        raise InputError(f"{path}: video {video_id}: duration must be > 0 (got {duration})")
    return duration, stamps, sentences


def overlapping_references(timestamp: tuple[float, float], ref_timestamps: list[tuple[float, float]]) -> list[int]:
    """Indices of the reference spans covered by more than 40% by `timestamp` (integer seconds, inclusive)."""
    a, b = int(timestamp[0]), int(timestamp[1])
    chosen = []
    for index, (start, end) in enumerate(ref_timestamps):
        c, d = int(start), int(end)
        span = d - c + 1
        if span <= 0:
            continue
        common = max(0, min(b, d) - max(a, c) + 1)
        if common / span > OVERLAP_THRESHOLD:
            chosen.append(index)
    return chosen


def segment_frames(timestamp: tuple[float, float], duration: float, n_frames: int) -> slice:
    """The frames of a segment among `n_frames` sampled uniformly in time over `duration` (at least one)."""
    start = int(timestamp[0] * n_frames // duration)
    end = int(timestamp[1] * n_frames // duration)
    start = min(max(start, 0), n_frames - 1)
    end = min(max(end, start + 1), n_frames)
    return slice(start, end)


def load_activitynet_foil(data_dir: str | os.PathLike) -> ActivityNetFoilData:
    """Load the released ActivityNet-FOIL files from a folder (every check names the file and the video)."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise InputError(f"ActivityNet-FOIL data folder not found: {folder}")
    right = _submission(folder / RIGHT_FILE)
    foil = _submission(folder / FOIL_FILE)
    stamps_data = _read_json(folder / TIMESTAMPS_FILE)
    refs_data = _read_json(folder / REFERENCES_FILE)
    if set(right) != set(foil):
        only = sorted(set(right) ^ set(foil))
        raise InputError(f"{folder}: correct and foiled submissions cover different videos (e.g. {only[0]})")
    videos = []
    for video_id in right:
        if not right[video_id]:
            raise InputError(f"{folder / RIGHT_FILE}: video {video_id}: no segments")
        if len(right[video_id]) != len(foil[video_id]):
            raise InputError(f"{folder / FOIL_FILE}: video {video_id}: {len(foil[video_id])} segments, "
                             f"the correct paragraph has {len(right[video_id])}")
        duration, stamps, _ = _annotation(stamps_data, folder / TIMESTAMPS_FILE, video_id)
        _, ref_stamps, ref_sentences = _annotation(refs_data, folder / REFERENCES_FILE, video_id)
        if len(stamps) < len(right[video_id]):
            raise InputError(f"{folder / TIMESTAMPS_FILE}: video {video_id}: {len(stamps)} timestamps for "
                             f"{len(right[video_id])} segments")
        if not ref_sentences or len(ref_sentences) != len(ref_stamps):
            raise InputError(f"{folder / REFERENCES_FILE}: video {video_id}: {len(ref_sentences)} sentences for "
                             f"{len(ref_stamps)} timestamps")
        video = FoilVideo(video_id, duration)
        for index, (good, bad) in enumerate(zip(right[video_id], foil[video_id])):
            chosen = overlapping_references(stamps[index], ref_stamps) or list(range(len(ref_stamps)))
            video.segments.append(FoilSegment(stamps[index], good, bad, [ref_sentences[i] for i in chosen]))
        videos.append(video)
    if not videos:
        raise InputError(f"{folder / RIGHT_FILE}: no videos")
    return ActivityNetFoilData(videos, _idf_corpus(folder / IDF_CORPUS_FILE))


def _idf_corpus(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    data = _read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected {{video_id: {{\"sentences\": [...]}}}}")
    corpus = []
    for video_id, entry in data.items():
        sentences = entry.get("sentences") if isinstance(entry, dict) else None
        if not isinstance(sentences, list):
            raise InputError(f"{path}: video {video_id}: no \"sentences\" list")
        corpus.extend(str(s) for s in sentences if len(str(s).split(" ")) <= MAX_IDF_SENTENCE_WORDS)
    return corpus


def paragraph_scores(data: ActivityNetFoilData, segment_scores: np.ndarray) -> np.ndarray:
    """Mean of consecutive segment scores per video (segments in `data` order, all videos concatenated)."""
    segment_scores = np.asarray(segment_scores, dtype=np.float64)
    counts = [len(video.segments) for video in data.videos]
    if segment_scores.shape != (sum(counts),):
        raise InputError(f"{segment_scores.shape[0]} segment scores for {sum(counts)} segments")
    bounds = np.cumsum([0] + counts)
    return np.array([segment_scores[bounds[i]:bounds[i + 1]].mean() for i in range(len(counts))])


def foil_accuracy(right_scores: np.ndarray, foil_scores: np.ndarray) -> float:
    """Percentage of pairs where the correct paragraph scores higher (a tie counts as half)."""
    right_scores, foil_scores = np.asarray(right_scores), np.asarray(foil_scores)
    if right_scores.shape != foil_scores.shape or right_scores.size == 0:
        raise InputError(f"{right_scores.size} correct and {foil_scores.size} foiled paragraph scores")
    wins = (right_scores > foil_scores).astype(np.float64) + 0.5 * (right_scores == foil_scores)
    return 100.0 * float(wins.mean())


def video_paragraph_scores(data: ActivityNetFoilData, scorer: Any, videos: dict[str, Any],
                           use_references: bool, idf: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """PAC-S++ video scores of the correct and the foiled paragraph of every video (segment means).

    Each video is embedded once (frames cached per video); a segment is scored against its frames only.
    """
    frame_embs, right, foil, references = [], [], [], []
    for video in data.videos:
        embeddings = scorer.embed_video(videos[video.video_id])
        for segment in video.segments:
            frame_embs.append(embeddings[segment_frames(segment.timestamp, video.duration, embeddings.shape[0])])
            right.append(segment.right)
            foil.append(segment.foil)
            references.append(segment.references)
    refs = references if use_references else None
    right_scores = scorer.score_embeddings(frame_embs, right, refs, idf=idf).scores
    foil_scores = scorer.score_embeddings(frame_embs, foil, refs, idf=idf).scores
    return paragraph_scores(data, right_scores), paragraph_scores(data, foil_scores)


def default_idf_corpus(data: ActivityNetFoilData) -> list[str]:
    """EMScore's IDF corpus when released (ActivityNet Captions train), else the references."""
    return data.idf_corpus or data.all_references()


CATEGORY = "1-ref"  # the paper's column: one paragraph of references


@register_benchmark("activitynet-foil")
class ActivityNetFoil(Benchmark):
    """ActivityNet-FOIL: accuracy of preferring the correct paragraph over the foiled one."""

    description = "ActivityNet-FOIL (video): accuracy on 1,900 foil-correct paragraph pairs"
    default_sampling = FrameSampling(fps=1.0)
    options_class = VideoOptions  # sampling default: 1 frame per second

    def run(self, context: Any) -> dict[str, Any]:
        """`{metric: {"1-ref": accuracy, "mean": accuracy, "n": videos}}`."""
        data = load_activitynet_foil(context.data)
        videos: dict[str, Any] = {}
        if context.suite.needs_images:
            keep, videos = locate_videos(context, [video.video_id for video in data.videos])
            data = ActivityNetFoilData([v for v, k in zip(data.videos, keep) if k], data.idf_corpus)
        if len(data) == 0:
            raise InputError(f"{context.data}: no ActivityNet-FOIL video left to score")
        options = self.options_of(context)
        scorers = video_scorers(context, frame_sampling(options, self.default_sampling))
        corpus, _ = idf_corpus(options, default_idf_corpus(data))
        idf_tables = {family: scorer.idf(corpus) for family, scorer in scorers.items()}
        segments = [segment for video in data.videos for segment in video.segments]
        references = [segment.references for segment in segments]
        right_text = text_scores(context, [s.right for s in segments], references)
        foil_text = text_scores(context, [s.foil for s in segments], references)
        right: dict[str, np.ndarray] = {}
        foil: dict[str, np.ndarray] = {}
        for name in context.metrics:
            metric = get_metric(name)
            if metric.kind == "contrastive":
                family = metric_spec(name).family
                right[name], foil[name] = video_paragraph_scores(data, scorers[family], videos,
                                                                 metric.reference_based, idf_tables[family])
            else:
                right[name] = paragraph_scores(data, right_text[name])
                foil[name] = paragraph_scores(data, foil_text[name])
        count_short_videos(context, scorers)
        table: dict[str, Any] = {}
        for name, right_scores in right.items():
            if name in context.suite.unavailable:
                table[name] = {"unavailable": context.suite.unavailable[name]}
                continue
            accuracy = foil_accuracy(right_scores, foil[name])
            table[name] = {CATEGORY: accuracy, "mean": accuracy, "n": len(data)}
        available = [name for name in right if name not in context.suite.unavailable]
        if context.bootstrap and available:
            samples = intervals.bootstrap(
                lambda idx: {n: foil_accuracy(right[n][idx], foil[n][idx]) for n in available},
                len(data), context.bootstrap, context.seed)
            best = max(available, key=lambda n: table[n]["mean"])
            for name in available:
                table[name]["mean_ci"] = intervals.confidence_interval(samples[name])
                table[name]["p_value_vs_best"] = (None if name == best else
                                                  intervals.paired_p_value(samples[best], samples[name]))
        return table
