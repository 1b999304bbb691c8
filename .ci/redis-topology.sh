#!/usr/bin/env bash
# Starts the Redis topologies the strategy/redis tests use, when they are not
# already running: a three-node Redis Cluster (ports 7101-7103, no replicas)
# and a Sentinel setup (primary 7201, replica 7202, one sentinel on 26379
# monitoring "ratelimit"). Every server keeps its files in a temporary
# directory and persists nothing. The script exports nothing: it prints the
# environment variables the tests read.
#
# Usage: .ci/redis-topology.sh [start|stop]
#   start (default)  start what is down, wait until usable, print the env vars
#   stop             shut the servers down (SHUTDOWN NOSAVE) and remove the dirs
#
# Ports can be moved with RATELIMIT_TOPOLOGY_CLUSTER_PORTS ("7101 7102 7103"),
# RATELIMIT_TOPOLOGY_SENTINEL_PORTS ("7201 7202 26379").
set -euo pipefail

HOST=127.0.0.1
read -r -a CLUSTER_PORTS <<<"${RATELIMIT_TOPOLOGY_CLUSTER_PORTS:-7101 7102 7103}"
read -r -a SENTINEL_PORTS <<<"${RATELIMIT_TOPOLOGY_SENTINEL_PORTS:-7201 7202 26379}"
PRIMARY_PORT=${SENTINEL_PORTS[0]}
REPLICA_PORT=${SENTINEL_PORTS[1]}
SENTINEL_PORT=${SENTINEL_PORTS[2]}
MASTER_NAME=ratelimit
BASE_DIR=${TMPDIR:-/tmp}/ratelimit-redis-topology

for bin in redis-server redis-cli; do
	command -v "$bin" >/dev/null || { echo "redis-topology: $bin not found" >&2; exit 1; }
done

up() { redis-cli -h "$HOST" -p "$1" ping 2>/dev/null | grep -q PONG; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@"; do
		if ((SECONDS >= deadline)); then
			echo "redis-topology: timed out waiting for $what" >&2
			return 1
		fi
		sleep 0.1
	done
}

# start_server PORT DIR ARGS...: starts a daemonized redis-server without persistence.
start_server() {
	local port=$1 dir=$2
	shift 2
	mkdir -p "$dir"
	redis-server --port "$port" --bind "$HOST" --dir "$dir" --save "" --appendonly no \
		--daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@"
	wait_for "redis on port $port" 10 up "$port"
}

