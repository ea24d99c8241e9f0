#!/usr/bin/env bash
# Runs a standalone ZooKeeper server for qstore's ZooKeeper-backed replica group logs and
# their tests, from Debian's `zookeeperd` package, without its system service: the server
# gets its own config, data and log in DIR.
#
#   scripts/zookeeper.sh start PORT DIR   starts it on 127.0.0.1:PORT, waits until it answers
#                                          (30 s at most) and prints its pid
#   scripts/zookeeper.sh stop DIR         stops the server started in DIR
set -euo pipefail

JAR=/usr/share/java/zookeeper.jar
# The package's jar names its dependencies in its manifest, slf4j's API among them; the
# log4j binding (both of the package's dependencies) sends the server's log to DIR.
LOG_JARS=/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar
WAIT_SECONDS=30

usage() {
  echo "usage: $0 start PORT DIR | $0 stop DIR" >&2
  exit 2
}

need_package() {
  if [ ! -r "$JAR" ] || ! command -v java >/dev/null 2>&1; then
    echo "zookeeper.sh: ZooKeeper is not installed ($JAR or java missing):" \
      "run 'apt-get install -y zookeeperd'" >&2
    exit 1
  fi
}

# Whether the server on 127.0.0.1:$1 answers `ruok` with `imok`.
answers() {
  local reply
  reply=$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf ruok >&3 && cat <&3" \
    2>/dev/null || true)
  [ "$reply" = imok ]
}

write_config() {
  local port=$1 dir=$2
  cat >"$dir/zoo.cfg" <<EOF
tickTime=2000
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
EOF
  cat >"$dir/log4j.properties" <<EOF
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=$dir/zookeeper.log
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] %m%n
EOF
}

start() {
  local port=$1 dir=$2
  need_package
  [[ "$port" =~ ^[0-9]+$ ]] || usage
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  if [ -s "$dir/zookeeper.pid" ] && kill -0 "$(cat "$dir/zookeeper.pid")" 2>/dev/null; then
    echo "zookeeper.sh: a server started in $dir still runs (pid $(cat "$dir/zookeeper.pid"))" >&2
    exit 1
  fi
  write_config "$port" "$dir"
  # The properties repeat the config's: ZooKeeper reads these two as system properties.
  nohup java -Xmx2g -cp "$dir:$JAR:$LOG_JARS" \
    -Dlog4j.configuration="file:$dir/log4j.properties" \
    -Dzookeeper.admin.enableServer=false \
    -Dzookeeper.4lw.commands.whitelist=ruok,srvr \
    org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" \
    </dev/null >>"$dir/zookeeper.out" 2>&1 &
  local pid=$!
  echo "$pid" >"$dir/zookeeper.pid"
  local deadline=$((SECONDS + WAIT_SECONDS))
  until answers "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "zookeeper.sh: the server exited at start; its output:" >&2
      tail -n 20 "$dir/zookeeper.out" "$dir/zookeeper.log" >&2 2>/dev/null || true
      rm -f "$dir/zookeeper.pid"
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "zookeeper.sh: the server did not answer on 127.0.0.1:$port in ${WAIT_SECONDS}s" >&2
      stop "$dir"
      exit 1
    fi
    sleep 0.2
  done
  echo "$pid"
}

stop() {
  local dir=$1 pid
  [ -s "$dir/zookeeper.pid" ] || return 0
  pid=$(cat "$dir/zookeeper.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$dir/zookeeper.pid"
}

case "${1:-}" in
start)
  [ $# -eq 3 ] || usage
  start "$2" "$3"
  ;;
stop)
  [ $# -eq 2 ] || usage
  stop "$2"
  ;;
*) usage ;;
esac
