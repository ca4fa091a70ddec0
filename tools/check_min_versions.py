"""Find the oldest release of each pure-Python dependency under which its test subset passes.

Slow and network-bound (it installs old releases from the package index), so it is run by hand when the
dependencies change, not in CI. For each dependency it:

1. lists the releases with ``pip index versions`` and keeps the first release of every minor version
   (a bound ``>=X.Y`` admits ``X.Y.0``, so that is the release the bound must work with);
2. bisects over those candidates (newest = the installed release, run first as it is): a candidate is
   installed into a private virtual environment that falls back to this interpreter's site-packages
   (so the pinned torch is reused, not re-installed), together with the project's other base dependencies within their
   declared ranges, so that pip's resolver downgrades whatever the candidate needs downgraded, and a
   candidate that cannot be installed with the other declared bounds fails;
3. runs the dependency's test subset with that environment's Python, from an extract of the last commit
   (``--worktree``: a copy of the working tree). Tests of the subset that already fail with the installed
   releases (work in progress elsewhere) are found first, left out of every candidate's run, and counted.

It prints (and with ``--out`` writes) a Markdown table: dependency, declared bound, oldest passing
release, and why the next-older candidate failed. ``--combined`` instead installs every declared lower
bound at once and runs every subset in that one environment.

Usage::

    python tools/check_min_versions.py                       # every dependency (about an hour on 2 cores)
    python tools/check_min_versions.py --deps peft ftfy      # a few
    python tools/check_min_versions.py --deps numpy --candidates numpy=1.26.0,2.0.0
    python tools/check_min_versions.py --combined            # all declared lower bounds together
"""

from __future__ import annotations

import argparse
import configparser
import dataclasses
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

LOG = logging.getLogger("check_min_versions")
REPO = Path(__file__).resolve().parents[1]
PINNED = ("torch", "torchvision", "pillow")  # pinned in requirements/pins.in: never lowered here
COMPILED = "numpy,scipy,matplotlib,safetensors,regex,pyyaml,tokenizers,contourpy,kiwisolver,pandas"
UNAVAILABLE = "Could not find a version that satisfies the requirement"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CI": "true"}


@dataclasses.dataclass(frozen=True)
class DepCheck:
    """One dependency: its distribution name, the pytest arguments of its subset, the oldest release to try."""

    name: str
    tests: tuple[str, ...]
    floor: str = "0"


@dataclasses.dataclass
class Outcome:
    """The result of trying one release: passed or not, and a one-line reason when not."""

    version: str
    passed: bool
    reason: str = ""
    seconds: float = 0.0
    installed: str = ""  # the release that actually ran (a later patch when `version` had no usable file)


@dataclasses.dataclass
class DepResult:
    """The bisection result for one dependency."""

    name: str
    declared: str
    oldest_passing: str
    next_older: str = ""
    next_older_failure: str = ""
    tried: list[Outcome] = dataclasses.field(default_factory=list)
    deselected: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CheckConfig:
    """Where to build the environment and how to run the tests."""

    venv: Path = Path("/tmp/venv-min")
    snapshot: Path = Path("/tmp/pacs-min-src")
    test_timeout_s: int = 1500
    install_timeout_s: int = 900
    nice: int = 19


