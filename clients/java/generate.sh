#!/usr/bin/env bash
# Regenerates clients/java/src/generated/java from scratch from the .protos a reading client
# uses (BindingService, StreamService and their types): protobuf messages (protoc's
# java_out) and grpc-java stubs
# (protoc-gen-grpc-java). Both tools are the executables Maven Central serves; they are fetched
# once into ~/.cache/dataservice/java-bin (versions from pom.xml: protoc = protobuf.version,
# the plugin = grpc.version). Deterministic: running it twice gives identical bytes.
#
# Usage: clients/java/generate.sh      (from any directory)
# Env:   MVN_REPO  Maven local repository (default ~/.cache/m2)
set -euo pipefail

cd "$(dirname "$0")"
export LC_ALL=C
ROOT=../..
BIN="${HOME}/.cache/dataservice/java-bin"
MVN_REPO="${MVN_REPO:-${HOME}/.cache/m2}"

prop() { sed -n "s|.*<$1>\(.*\)</$1>.*|\1|p" pom.xml | head -1; }
PROTOBUF_VERSION="$(prop protobuf.version)"
GRPC_VERSION="$(prop grpc.version)"
PROTOC="$BIN/protoc-${PROTOBUF_VERSION}-linux-x86_64.exe"
GRPC_PLUGIN="$BIN/protoc-gen-grpc-java-${GRPC_VERSION}-linux-x86_64.exe"

fetch() { # groupId:artifactId:version, file
  if [[ ! -x "$2" ]]; then
    mkdir -p "$BIN"
    mvn -B -q "-Dmaven.repo.local=$MVN_REPO" dependency:copy \
      "-Dartifact=$1:exe:linux-x86_64" "-DoutputDirectory=$BIN" >&2
    chmod +x "$2"
  fi
}
fetch "com.google.protobuf:protoc:${PROTOBUF_VERSION}" "$PROTOC"
fetch "io.grpc:protoc-gen-grpc-java:${GRPC_VERSION}" "$GRPC_PLUGIN"

# google/protobuf/*.proto (well-known types) come inside the protobuf-java jar.
WKT_JAR="$MVN_REPO/com/google/protobuf/protobuf-java/${PROTOBUF_VERSION}/protobuf-java-${PROTOBUF_VERSION}.jar"
if [[ ! -f "$WKT_JAR" ]]; then
  mvn -B -q "-Dmaven.repo.local=$MVN_REPO" dependency:get \
    "-Dartifact=com.google.protobuf:protobuf-java:${PROTOBUF_VERSION}" >&2
fi
WKT="$(mktemp -d)"
trap 'rm -rf "$WKT"' EXIT
(cd "$WKT" && unzip -q -o "$WKT_JAR" 'google/protobuf/*.proto')

# The protos of the services a reading client calls (and what they import); the admin,
# assigner-internal and notifier APIs are not the client's.
PROTOS=(
  dataservice/assigner/v1/binding.proto
  dataservice/assigner/v1/types.proto
  dataservice/common/v1/common.proto
  dataservice/sidecar/v1/stream.proto
)
OUT=src/generated/java
rm -rf "$OUT"
mkdir -p "$OUT"
"$PROTOC" -I "$ROOT/protos" -I "$WKT" \
  "--plugin=protoc-gen-grpc-java=$GRPC_PLUGIN" \
  --java_out="$OUT" --grpc-java_out="$OUT" \
  "${PROTOS[@]}"
echo "generate.sh: generated ${#PROTOS[@]} proto files into clients/java/$OUT" >&2
