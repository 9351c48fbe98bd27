# Two entry points: `make run` (the broker on 127.0.0.1:9092, data under ./data)
# and `make test` (installs everything the tests need, then runs them).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run cluster test install system-deps lint bench clean kernel-asan

# setuptools as pyproject's build-system asks: tests/spark/test_install.py builds without isolation.
# The record kernel links liblz4 (setup.py): its headers come from Debian's liblz4-dev.
$(STAMP): pyproject.toml setup.py $(wildcard headrace/*/*.c headrace/*/*.h)
	@test -f /usr/include/lz4frame.h || { echo "liblz4-dev is missing: make system-deps" \
	    "(or apt-get install liblz4-dev)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip 'setuptools>=77' wheel >/dev/null
	$(BIN)/pip install -e '.[spark,test]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests use: kcat (a real client), a Java runtime (Spark, ZooKeeper),
# zookeeper (the cluster's ensemble) and iptables, faketime, iproute2 (fault tests); and
# liblz4-dev, which the build needs (the record kernel links liblz4).
system-deps:
	@./scripts/install-system-deps.sh

run: system-deps install
	$(BIN)/headrace broker --override log.dirs=./data

# A three-node ZooKeeper ensemble and BROKERS brokers on 127.0.0.1:9092..., data under ./cluster;
# Ctrl-C stops them all.
BROKERS ?= 3
cluster: system-deps install
	$(BIN)/headrace cluster up --brokers $(BROKERS) --base-dir ./cluster

test: system-deps install
	$(BIN)/ruff check headrace tests bench
	$(BIN)/pytest
	./scripts/kernel-asan.sh $(BIN)/python

# The C extensions built with AddressSanitizer + UBSan (build/kernel-asan/), their tests run on them.
kernel-asan: install
	./scripts/kernel-asan.sh $(BIN)/python

lint: install
	$(BIN)/ruff check headrace tests bench

clean:
	rm -rf $(VENV) build *.egg-info