cluster_ok() { redis-cli -h "$HOST" -p "${CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }
cluster_known() { [ "$(redis-cli -h "$HOST" -p "${CLUSTER_PORTS[0]}" cluster info 2>/dev/null | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = "${#CLUSTER_PORTS[@]}" ]; }

start_cluster() {
	local fresh=0 port
	for port in "${CLUSTER_PORTS[@]}"; do
		if ! up "$port"; then
			rm -rf "$BASE_DIR/cluster-$port"
			start_server "$port" "$BASE_DIR/cluster-$port" --cluster-enabled yes \
				--cluster-config-file nodes.conf --cluster-node-timeout 2000
			fresh=1
		fi
	done
	if cluster_ok && cluster_known; then
		return 0
	fi
	if ((fresh == 0)) && ! cluster_ok; then
		# Running nodes that do not form a healthy cluster: start over.
		for port in "${CLUSTER_PORTS[@]}"; do
			redis-cli -h "$HOST" -p "$port" flushall >/dev/null 2>&1 || true
			redis-cli -h "$HOST" -p "$port" cluster reset hard >/dev/null
		done
	fi
	local addrs=()
	for port in "${CLUSTER_PORTS[@]}"; do addrs+=("$HOST:$port"); done
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$BASE_DIR/cluster-create.log" 2>&1 ||
		{ cat "$BASE_DIR/cluster-create.log" >&2; exit 1; }
	wait_for "cluster_state:ok" 20 cluster_ok
	wait_for "cluster nodes to know each other" 20 cluster_known
}

sentinel_ready() {
	redis-cli -h "$HOST" -p "$SENTINEL_PORT" sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null | grep -q . &&
		[ "$(redis-cli -h "$HOST" -p "$SENTINEL_PORT" sentinel master "$MASTER_NAME" 2>/dev/null | sed -n '/^num-slaves$/{n;p}')" -ge 1 ]
}

replica_synced() {
	redis-cli -h "$HOST" -p "$REPLICA_PORT" info replication 2>/dev/null | grep -q '^master_link_status:up' ||
		redis-cli -h "$HOST" -p "$PRIMARY_PORT" info replication 2>/dev/null | grep -q '^master_link_status:up'
}

start_sentinel() {
	if ! up "$PRIMARY_PORT" && ! up "$REPLICA_PORT"; then
		rm -rf "$BASE_DIR/sentinel-$PRIMARY_PORT" "$BASE_DIR/sentinel-$REPLICA_PORT" "$BASE_DIR/sentinel-$SENTINEL_PORT"
	fi
	# After a failover the roles may be swapped; a restarted server rejoins
	# as a replica of whichever one is the primary now.
	local primary=$PRIMARY_PORT
	if up "$SENTINEL_PORT"; then
		primary=$(redis-cli -h "$HOST" -p "$SENTINEL_PORT" sentinel get-master-addr-by-name "$MASTER_NAME" | sed -n 2p)
	fi
	local port
	for port in "$PRIMARY_PORT" "$REPLICA_PORT"; do
		up "$port" && continue
		if [ "$port" = "$primary" ]; then
			start_server "$port" "$BASE_DIR/sentinel-$port"
		else
			start_server "$port" "$BASE_DIR/sentinel-$port" --replicaof "$HOST" "$primary"
		fi
	done
	if ! up "$SENTINEL_PORT"; then
		local dir=$BASE_DIR/sentinel-$SENTINEL_PORT
		mkdir -p "$dir"
		cat >"$dir/sentinel.conf" <<CONF
port $SENTINEL_PORT
bind $HOST
dir $dir
daemonize yes
pidfile $dir/sentinel.pid
logfile $dir/sentinel.log
sentinel monitor $MASTER_NAME $HOST $primary 1
sentinel down-after-milliseconds $MASTER_NAME 1000
sentinel failover-timeout $MASTER_NAME 5000
sentinel parallel-syncs $MASTER_NAME 1
CONF
		redis-server "$dir/sentinel.conf" --sentinel
		wait_for "sentinel on port $SENTINEL_PORT" 10 up "$SENTINEL_PORT"
	fi
	wait_for "replica in sync" 20 replica_synced
	wait_for "sentinel to see the primary and its replica" 30 sentinel_ready
}

stop_all() {
	local port
	for port in "${CLUSTER_PORTS[@]}" "$PRIMARY_PORT" "$REPLICA_PORT" "$SENTINEL_PORT"; do
		up "$port" && redis-cli -h "$HOST" -p "$port" shutdown nosave >/dev/null 2>&1 || true
	done
	rm -rf "$BASE_DIR"
}

case "${1:-start}" in
start)
	mkdir -p "$BASE_DIR"
	start_cluster
	start_sentinel
	cluster_addrs=$(printf "$HOST:%s," "${CLUSTER_PORTS[@]}")
	echo "RATELIMIT_TEST_REDIS_CLUSTER_ADDRS=${cluster_addrs%,}"
	echo "RATELIMIT_TEST_REDIS_SENTINEL_ADDR=$HOST:$SENTINEL_PORT"
	echo "RATELIMIT_TEST_REDIS_SENTINEL_MASTER=$MASTER_NAME"
	;;
stop) stop_all ;;
*)
	echo "usage: $0 [start|stop]" >&2
	exit 2
	;;
esac
