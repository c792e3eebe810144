#!/usr/bin/env bash
# Makes sure iptables is on this machine for the chaos campaign's partitions (docs/testing.md,
# "Network faults": nodes in network namespaces, partitions as iptables rules inside them).
# `make test` runs it first. Only as root, where namespaces can be made at all: elsewhere the
# partition tests skip saying why, and this does nothing. It never touches any firewall rule.
set -euo pipefail
if { command -v iptables && command -v ip; } >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-netns-tools: no iptables or ip, and no apt-get; the partition tests will skip" >&2
    exit 0
fi
echo "ensure-netns-tools: installing iptables and iproute2 (the chaos campaign's partitions need them)"
if ! { apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iptables iproute2; }; then
    echo "ensure-netns-tools: could not install iptables/iproute2; the partition tests will skip" >&2
fi
