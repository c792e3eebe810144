#!/usr/bin/env bash
# Makes sure the tools that check the deploy files are on this machine (docs/deploy.md, "How this
# page is checked"): systemd-analyze (Debian's systemd) verifies the units, and docker-compose
# (Debian's, 1.29: it checks a compose file against the Compose schema with no docker daemon)
# the compose file. `make test` runs it first. Only as root, with apt-get: elsewhere the tests
# that need them skip, saying why (and fail under KAYOS_REQUIRE_DEPLOY_TOOLS=1, as in CI).
set -euo pipefail
missing=()
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ "${#missing[@]}" -eq 0 ] || [ "$(id -u)" -ne 0 ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-deploy-tools: no apt-get to install ${missing[*]}; their deploy checks will skip" >&2
    exit 0
fi
echo "ensure-deploy-tools: installing ${missing[*]} (the checks of deploy/ need them)"
if ! { apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; }; then
    echo "ensure-deploy-tools: could not install ${missing[*]}; their deploy checks will skip" >&2
fi
