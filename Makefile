# Fresh-machine entry points: `make demo` runs the main job, `make test` runs every test tier.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup postgres browser etcd node demo test test-unit test-integration test-faults test-spark bench bench-catchup bench-grid bench-delivery bench-multimaster bench-loader bench-client-auth bench-ops clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[all]'
	touch $(STAMP)

# The delivery tests' message broker (Debian's mosquitto); the tests start their own on a free port.
BROKER := $(VENV)/.mosquitto
$(BROKER): $(BIN)/python
	@command -v mosquitto >/dev/null 2>&1 || test -x /usr/sbin/mosquitto || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto; }
	touch $@

setup: $(STAMP) $(BROKER) postgres browser etcd etcd-tools node

# The dashboard's test drives a real headless Chromium through selenium: Debian's chromium and
# chromium-driver, installed here when missing (as root; the test skips, saying so, where none can be had).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver); \
	else echo "no chromium/chromedriver found: install them (Debian: apt-get install chromium chromium-driver) for the dashboard test"; fi

# The HA tests, bench and demo start a throwaway 3-member etcd (testing/etcd.py): Debian's etcd-server
# (3.4), and nftables for the network-partition tests; installed here when missing (CI runs as root).
etcd:
	@if command -v etcd >/dev/null && command -v nft >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server nftables || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server nftables); \
	else echo "no etcd found: install it (Debian: apt-get install etcd-server nftables) for the HA tests"; fi

# The partition tests' tools (testing/netns.py): iproute2's `ip` and nftables' `nft`, and etcdctl to look
# into a test's etcd by hand; installed here when missing (as root). Where systemd runs, Debian's
# etcd-server enables and starts an etcd on port 2379 that nothing here uses (the tests start their
# own on free ports): it is stopped and disabled. In a container without systemd nothing starts.
.PHONY: etcd-tools
etcd-tools: etcd
	@if command -v ip >/dev/null && command -v nft >/dev/null && command -v etcdctl >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 nftables etcd-client || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 nftables etcd-client); \
	else echo "no ip/nft/etcdctl found: install them (Debian: apt-get install iproute2 nftables etcd-client) for the partition tests"; fi
	@if [ -d /run/systemd/system ] && (systemctl is-enabled --quiet etcd || systemctl is-active --quiet etcd) 2>/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then systemctl disable --now etcd; \
	  else echo "Debian's etcd service is enabled (port 2379); the tests do not need it: sudo systemctl disable --now etcd"; fi; fi

# The CouchDB endpoints' tests, bench and demo run real PouchDB in Node (issue 26): Debian's nodejs and npm,
# installed here when missing; the tests install their pinned npm packages into a cache they keep.
node:
	@if command -v node >/dev/null && command -v npm >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm); \
	else echo "no node/npm found: install them (Debian: apt-get install nodejs npm) for the PouchDB tests"; fi

# The grid Loader's tests start a throwaway PostgreSQL (docs/decisions.md): the system's binaries, or
# Debian's package installed here (CI runs as root).
postgres:
	@if command -v pg_ctl >/dev/null || [ -x /usr/local/bin/pg_ctl ] || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql); \
	else echo "no PostgreSQL found: install it (Debian: apt-get install postgresql) for the loader tests"; fi

demo: setup
	$(BIN)/multisite demo

# Test files on 3 workers (pytest-xdist; a file's tests stay on one worker, with its module fixtures):
# most of the suite waits on processes, sockets and JVMs (about 1.2 of 2 CPUs busy with 2 workers), so a
# third file at a time keeps CI under 20 minutes; files in collection order, the slowest first
# (tests/conftest.py's SLOW_FIRST), not xdist's default by number of tests (docs/decisions.md).
test: setup
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 tests/faults tests/spark tests/integration tests/unit

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

bench: setup
	$(BIN)/python bench/commit.py