# Each subset (pytest arguments) is a small set of tests that imports and exercises the dependency.
# The floors skip releases that cannot work with Python 3.11 / torch 2.x at all (no wheels, or far older than
# APIs that the code needs by name), to keep the bisection short; the table says when the floor was reached.
CHECKS: tuple[DepCheck, ...] = (
    DepCheck("open_clip_torch", ("tests/metric",), floor="2.20.0"),
    DepCheck("peft", ("tests/metric_train/test_metric_train_lora.py",), floor="0.6.0"),
    DepCheck("accelerate", ("tests/metric_train/test_metric_train_trainer.py", "tests/captioner/test_launching.py",
                            "-k", "projection_mode or early_stopping or resume_reproduces or launcher or count"),
             floor="0.20.0"),
    DepCheck("transformers", ("tests/metric_train/test_metric_train_positives.py",
                              "tests/rewards/test_rewards_dropin.py", "-k", "blip_captioner or generation_resumes or vision_encoder_decoder"),
             floor="4.30.0"),
    DepCheck("pycocoevalcap", ("tests/eval/test_eval_cider.py", "tests/eval/test_eval_text_metrics.py",
                               "tests/rewards/test_rewards_cider.py")),
    DepCheck("numpy", ("tests/eval/test_eval_correlation_grammar.py", "tests/eval/test_eval_cider.py",
                       "tests/metric/test_metric_scores.py"), floor="1.23.0"),
    DepCheck("scipy", ("tests/eval/test_eval_correlation_grammar.py", "tests/eval/test_eval_benchmarks_cli.py",
                       "-k", "not robustness and not contrastive and not missing_image"), floor="1.9.0"),
    DepCheck("safetensors", ("tests/metric/test_metric_backbones.py", "tests/captioner/test_captioner_units.py"),
             floor="0.3.0"),
    DepCheck("tqdm", ("tests/metric/test_metric_cli.py",), floor="4.40.0"),
    DepCheck("matplotlib", ("tests/demo/test_demo_report.py", "-k", "not chromium"), floor="3.6.0"),
    DepCheck("pyyaml", ("tests/common/test_common_config.py", "tests/datasets/test_datasets_loaders.py"),
             floor="5.1"),
    DepCheck("ftfy", ("tests/metric/test_metric_tokenizer.py",), floor="5.0"),
    DepCheck("regex", ("tests/metric/test_metric_tokenizer.py",), floor="2020.1.8"),
    DepCheck("lemminflect", ("tests/eval/test_eval_benchmarks_cli.py", "-k", "robustness")),
    DepCheck("pydantic", ("tests/common",), floor="2.0"),
    DepCheck("annotated-types", ("tests/common",), floor="0.4.0"),
    DepCheck("omegaconf", ("tests/common/test_common_config.py",), floor="2.1.0"),
)


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements(setup_cfg: Path) -> dict[str, Requirement]:
    """The base install_requires of setup.cfg, keyed by canonical name."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)
    lines = parser.get("options", "install_requires", fallback="").splitlines()
    reqs = [Requirement(line.split("#", 1)[0].strip()) for line in lines if line.split("#", 1)[0].strip()]
    return {canonical(r.name): r for r in reqs}


def available_versions(name: str) -> list[Version]:
    """Final releases of `name` on the index (``pip index versions``), oldest first."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                          capture_output=True, text=True, check=False)
    match = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if not match:
        raise RuntimeError(f"pip index versions {name} listed nothing: {proc.stderr.strip()[-300:]}")
    versions = []
    for text in match.group(1).split(","):
        try:
            version = Version(text.strip())
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease):
            versions.append(version)
    return sorted(set(versions))


def first_of_each_minor(versions: Sequence[Version], floor: Version, newest: Version) -> list[Version]:
    """The oldest release of each (major, minor) between floor and newest (inclusive), oldest first."""
    firsts: dict[tuple[int, int], Version] = {}
    for version in versions:
        if floor <= version <= newest:
            key = (version.major, version.minor)
            firsts[key] = min(firsts.get(key, version), version)
    return sorted(firsts.values())


def bisect_oldest(candidates: Sequence[str], passes: Callable[[str], Outcome]) -> tuple[int, list[Outcome]]:
    """Index of the oldest passing candidate, assuming the newest passes and passing is monotone."""
    tried: list[Outcome] = []
    lo, hi = 0, len(candidates) - 1  # candidates[hi] is known (assumed) to pass
    while lo < hi:
        mid = (lo + hi) // 2
        outcome = passes(candidates[mid])
        tried.append(outcome)
        if outcome.passed:
            hi = mid
        else:
            lo = mid + 1
    return hi, tried


def installed_version(name: str) -> Version:
    """The release of `name` installed in the interpreter running this script."""
    from importlib.metadata import version

    return Version(version(name))


