"""Record a tree's observable outputs, and compare two recordings: the proof that a "no behaviour change" holds.

    python tools/golden_outputs.py record OUT [--runs demo_smoke flickr8k_tiny]
    python tools/golden_outputs.py compare BEFORE AFTER [--renames renames.json]

`record` runs, with one torch thread (`threads: 1`, OMP/MKL 1), `pacs --help`, every `pacs CMD --help`, and
`pacs train --config NAME` for each preset in `--runs`, into a scratch folder; it keeps every run's
results.json / .md / .csv, every stage's fingerprint record and every metrics JSON (the run's *.json, *.md and
*.csv files) under OUT. `compare` prints each difference between two recordings, after the renames that the
change declares (a JSON object old -> new, applied to the BEFORE side's text and file names), ignoring values
that differ between two runs of one tree (wall times, dates, absolute paths of the scratch folder, versions).
It exits 1 if anything else differs, 0 if the recordings are identical.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KEPT_SUFFIXES = (".json", ".md", ".csv", ".txt")
# Keys whose values change between two runs of one tree: timings, clocks, hosts, versions, the scratch path.
VOLATILE_KEY = re.compile(
    r"(^|_)(seconds|wall|time|times|elapsed|duration|date|timestamp|started|finished|created|host|hostname|pid|"
    r"version|versions|commit|python|torch|platform|machine|cpu|threads_available|command|argv|cwd|"
    r"throughput|per_second|rate|eta|s)($|_)"
)
# Keys that hold a run's random nonces (output ids, and the fingerprints and keys built from upstream ids) or
# the bytes of files that name the scratch folder: their content is compared through the tensors and the rest.
NONCE_KEY = re.compile(r"^(output_id|upstream|keys|fingerprint|digest|sha256|checkpoint_sha256|mtime_ns|size)$|shard-")
SCRATCH_MARK = "<scratch>"


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run one command and return its completed process (output captured)."""
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _subcommands(pacs: str, env: dict[str, str], cwd: Path) -> list[str]:
    """The sub-command names `pacs --help` lists."""
    text = _run([pacs, "--help"], cwd, env).stdout
    return re.findall(r"^    ([a-z][a-z0-9-]*)(?:\s|$)", text, flags=re.MULTILINE)


def record(out: Path, runs: list[str], pacs: str) -> int:
    """Record the help texts and the listed presets' run outputs of the installed `pacs` under `out`."""
    out.mkdir(parents=True, exist_ok=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="120")
    with tempfile.TemporaryDirectory(prefix="pacs-golden-") as scratch_name:
        scratch = Path(scratch_name)
        help_dir = out / "help"
        help_dir.mkdir()
        top = _run([pacs, "--help"], scratch, env)
        (help_dir / "pacs.txt").write_text(top.stdout + top.stderr)
        for name in _subcommands(pacs, env, scratch):
            shown = _run([pacs, name, "--help"], scratch, env)
            (help_dir / f"pacs-{name}.txt").write_text(shown.stdout + shown.stderr)
        for preset in runs:
            result = _run([pacs, "train", "--config", preset], scratch, env)
            (out / f"{preset}.exit").write_text(f"{result.returncode}\n")
            (out / f"{preset}.stdout.txt").write_text(result.stdout.replace(str(scratch), SCRATCH_MARK))
            runs_dir = scratch / "runs"
            _record_tensors(runs_dir, scratch, out / "runs" / f"{preset}.tensors.json")
            for path in sorted(runs_dir.rglob("*")) if runs_dir.is_dir() else []:
                if path.is_file() and path.suffix in KEPT_SUFFIXES:
                    target = out / "runs" / path.relative_to(runs_dir)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(path.read_text(errors="replace").replace(str(scratch), SCRATCH_MARK))
            shutil.rmtree(runs_dir, ignore_errors=True)
            print(f"{preset}: exit {result.returncode}")
    return 0


def _record_tensors(runs_dir: Path, scratch: Path, target: Path) -> None:
    """Write the sha256 of every safetensors file's tensors (names, dtypes, shapes, bytes) and its metadata.

    The files' own digests also cover their metadata, which may name the scratch folder; shard file names are
    random, so shards are listed by their tensors' digests alone.
    """
    import hashlib

    from safetensors import safe_open

    found: dict[str, object] = {}
    shards: list[str] = []
    shard_names: dict[str, str] = {}
    for path in sorted(runs_dir.rglob("*.safetensors")) if runs_dir.is_dir() else []:
        digest = hashlib.sha256()
        with safe_open(str(path), framework="pt") as handle:
            metadata = {key: value.replace(str(scratch), SCRATCH_MARK)
                        for key, value in (handle.metadata() or {}).items()}
            for key in sorted(handle.keys()):
                tensor = handle.get_tensor(key).contiguous()
                digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
                digest.update(tensor.view(-1).view(torch_uint8()).numpy().tobytes())
        name = str(path.relative_to(runs_dir))
        if re.search(r"shard-[0-9a-f]+\.safetensors$", name):
            shards.append(f"{Path(name).parent}/{digest.hexdigest()}")
            shard_names[Path(name).stem] = digest.hexdigest()[:16]
        else:
            found[name] = {"tensors": digest.hexdigest(), "metadata": metadata}
    found["shards"] = sorted(shards)
    found["shard_names"] = shard_names  # random name -> its tensors' digest, to compare the files naming shards
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(found, indent=1, sort_keys=True))


