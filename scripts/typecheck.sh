#!/usr/bin/env bash
# Type-check the package (udpo, with udpo.env and udpo.rewards through its links to env/ and rewards/)
# with mypy; its settings are in pyproject.toml ([tool.mypy]).
set -euo pipefail
cd "$(dirname "$0")/.."
mypy -p udpo