def snapshot_tree(repo: Path, dest: Path, worktree: bool = False) -> None:
    """Extract the last commit (or copy the working tree) to `dest`, so that concurrent edits do not change a run."""
    if dest.exists():
        shutil.rmtree(dest)
    if worktree:
        shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info",
                                                                  ".pytest_cache", "runs", "outputs"))
        return
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "HEAD"], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def baseline_failures(check: DepCheck, config: CheckConfig) -> tuple[list[str], int]:
    """Node ids of the subset's tests that already fail with the installed releases (the code is in flux),
    and how many tests the subset skips there."""
    proc = subprocess.run(["nice", "-n", str(config.nice), sys.executable, "-m", "pytest", "-q", "-rfE",
                           "-p", "no:cacheprovider", *check.tests], cwd=config.snapshot, env=test_env(),
                          capture_output=True, text=True, timeout=config.test_timeout_s, check=False)
    if proc.returncode == 5:
        raise RuntimeError(f"{check.name}: no test selected by {' '.join(check.tests)} (CHECKS is out of date)")
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.MULTILINE)
    if proc.returncode != 0 and not failed:
        raise RuntimeError(f"{check.name}: the subset fails with the installed releases: "
                           f"{failure_line(proc.stdout + proc.stderr)}")
    return sorted(set(failed)), skipped_count(proc.stdout)


def skipped_count(output: str) -> int:
    """The number of skipped tests in a pytest summary line."""
    match = re.search(r"(\d+) skipped", output)
    return int(match.group(1)) if match else 0


def test_env() -> dict[str, str]:
    """The environment the tests run in: offline hubs, CI mode, the shared data folder."""
    return {**os.environ, **ENV, "PACS_SHARED": os.environ.get("PACS_SHARED", str(REPO.parent / "shared"))}


def fresh_venv(venv: Path) -> Path:
    """An empty virtual environment that falls back to this interpreter's site-packages (torch included); its python.

    Not `--system-site-packages`: run from a virtual environment (CI's `.venv-ci`), that would expose the base
    interpreter's packages. A `.pth` line per folder appends this interpreter's own site-packages after the venv's.
    """
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    folders = [entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))]
    (site / "runner_packages.pth").write_text("".join(f"{folder}\n" for folder in folders))
    return venv / "bin" / "python"


def install(python: Path, pins: Sequence[str], companions: Sequence[str], timeout_s: int) -> str:
    """pip-install the pins (and let the resolver adjust the companions) into `python`'s venv; '' or an error."""
    constraints = REPO / "requirements" / "pins.in"
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--prefer-binary",
           f"--only-binary={COMPILED}", "-c", str(constraints), *pins, *companions]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"install timed out after {timeout_s}s"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:] or ["(no message)"]
        return "install failed: " + errors[0][:200]
    return ""


