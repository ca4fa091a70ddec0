"""Finding Java for the pycocoevalcap jars (PTB tokenizer, METEOR, SPICE) and failing clearly without it."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from pacs.metric.common.errors import MissingResourceError

#: Metrics that run a Java program (the PTB tokenizer is needed by every pycocoevalcap metric).
JAVA_METRICS = ("meteor", "spice")


def java_executable() -> str | None:
    """The `java` to use: $PACS_JAVA, then $JAVA_HOME/bin/java, then `java` on PATH (None when absent)."""
    for candidate in (os.environ.get("PACS_JAVA"),
                      os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def require_java(needed_by: Sequence[str]) -> str:
    """Return the java executable or raise one error naming the metrics that need it."""
    java = java_executable()
    if java is None:
        raise MissingResourceError(
            f"Java is not installed but {', '.join(needed_by)} need it (pycocoevalcap's jars): install a JRE "
            "(e.g. `apt-get install default-jre-headless`) or point PACS_JAVA / JAVA_HOME at one")
    return java


def parse_java_version(text: str) -> int:
    """Major version from `java -version` output ('1.8.0_101' -> 8, '17.0.15' -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        match = re.search(r"(?:openjdk|java) (\d+)(?:\.(\d+))?", text)
    if not match:
        raise MissingResourceError(f"cannot read the Java version from: {text.strip()[:200]}")
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    return minor if major == 1 else major


@functools.lru_cache(maxsize=8)
def java_major_version(java: str) -> int:
    """Major version of a java executable."""
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return parse_java_version(result.stderr + result.stdout)
