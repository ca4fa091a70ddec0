"""Video-caption input files: candidates keyed by `video_id` and IDF corpus files."""
from __future__ import annotations

from pathlib import Path

from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.scoring.score_inputs import Candidate, load_candidates, load_references


def load_sentences(path: str | Path) -> list[str]:
    """An IDF corpus file: a JSON list of sentences, or any references file `pacs score` accepts."""
    data = read_json_file(path, "IDF corpus")
    if isinstance(data, list):
        for index, sentence in enumerate(data):
            if not isinstance(sentence, str):
                raise InputError(f"{path}: IDF corpus entry #{index} is not a string: {sentence!r}")
        return data
    return [sentence for group in load_references(path).values() for sentence in group]


def load_video_candidates(path: str | Path) -> list[Candidate]:
    """The `pacs score` candidate formats, plus a results list keyed by `video_id` instead of `image_id`."""
    data = read_json_file(path, "candidates")
    if not (isinstance(data, list) and data and all(isinstance(item, dict) and "video_id" in item
                                                    and "image_id" not in item for item in data)):
        return load_candidates(path)
    candidates = []
    for index, item in enumerate(data):
        video_id, caption = item["video_id"], item.get("caption")
        if not isinstance(video_id, (str, int)) or isinstance(video_id, bool):
            raise InputError(f"{path}: entry #{index} has a video_id that is not a string or integer: {video_id!r}")
        if not isinstance(caption, str):
            raise InputError(f"{path}: candidate #{index} (video id {video_id!r}) has no caption string")
        candidates.append(Candidate(video_id, caption))
    return candidates
