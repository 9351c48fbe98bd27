#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing: kcat (a real
# client), a Java runtime (Spark, ZooKeeper), zookeeper (Debian's 3.8 package: the jars under
# /usr/share/java that the cluster tests and `headrace cluster up` start as plain JVM
# processes; no system service is used), iptables, faketime and iproute2 (fault tests), and
# liblz4-dev (headers of liblz4, which the record kernel links: setup.py).
# Idempotent: when everything is present it only runs a few `command -v`/`test` checks.
# Needs root (as on CI); prints what to run otherwise.
set -euo pipefail
missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing+=(iptables)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
[ -f /usr/include/lz4frame.h ] || missing+=(liblz4-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
