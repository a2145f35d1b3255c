#!/usr/bin/env bash
# Lint and type-check the package: ruff on mono_jit/, cache/ and cli/, then mypy on the package
# as it installs, then a build of the package that fails on any deprecation warning of its build
# backend (scripts/build_warnings.py). cache/ and cli/ install as mono_jit.cache and mono_jit.cli (pyproject's
# package-dir), which mypy cannot see through the editable install's import hook, so mypy reads a
# temporary tree that places them there by symbolic links. Settings: pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
.venv/bin/ruff check mono_jit cache cli
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
mkdir "$view/mono_jit"
for item in mono_jit/*; do ln -s "$root/$item" "$view/mono_jit/"; done
ln -s "$root/cache" "$view/mono_jit/cache"
ln -s "$root/cli" "$view/mono_jit/cli"
(cd "$view" && "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" -p mono_jit)
.venv/bin/python scripts/build_warnings.py
