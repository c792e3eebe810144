#!/usr/bin/env bash
# Makes sure a Java runtime for the Spark tier (docs/spark.md: Java 17 or 21) is on this machine.
# `make test` runs it first, so the Spark tests run on a machine that had no Java: Debian's
# openjdk-17-jre-headless is installed with apt (as root, or through sudo without a password).
# Where neither is possible it says what to install and fails: the Spark tier is part of the suite.
set -euo pipefail
if command -v java >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "ensure-java: no java on this machine and no way to install it (not root, no sudo)." >&2
    echo "ensure-java: install a Java 17 runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-java: no java and no apt-get here; install a Java 17 runtime and run again" >&2
    exit 1
fi
echo "ensure-java: installing openjdk-17-jre-headless (the Spark tier needs java)"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends openjdk-17-jre-headless
java -version
