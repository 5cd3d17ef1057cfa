#!/bin/bash
# One Kafka KRaft node (broker + controller) configured from the environment:
#   KAFKA_NODE_ID        this node's id (required)
#   KAFKA_VOTERS         the static controller quorum, "ID@HOST:PORT,..." (required)
#   KAFKA_CLUSTER_ID     the cluster id every node is formatted with (required, a Kafka Uuid)
#   KAFKA_HOST           listen and advertise address (default 127.0.0.1)
#   KAFKA_PORT           client port (default 9092)
#   KAFKA_CONTROLLER_PORT controller port (default 9093)
#   KAFKA_REPLICATION    replication of internal and default topics (default 3; min ISR 2)
#   KAFKA_HEAP           max heap (default 512m)
#   KAFKA_METRICS_PORT   when set, the Prometheus JMX exporter agent serves the broker's
#                        metrics (rules: deploy/kafka/jmx-exporter.yml) on KAFKA_HOST:PORT
# The first start formats /var/lib/kafka/data; later starts reuse it.
#
# `kafka-entrypoint topics ARGS...` runs Kafka's TopicCommand instead (kafka-topics.sh), e.g.
#   topics --bootstrap-server 127.0.0.1:9092 --create --if-not-exists --topic T --partitions 6
set -euo pipefail

java=(java -Xms64m "-Xmx${KAFKA_HEAP:-512m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  -Djava.awt.headless=true -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties
  -cp "/opt/kafka/libs/*")
if [[ "${1:-}" == "topics" ]]; then
  shift
  exec "${java[@]}" org.apache.kafka.tools.TopicCommand "$@"
fi

: "${KAFKA_NODE_ID:?set KAFKA_NODE_ID}" "${KAFKA_VOTERS:?set KAFKA_VOTERS}"
: "${KAFKA_CLUSTER_ID:?set KAFKA_CLUSTER_ID}"
host="${KAFKA_HOST:-127.0.0.1}"
port="${KAFKA_PORT:-9092}"
controller_port="${KAFKA_CONTROLLER_PORT:-9093}"
replication="${KAFKA_REPLICATION:-3}"
min_isr=$((replication < 2 ? 1 : 2))
home=/var/lib/kafka
data="$home/data"
props="$home/server.properties"

cat > "$props" <<PROPS
process.roles=broker,controller
node.id=$KAFKA_NODE_ID
controller.quorum.voters=$KAFKA_VOTERS
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$controller_port
advertised.listeners=PLAINTEXT://$host:$port
log.dirs=$data
num.partitions=1
auto.create.topics.enable=false
default.replication.factor=$replication
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$replication
transaction.state.log.replication.factor=$replication
transaction.state.log.min.isr=$min_isr
share.coordinator.state.topic.replication.factor=$replication
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
PROPS

if [[ ! -f "$data/meta.properties" ]]; then
  "${java[@]}" kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" -c "$props"
fi
agent=()
if [[ -n "${KAFKA_METRICS_PORT:-}" ]]; then
  agent=("-javaagent:/opt/kafka/jmx/jmx_prometheus_javaagent.jar=$host:$KAFKA_METRICS_PORT:/opt/kafka/jmx/jmx-exporter.yml")
fi
exec "${java[@]}" "${agent[@]}" kafka.Kafka "$props"
