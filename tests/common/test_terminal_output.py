"""What a run shows on the terminal (issue 42 item 4): log lines above the bars, the checkpoint chatter and repeated
warnings in the run's log file only, each bar tagged with its process's seed, one closing summary line."""
from __future__ import annotations

import io
import logging
import re
from types import SimpleNamespace

import pytest

from pacs.captioner.demo.pipeline import stages_summary
from pacs.metric.common import progress as progress_module
from pacs.metric.common.progress import progress, set_progress_tag
from pacs.metric.common.terminal import TERMINAL_FILTER, BarSafeHandler, TerminalFilter, run_log


@pytest.fixture
def terminal():
    """The root logger writing to a string through the terminal handler and filter; restored afterwards."""
    root, stream = logging.getLogger(), io.StringIO()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = BarSafeHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(TERMINAL_FILTER)
    saved_repeats = dict(TERMINAL_FILTER.repeats)
    TERMINAL_FILTER.repeats.clear()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    yield stream
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    TERMINAL_FILTER.repeats.clear()
    TERMINAL_FILTER.repeats.update(saved_repeats)


def _record(name: str, level: int, msg: str, *args, **extra) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_the_filter_keeps_checkpoint_chatter_off_the_terminal_and_shows_a_repeated_warning_once():
    shown = TerminalFilter()
    assert not shown.filter(_record("accelerate.checkpointing", logging.INFO, "Model weights saved in %s", "x"))
    assert not shown.filter(_record("accelerate", logging.INFO, "Saving current state"))
    assert shown.filter(_record("accelerate.accelerator", logging.WARNING, "a real problem"))
    assert shown.filter(_record("accelerated", logging.INFO, "another library of that prefix"))  # not ours to drop
    assert not shown.filter(_record("pacs.x", logging.INFO, "checkpoint saved: %s", "p", terminal=False))
    assert shown.filter(_record("pacs.x", logging.INFO, "step %d", 1))
    assert shown.filter(_record("pacs.x", logging.INFO, "step %d", 1))  # INFO lines are never folded
    # the same warning template with other values: shown once, then counted
    assert shown.filter(_record("pacs.m", logging.WARNING, "step %d: reward rose %.3f", 1, 0.1))
    assert not shown.filter(_record("pacs.m", logging.WARNING, "step %d: reward rose %.3f", 2, 0.2))
    assert not shown.filter(_record("pacs.m", logging.WARNING, "step %d: reward rose %.3f", 3, 0.3))
    assert shown.filter(_record("pacs.other", logging.WARNING, "step %d: reward rose %.3f", 1, 0.1))
    assert shown.repeats == {("accelerate.accelerator", "a real problem"): 0,
                             ("pacs.m", "step %d: reward rose %.3f"): 2, ("pacs.other", "step %d: reward rose %.3f"): 0}


def test_the_run_log_keeps_everything_and_the_terminal_names_the_repeats(tmp_path, terminal):
    log = logging.getLogger("pacs.test_terminal")
    path = tmp_path / "logs" / "run.log"
    with run_log(path):
        logging.getLogger("accelerate.checkpointing").info("Model weights saved in %s", "w")
        log.info("checkpoint saved: %s", "c", extra={"terminal": False})
        for step in (1, 2, 3):
            log.warning("step %d: the reward rose", step)
    shown, kept = terminal.getvalue().splitlines(), path.read_text().splitlines()
    assert shown == ["WARNING pacs.test_terminal: step 1: the reward rose",
                     (f"INFO pacs.test_terminal: a warning was repeated 2 more time(s), all in {path}: "
                     "step %d: the reward rose")]
    assert [line.split(" ", 2)[2] for line in kept] == [
        "INFO accelerate.checkpointing: Model weights saved in w", "INFO pacs.test_terminal: checkpoint saved: c",
        *(f"WARNING pacs.test_terminal: step {step}: the reward rose" for step in (1, 2, 3))]
    # after the block the file takes nothing more
    log.warning("later")
    assert path.read_text().splitlines() == kept


def test_a_log_line_is_written_above_the_bar_not_glued_to_it(terminal):
    bar = progress(total=10, desc="xe", file=terminal, mininterval=0, ascii=True, ncols=60, dynamic_ncols=False)
    bar.update(4)
    logging.getLogger("pacs.test_terminal").info("val CIDEr 1.0")
    bar.update(1)
    bar.close()
    segments = re.split(r"[\r\n]", terminal.getvalue())
    assert "INFO pacs.test_terminal: val CIDEr 1.0" in segments  # a line of its own
    assert any(segment.startswith("xe:  50%") for segment in segments)  # the bar, redrawn after it


def test_a_plain_stream_handler_would_glue_the_line_to_the_bar():
    """The contrast that makes the test above discriminating: without `BarSafeHandler` the line follows the bar."""
    stream = io.StringIO()
    logger = logging.getLogger("pacs.test_terminal.plain")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        bar = progress(total=10, desc="xe", file=stream, mininterval=0, ascii=True, ncols=60, dynamic_ncols=False)
        bar.update(4)
        logger.warning("val CIDEr 1.0")
        bar.close()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert "val CIDEr 1.0" not in re.split(r"[\r\n]", stream.getvalue())


def test_bars_carry_the_process_tag_and_line(monkeypatch):
    monkeypatch.setattr(progress_module, "_CONTEXT", {"tag": "", "position": None})
    stream = io.StringIO()
    assert progress(total=1, desc="xe", file=stream).desc == "xe"
    set_progress_tag("seed 1", position=1)
    bar = progress(total=3, desc="scst-clip-s-kl0.1", file=stream)
    assert bar.desc == "[seed 1] scst-clip-s-kl0.1" and bar.pos in (1, -1)  # tqdm keeps -pos while drawing
    bar.close()
    assert progress(range(2), file=stream).desc == "[seed 1]"
    set_progress_tag("")
    assert progress(total=1, desc="xe", file=stream).desc == "xe"


@pytest.mark.parametrize(("ran", "resumed", "skipped", "seconds", "expected"), [
    (["data", "clip"], [], ["pacs"], 65.4, "stages: 2 run (data, clip), 1 reused in 1 min 05 s"),
    ([f"s{i}" for i in range(7)], ["x"], [], 7.6, "stages: 7 run, 1 resumed, 0 reused in 8 s"),
    ([], [], ["a", "b"], None, "stages: 0 run, 2 reused"),
])
def test_the_closing_summary_counts_the_stages_and_names_a_few(ran, resumed, skipped, seconds, expected):
    runner = SimpleNamespace(ran=ran, resumed=resumed, skipped=skipped)
    assert stages_summary(runner, seconds) == expected