bench-catchup: setup  # a secondary 1,000,000 transactions behind, beside PostgreSQL
	$(BIN)/python bench/catchup.py $(ARGS)

bench-delivery: setup  # delivery through the file transport, and a remote 1,000,000 transactions behind
	$(BIN)/python bench/delivery.py $(ARGS)

bench-grid: setup  # the grid's figures of issue 11 (real catalog and container processes); ARGS="--figure commit --quick"
	PYTHONPATH=src $(BIN)/python bench/grid.py $(ARGS)

bench-loader: setup  # the grid's Loader: write-through to PostgreSQL beside psycopg, replay after failover
	PYTHONPATH=src $(BIN)/python bench/loader.py $(ARGS)

bench-client-auth: setup  # what client authentication costs: none, password, TLS + password, TLS + certificate
	PYTHONPATH=src $(BIN)/python bench/client_auth.py $(ARGS)

bench-multimaster: setup  # two docservers beside PouchDB (npm install pouchdb@9 in /tmp/pouch, or POUCHDB_NODE_PATH); ARGS="--figure couch": PouchDB against the CouchDB endpoints beside express-pouchdb
	$(BIN)/python bench/multimaster.py $(ARGS)

.PHONY: bench-replication
bench-replication: setup  # issue 14's table: commits with/without a secondary, lag, compression, beside pgbench; ARGS="--quick"
	PYTHONPATH=src $(BIN)/python bench/replication.py $(ARGS)

bench-ops: setup  # metrics + dashboard against the commit rate, and a /metrics scrape with 100 links (issue 17)
	PYTHONPATH=src $(BIN)/python bench/ops.py $(ARGS)

.PHONY: bench-ha
bench-ha: setup  # automatic failover: kill -> first commit on the new primary, --min-confirm 1's rate, loss over fault rounds (issue 25)
	PYTHONPATH=src $(BIN)/python bench/ha.py $(ARGS)

# The deterministic simulation of every family (issue 28): SEEDS seeds each, a summary table; a failure
# prints its seed and the shortest step list that reproduces it. ARGS="--family log_shipping --steps 2000"
SEEDS ?= 1000
.PHONY: sim
sim: setup
	PYTHONPATH=src nice -n 19 $(BIN)/python -m multisite.testing.sim --seeds $(SEEDS) $(ARGS)

# Every parser under a fuzzer (issue 28; outside CI): protocol frames, the client protocol, journal segments
# and records, lost files, delivery messages, the replicator wire and documents, the grid's wires, TOML
# configuration, the CouchDB endpoints' decisions on a client's JSON. atheris (coverage-guided, libFuzzer)
# when it installs, else fuzz/mutate.py; RUNS inputs per parser, one parser at a time at the lowest
# priority. ARGS="protocol_connection --runs 10000"
RUNS ?= 1000000
.PHONY: fuzz
fuzz: setup
	@$(BIN)/python -c "import atheris" 2>/dev/null || $(BIN)/pip install -q atheris || echo "atheris did not install: fuzz/mutate.py runs instead"
	PYTHONPATH=src nice -n 19 $(BIN)/python -m fuzz.run --runs $(RUNS) $(ARGS)

# A Spark standalone cluster (a master and two workers, PySpark's own spark-class) on this machine.
.PHONY: spark-cluster-start spark-cluster-stop bench-pipeline
SPARK_CLUSTER_DIR ?= /tmp/multisite-spark-cluster
spark-cluster-start: setup
	PYTHONPATH=src $(BIN)/python -m multisite.testing.spark_cluster start $(SPARK_CLUSTER_DIR) $(ARGS)

spark-cluster-stop:
	PYTHONPATH=src $(BIN)/python -m multisite.testing.spark_cluster stop $(SPARK_CLUSTER_DIR)

bench-pipeline: setup  # the pipeline's figures; ARGS="--figure stream|cluster|scan"
	PYTHONPATH=src $(BIN)/python bench/pipeline.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