def torch_uint8():
    """torch.uint8 (torch imported only where tensors are read)."""
    import torch

    return torch.uint8


def _rename(text: str, renames: dict[str, str]) -> str:
    """Apply the declared renames (longest first) to `text`."""
    for old in sorted(renames, key=len, reverse=True):
        text = text.replace(old, renames[old])
    return text


def _normalise_nonces(text: str, shard_names: dict[str, str]) -> str:
    """Replace each random shard name by its tensors' digest and each output id by its order of first appearance."""
    text = re.sub(r"shard-[0-9a-f]{16}", lambda m: f"shard@{shard_names.get(m.group(0), m.group(0))}", text)
    for pattern, label in ((r"shard-[0-9a-f]{16}", "shard"), (r"\b[0-9a-f]{16}-[0-9a-f]{8}\b", "id")):
        seen: dict[str, str] = {}
        for found in re.findall(pattern, text):
            seen.setdefault(found, f"{label}#{len(seen) + 1}")
        text = re.sub(pattern, lambda match, names=seen: names[match.group(0)], text)
    return text


def _walk(value, prefix: str, out: dict[str, object]) -> None:
    """Flatten a JSON value into dotted paths, dropping volatile keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            if VOLATILE_KEY.search(str(key).lower()) or NONCE_KEY.search(str(key)) or SCRATCH_MARK in str(key):
                continue
            _walk(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{prefix}[{index}]", out)
    else:
        out[prefix] = value


def _differences(name: str, before: str, after: str) -> list[str]:
    """The differences between two versions of one recorded file."""
    if name.endswith(".json"):
        try:
            left, right = {}, {}
            _walk(json.loads(before), "", left)
            _walk(json.loads(after), "", right)
        except json.JSONDecodeError:
            pass
        else:
            return [f"{name}: {key}: {left.get(key, '<absent>')!r} -> {right.get(key, '<absent>')!r}"
                    for key in sorted(set(left) | set(right)) if left.get(key, "<absent>") != right.get(key, "<absent>")]
    if name.endswith(("stdout.txt", ".log.txt")):
        return []  # progress and timing lines; the run's files carry what it computed
    lines_before, lines_after = before.splitlines(), after.splitlines()
    return [f"{name}: line {index + 1}: {a!r} -> {b!r}"
            for index, (a, b) in enumerate(zip(lines_before, lines_after)) if a != b] + (
        [f"{name}: {len(lines_before)} lines -> {len(lines_after)}"] if len(lines_before) != len(lines_after) else [])


def _shard_names(recording: Path) -> dict[str, str]:
    """Random shard name -> tensors' digest, over every run of a recording."""
    names: dict[str, str] = {}
    for path in recording.glob("runs/*.tensors.json"):
        names.update(json.loads(path.read_text()).get("shard_names", {}))
    return names


def compare(before: Path, after: Path, renames: dict[str, str]) -> int:
    """Print every difference between two recordings after the declared renames; 1 if any."""
    left = {_rename(str(p.relative_to(before)), renames): p for p in before.rglob("*") if p.is_file()}
    right = {str(p.relative_to(after)): p for p in after.rglob("*") if p.is_file()}
    names_before, names_after = _shard_names(before), _shard_names(after)
    problems = [f"only before: {name}" for name in sorted(set(left) - set(right))]
    problems += [f"only after: {name}" for name in sorted(set(right) - set(left))]
    for name in sorted(set(left) & set(right)):
        text_before = _normalise_nonces(_rename(left[name].read_text(errors="replace"), renames), names_before)
        problems += _differences(name, text_before,
                                 _normalise_nonces(right[name].read_text(errors="replace"), names_after))
    for line in problems:
        print(line)
    print(f"{len(set(left) & set(right))} files compared, {len(problems)} differences")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and record or compare."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="record the installed tree's outputs")
    rec.add_argument("out", type=Path)
    rec.add_argument("--runs", nargs="*", default=["demo_smoke", "flickr8k_tiny"])
    rec.add_argument("--pacs", default=shutil.which("pacs") or "pacs", help="the pacs executable")
    cmp_ = sub.add_parser("compare", help="compare two recordings")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--renames", type=Path, default=None, help="JSON object of old -> new strings")
    args = parser.parse_args(argv)
    if args.action == "record":
        if args.out.exists():
            print(f"golden_outputs: error: {args.out} exists", file=sys.stderr)
            return 2
        return record(args.out, args.runs, args.pacs)
    renames = json.loads(args.renames.read_text()) if args.renames else {}
    return compare(args.before, args.after, renames)


if __name__ == "__main__":
    sys.exit(main())