def environment_versions(python: Path, names: Sequence[str]) -> dict[str, str]:
    """The versions `python` actually imports for each distribution name."""
    code = ("import json,sys\nfrom importlib.metadata import version\nout={}\n"
            "for n in sys.argv[1:]:\n    try: out[n]=version(n)\n    except Exception: out[n]='-'\n"
            "print(json.dumps(out))")
    proc = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def run_tests(python: Path, tests: Sequence[str], config: CheckConfig,
              deselect: Sequence[str] = (), allowed_skips: int = 0) -> tuple[bool, str]:
    """Run the test subset from the snapshot with `python`; (passed, one-line reason when not).

    More skipped tests than with the installed releases count as a failure (an import that an older
    release breaks would otherwise hide behind `pytest.importorskip`).
    """
    cmd = ["nice", "-n", str(config.nice), str(python), "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider",
           *tests, *(f"--deselect={node}" for node in deselect)]
    try:
        proc = subprocess.run(cmd, cwd=config.snapshot, env=test_env(), capture_output=True, text=True,
                              timeout=config.test_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return False, f"tests timed out after {config.test_timeout_s}s"
    if proc.returncode == 0 and skipped_count(proc.stdout) > allowed_skips:
        skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
        return False, f"{skipped_count(proc.stdout)} skipped (not {allowed_skips}): {skips[0] if skips else ''}"[:300]
    if proc.returncode == 0:
        return True, ""
    if proc.returncode == 5:
        return False, f"no test selected by {' '.join(tests)} (the subset in CHECKS is out of date)"
    return False, failure_line(proc.stdout + proc.stderr)


def failure_line(output: str) -> str:
    """The most telling line of a failed pytest run: the first `E ` error, else the summary line."""
    lines = output.splitlines()
    errors = [line[1:].strip() for line in lines if line.startswith("E ") and line[1:].strip()]
    summary = next((line.strip("= ") for line in reversed(lines) if line.startswith("=")), "")
    first = next((line for line in errors if "Error" in line or "assert" in line), errors[0] if errors else "")
    if first:
        text = f"{first} [{summary}]"
    else:
        text = summary or (lines[-1] if lines else "no output")
    return text.replace("|", "/")[:300]


def try_release(check: DepCheck, version: str, companions: Sequence[str], config: CheckConfig,
                deselect: Sequence[str] = (), same_minor: Sequence[str] = (), allowed_skips: int = 0) -> Outcome:
    """Install `check.name==version` into a fresh venv and run its tests.

    When the release has no installable file here (e.g. no wheel for this Python), the next releases of the
    same minor version (`same_minor`, oldest first) are tried instead; `Outcome.installed` says which one ran.
    """
    start = time.monotonic()
    python = fresh_venv(config.venv)
    error = install(python, [f"{check.name}=={version}"], companions, config.install_timeout_s)
    if error and UNAVAILABLE in error and same_minor:
        LOG.info("%s %s: not installable here, trying %s", check.name, version, same_minor[0])
        outcome = try_release(check, same_minor[0], companions, config, deselect, same_minor[1:], allowed_skips)
        outcome.version = version
        return outcome
    if error:
        outcome = Outcome(version, False, error, time.monotonic() - start)
    else:
        got = environment_versions(python, [check.name])[check.name]
        if Version(got) != Version(version):
            outcome = Outcome(version, False, f"environment imports {check.name} {got}, not {version}")
        else:
            passed, reason = run_tests(python, check.tests, config, deselect, allowed_skips)
            outcome = Outcome(version, passed, reason)
        outcome.seconds = time.monotonic() - start
    outcome.installed = version
    LOG.info("%s %s: %s%s (%.0fs)", check.name, version, "pass" if outcome.passed else "FAIL",
             f" - {outcome.reason}" if outcome.reason else "", outcome.seconds)
    return outcome


def check_dependency(check: DepCheck, declared: dict[str, Requirement], config: CheckConfig,
                     explicit: Sequence[str] | None = None) -> DepResult:
    """Bisect the oldest passing release of one dependency."""
    requirement = declared.get(canonical(check.name))
    declared_text = str(requirement.specifier) if requirement and requirement.specifier else "(none)"
    # the other dependencies within their declared ranges: a bound is only true if it can be installed with them
    companions = sorted(str(r) for key, r in declared.items() if key != canonical(check.name) and key not in PINNED)
    newest = installed_version(check.name)
    releases = available_versions(check.name)
    if explicit:
        candidates = [*sorted(explicit, key=Version), str(newest)]
    else:
        candidates = [str(v) for v in first_of_each_minor(releases, Version(check.floor), newest)]
        if not candidates or Version(candidates[-1]) != newest:
            candidates.append(str(newest))
    LOG.info("%s: %d candidates %s .. %s (installed %s)", check.name, len(candidates), candidates[0],
             candidates[-1], newest)
    deselect, skips = baseline_failures(check, config)
    if deselect:
        LOG.warning("%s: %d test(s) already fail with the installed releases, left out: %s", check.name,
                    len(deselect), " ".join(deselect))
    later = {c: [str(v) for v in releases if Version(c) < v < newest and v.release[:2] == Version(c).release[:2]]
             for c in candidates}
    index, tried = bisect_oldest(candidates,
                                 lambda v: try_release(check, v, companions, config, deselect, later[v], skips))
    ran = {o.version: o.installed for o in tried}
    result = DepResult(check.name, declared_text, ran.get(candidates[index]) or candidates[index], tried=tried,
                       deselected=deselect)
    older = [o for o in tried if not o.passed and Version(o.version) < Version(candidates[index])]
    if index > 0:
        below = candidates[index - 1]
        match = [o for o in older if o.version == below]
        result.next_older = (match[0].installed if match else "") or below
        result.next_older_failure = match[0].reason if match else "(not tried)"
    else:
        result.next_older_failure = f"(floor {check.floor}: older releases not tried)"
    return result


def check_combined(checks: Sequence[DepCheck], declared: dict[str, Requirement],
                   config: CheckConfig) -> list[Outcome]:
    """Install every declared lower bound at once (``==`` the bound) and run every subset in that environment.

    A subset that fails is run again with the installed releases; tests failing there too are left out and
    the subset re-run, so that work in progress elsewhere is not blamed on the bounds. One outcome per subset.
    """
    pins = []
    for key, requirement in declared.items():
        lower = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if lower and key not in PINNED:
            pins.append(f"{requirement.name}=={lower[0]}")
    python = fresh_venv(config.venv)
    error = install(python, pins, [], config.install_timeout_s)
    if error:
        return [Outcome(" ".join(pins), False, error)]
    LOG.info("combined environment: %s", environment_versions(python, [c.name for c in checks]))
    outcomes, seen = [], set()
    for check in checks:
        if check.tests in seen:
            continue
        seen.add(check.tests)
        start = time.monotonic()
        passed, reason = run_tests(python, check.tests, config)
        if not passed:
            deselect, skips = baseline_failures(check, config)
            if deselect or skips:
                LOG.info("%s subset: failing with the installed releases too: %s", check.name, " ".join(deselect))
                passed, reason = run_tests(python, check.tests, config, deselect, skips)
        outcomes.append(Outcome(check.name, passed, reason, time.monotonic() - start))
        LOG.info("%s subset under the lower bounds: %s %s", check.name, "pass" if passed else "FAIL", reason)
    return outcomes


def table(results: Sequence[DepResult]) -> str:
    """The Markdown result table."""
    rows = ["| dependency | declared bound | oldest passing | next-older candidate: failure | tests left out |",
            "|---|---|---|---|---|"]
    for r in results:
        failure = f"{r.next_older}: {r.next_older_failure}" if r.next_older else r.next_older_failure
        rows.append(f"| {r.name} | {r.declared} | {r.oldest_passing} | {failure} | {len(r.deselected)} |")
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deps", nargs="*", help="dependencies to check (default: every one in setup.cfg)")
    parser.add_argument("--candidates", nargs="*", default=[],
                        help="NAME=V1,V2 explicit older candidates instead of the index listing")
    parser.add_argument("--combined", action="store_true", help="install all declared lower bounds together")
    parser.add_argument("--venv", type=Path, default=CheckConfig.venv)
    parser.add_argument("--snapshot", type=Path, default=CheckConfig.snapshot)
    parser.add_argument("--worktree", action="store_true",
                        help="test the working tree (uncommitted edits included) instead of the last commit")
    parser.add_argument("--test-timeout", type=int, default=CheckConfig.test_timeout_s)
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) and the runs (JSON, .json)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    config = CheckConfig(venv=args.venv, snapshot=args.snapshot, test_timeout_s=args.test_timeout)
    declared = declared_requirements(REPO / "setup.cfg")
    checks = [c for c in CHECKS if canonical(c.name) in declared]
    if args.deps:
        unknown = {canonical(d) for d in args.deps} - {canonical(c.name) for c in CHECKS}
        if unknown:
            raise SystemExit(f"no test subset for {sorted(unknown)}; known: {[c.name for c in CHECKS]}")
        checks = [c for c in CHECKS if canonical(c.name) in {canonical(d) for d in args.deps}]
    explicit = {canonical(k): v.split(",") for k, v in (item.split("=", 1) for item in args.candidates)}
    snapshot_tree(REPO, config.snapshot, args.worktree)
    if args.combined:
        outcomes = check_combined(checks, declared, config)
        for outcome in outcomes:
            print(f"{outcome.version}: {'pass' if outcome.passed else 'FAIL ' + outcome.reason}")
        return 0 if all(o.passed for o in outcomes) else 1
    results = []
    for check in checks:
        results.append(check_dependency(check, declared, config, explicit.get(canonical(check.name))))
        LOG.info("%s: oldest passing %s", check.name, results[-1].oldest_passing)
    text = table(results)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
        args.out.with_suffix(".json").write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
