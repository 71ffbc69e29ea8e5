#!/usr/bin/env bash
# Type-check the installed packages (udpo, udpo.env, udpo.rewards) with mypy; its settings are in
# pyproject.toml ([tool.mypy]). env/ and rewards/ install as udpo.env and udpo.rewards (pyproject's
# package-dir), a mapping mypy cannot follow, so it checks a tree of links laid out as the installed
# package: build/typecheck/udpo/{*, env -> env/, rewards -> rewards/}. Errors name those paths.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=build/typecheck
rm -rf "$tree/udpo"
mkdir -p "$tree/udpo"
for entry in udpo/*; do
  case "$entry" in udpo/env | udpo/rewards) continue ;; esac  # links a pinned worktree adds (docs/study.md)
  ln -s "$root/$entry" "$tree/udpo/"
done
ln -sfn "$root/env" "$tree/udpo/env"
ln -sfn "$root/rewards" "$tree/udpo/rewards"
cd "$tree"
mypy --config-file "$root/pyproject.toml" -p udpo
