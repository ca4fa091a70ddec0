"""Grammar-error rate: percentage of captions with at least one grammar error, through a pluggable checker.

Backends (one registry, `GRAMMAR_BACKENDS`):
- `harper` (default, offline): Harper's Rust grammar checker from PyPI (`pip install harper-py`, the `grammar`
  extra); rules meaningless for captions are disabled (sentence capitalisation, spelling, final punctuation,
  style/length rules).
- `languagetool`: LanguageTool through `language-tool-python`, only with a local install (`--languagetool-jar-dir
  DIR` / $PACS_LANGUAGETOOL_DIR) or a server (`--languagetool-url URL` / $PACS_LANGUAGETOOL_URL); nothing is
  downloaded. Casing, typography and whitespace categories are ignored.
The backend's name is always reported with the number.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm import tqdm

from pacs.metric.common.errors import InputError, MissingResourceError

log = logging.getLogger(__name__)


class GrammarChecker(Protocol):
    """A grammar checker: `name` and `errors(caption) -> list of rule ids`."""

    name: str

    def errors(self, caption: str) -> list[str]:
        """Rule ids of the grammar errors found in one caption."""


GRAMMAR_BACKENDS: dict[str, Callable[..., GrammarChecker]] = {}


def register_grammar_backend(name: str) -> Callable:
    """Decorator adding a checker factory to GRAMMAR_BACKENDS."""
    def decorator(factory: Callable[..., GrammarChecker]) -> Callable[..., GrammarChecker]:
        GRAMMAR_BACKENDS[name] = factory
        return factory
    return decorator


#: Harper rules that judge formatting or style rather than grammar, or that every caption would trip.
HARPER_DISABLED_RULES = (
    "SentenceCapitalization", "SpellCheck", "LongSentences", "UseTitleCase", "Spaces", "NoFrenchSpaces",
    "UnclosedQuotes", "UseEllipsisCharacter", "EllipsisLength", "OxfordComma", "Dashes", "QuoteSpacing",
    "CapitalizePersonalPronouns", "FillerWords", "Hedging", "BoringWords", "ProperNouns",
)


@register_grammar_backend("harper")
@dataclass
class HarperChecker:
    """Harper (offline, PyPI `harper-py`) with caption-irrelevant rules disabled."""

    name: str = "harper"
    disabled: Sequence[str] = HARPER_DISABLED_RULES
    _linter: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        try:
            import harper
        except ImportError:
            raise MissingResourceError("the offline grammar backend needs Harper: pip install harper-py "
                                       "(or pacs-captioning[grammar]); or choose grammar_backend=languagetool",
                                       parameter="grammar_backend") from None
        self._linter = harper.Linter()
        config = self._linter.get_default_lint_config()
        config.update({rule: False for rule in self.disabled if rule in config})
        self._linter.set_lint_config(config)
        from importlib import metadata

        try:
            self.name = f"harper (harper-py {metadata.version('harper-py')})"
        except metadata.PackageNotFoundError as error:  # pragma: no cover - metadata missing
            log.debug("harper-py has no package metadata (%s); the backend is named %r", error, self.name)

    def errors(self, caption: str) -> list[str]:
        """Rule names of Harper's lints for one caption."""
        return [rule for rule, lints in self._linter.organized_lints(caption).items() for _ in lints]


LANGUAGETOOL_IGNORED_CATEGORIES = ("CASING", "TYPOGRAPHY", "WHITESPACE", "PUNCTUATION", "STYLE", "TYPOS")


@register_grammar_backend("languagetool")
@dataclass
class LanguageToolChecker:
    """LanguageTool via language-tool-python, from a local jar folder or a server URL (never downloaded)."""

    jar_dir: str | None = None
    url: str | None = None
    name: str = "languagetool"
    _tool: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.jar_dir = self.jar_dir or os.environ.get("PACS_LANGUAGETOOL_DIR")
        self.url = self.url or os.environ.get("PACS_LANGUAGETOOL_URL")
        if not self.jar_dir and not self.url:
            raise MissingResourceError("the languagetool grammar backend needs a local LanguageTool folder "
                                       "(languagetool_jar_dir= / PACS_LANGUAGETOOL_DIR) or a server "
                                       "(languagetool_url= / PACS_LANGUAGETOOL_URL)",
                                       parameter=("languagetool_jar_dir", "languagetool_url"))
        try:
            import language_tool_python
        except ImportError:
            raise MissingResourceError("pip install language-tool-python (the `grammar` extra) to use LanguageTool") from None
        if self.url:
            self._tool = language_tool_python.LanguageTool("en-US", remote_server=self.url)
            self.name = f"languagetool ({self.url})"
        else:
            os.environ["LTP_JAR_DIR_PATH"] = str(self.jar_dir)
            self._tool = language_tool_python.LanguageTool("en-US")
            self.name = f"languagetool ({self.jar_dir})"

    def errors(self, caption: str) -> list[str]:
        """Rule ids of LanguageTool matches outside the ignored categories."""
        return [match.ruleId for match in self._tool.check(caption)
                if str(getattr(match, "category", "")).upper() not in LANGUAGETOOL_IGNORED_CATEGORIES]


def build_grammar_checker(backend: str = "harper", **options: object) -> GrammarChecker:
    """Instantiate a registered backend by name; InputError for an unknown one."""
    if backend not in GRAMMAR_BACKENDS:
        raise InputError(f"unknown grammar backend {backend!r} (known: {', '.join(GRAMMAR_BACKENDS)})")
    return GRAMMAR_BACKENDS[backend](**{k: v for k, v in options.items() if v is not None})


@dataclass
class GrammarResult:
    """Grammar-error rate (%), the backend that produced it and the per-caption error lists."""

    rate: float
    backend: str
    errors: list[list[str]]


def grammar_error_rate(captions: Sequence[str], checker: GrammarChecker | None = None) -> GrammarResult:
    """Percentage of captions with at least one grammar error (NaN for no captions)."""
    if isinstance(captions, str):
        raise InputError("captions must be a list of strings, not a single string")
    checker = checker or build_grammar_checker()
    found = [checker.errors(caption) if caption.strip() else []
             for caption in tqdm(captions, desc="grammar", leave=False, disable=len(captions) < 500)]
    rate = 100.0 * sum(bool(e) for e in found) / len(found) if found else float("nan")
    return GrammarResult(rate, checker.name, found)
