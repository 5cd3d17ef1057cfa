#!/usr/bin/env bash
# Regenerates clients/python/src/dataservice/ (the Python client's distribution ships it)
# from scratch from every .proto under protos/dataservice:
# messages (_pb2.py), gRPC stubs (_pb2_grpc.py) and mypy-protobuf stubs (.pyi), plus an
# __init__.py in every package directory and a py.typed marker. Deterministic: running it
# twice gives identical bytes.
#
# Usage: protos/generate.sh            (from any directory)
# Env:   PYTHON  interpreter with grpcio-tools and mypy-protobuf
#                (default: .venv/bin/python relative to the repo root)
set -euo pipefail

cd "$(dirname "$0")/.."
export LC_ALL=C

PYTHON="${PYTHON:-.venv/bin/python}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "generate.sh: python interpreter '$PYTHON' not found (set PYTHON)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import grpc_tools.protoc, mypy_protobuf' 2>/dev/null; then
  echo "generate.sh: '$PYTHON' lacks grpcio-tools or mypy-protobuf (pip install -e '.[dev]')" >&2
  exit 1
fi

PROTO_ROOT=protos
OUT=clients/python/src
# google/protobuf/*.proto (well-known types) bundled with grpcio-tools.
WKT_INCLUDE="$("$PYTHON" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
# The mypy-protobuf plugins are console scripts next to the interpreter's other scripts.
SCRIPTS_DIR="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
MYPY_PLUGIN="$SCRIPTS_DIR/protoc-gen-mypy"
MYPY_GRPC_PLUGIN="$SCRIPTS_DIR/protoc-gen-mypy_grpc"
for plugin in "$MYPY_PLUGIN" "$MYPY_GRPC_PLUGIN"; do
  if [[ ! -x "$plugin" ]]; then
    echo "generate.sh: protoc plugin $plugin not found (is mypy-protobuf installed?)" >&2
    exit 1
  fi
done

# Paths relative to the include root, sorted, so protoc sees a stable order.
mapfile -t PROTOS < <(cd "$PROTO_ROOT" && find dataservice -name '*.proto' -type f | sort)
if [[ ${#PROTOS[@]} -eq 0 ]]; then
  echo "generate.sh: no .proto files under $PROTO_ROOT/dataservice" >&2
  exit 1
fi

rm -rf "$OUT/dataservice"
mkdir -p "$OUT"

"$PYTHON" -m grpc_tools.protoc \
  -I "$PROTO_ROOT" \
  -I "$WKT_INCLUDE" \
  --plugin=protoc-gen-mypy="$MYPY_PLUGIN" \
  --plugin=protoc-gen-mypy_grpc="$MYPY_GRPC_PLUGIN" \
  --python_out="$OUT" \
  --grpc_python_out="$OUT" \
  --mypy_out=quiet:"$OUT" \
  --mypy_grpc_out=quiet:"$OUT" \
  "${PROTOS[@]}"

# Make every generated directory a regular package (imports, setuptools discovery, mypy).
while IFS= read -r dir; do
  : >"$dir/__init__.py"
done < <(find "$OUT/dataservice" -type d | sort)
# PEP 561: the package ships its own type information (the .pyi stubs).
: >"$OUT/dataservice/py.typed"

echo "generate.sh: generated ${#PROTOS[@]} proto files into $OUT"
