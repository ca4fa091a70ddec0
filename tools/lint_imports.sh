#!/usr/bin/env bash
# lint-imports (.importlinter) on the installed layout. import-linter walks a package's own folder, and the folders
# of `pacs` are the card's top-level folders mapped in by setup.cfg's package_dir: it lints a view of that layout
# (links, outside the checkout) instead. Used by .ci/run and tools/check_newest.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VIEW="$(mktemp -d)"
trap 'rm -rf "$VIEW"' EXIT
mkdir "$VIEW/pacs"
ln -s "$PWD"/pacs/*.py "$VIEW/pacs/"
for package in captioner eval metric rewards; do ln -s "$PWD/$package" "$VIEW/pacs/$package"; done
ln -s "$PWD/recipes/configs" "$VIEW/pacs/configs"
REPO_ROOT="$PWD"
cd "$VIEW" && PYTHONPATH="$VIEW" lint-imports --config "$REPO_ROOT/.importlinter"  # it puts its folder first on sys.path
