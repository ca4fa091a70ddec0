"""Which requested metrics cannot run on this machine for want of Java, checked when a config or command loads.

BLEU, ROUGE-L and CIDEr-D need no Java (their PTB tokenization is `pacs.eval.ptb`, in Python); METEOR and SPICE run
pycocoevalcap's jars. `missing_java_problems` turns a metric list into one line per metric that cannot run, so a
command can refuse before any training or scoring starts.
"""
from __future__ import annotations

from collections.abc import Iterable

from pacs.eval.java_runtime import java_executable
from pacs.eval.registry import ALIASES, METRICS

#: what each Java metric runs, for the message
_JARS = {"meteor": "pycocoevalcap's METEOR 1.5 jar", "spice": "pycocoevalcap's SPICE jar"}


def java_metric_names(metric_names: Iterable[str]) -> list[str]:
    """The canonical names among `metric_names` that need Java (unknown names are left to the metric parser)."""
    names = []
    for name in metric_names:
        key = str(name).strip().lower()
        key = ALIASES.get(key, key)
        if key in METRICS and METRICS[key].needs_java and key not in names:
            names.append(key)
    return names


def missing_java_problems(metric_names: Iterable[str]) -> list[str]:
    """One line per requested metric that needs Java when none is found (empty when all can run)."""
    needing = java_metric_names(metric_names)
    if not needing or java_executable() is not None:
        return []
    return [f"metric {name} needs Java ({_JARS[name]}) but no `java` was found: install a JRE "
            "(e.g. `apt-get install default-jre-headless`, or point PACS_JAVA / JAVA_HOME at one) "
            f"or drop {name} from the metrics" for name in needing]
