#!/usr/bin/env bash
# Installs the Debian packages the test suite needs (kcat, a Java runtime for Spark)
# when they are missing. Needs root (as on CI); prints what to run otherwise.
set -euo pipefail
missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
