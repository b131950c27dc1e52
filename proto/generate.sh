#!/usr/bin/env bash
# Regenerates destination/destinationpb from the .proto files in this folder.
#   proto/generate.sh          write the generated code
#   proto/generate.sh --check  fail when the committed code is stale
# Needs protoc (Debian: protobuf-compiler); the Go plugins are pinned below and
# built from the module proxy into a private folder.
set -euo pipefail

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

root=$(cd "$(dirname "$0")/.." && pwd)
out_pkg=destination/destinationpb
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

command -v protoc >/dev/null || { echo "generate.sh: protoc not found (apt-get install protobuf-compiler)" >&2; exit 1; }
GOBIN="$tmp/bin" go install "$PROTOC_GEN_GO"
GOBIN="$tmp/bin" go install "$PROTOC_GEN_GO_GRPC"

mkdir -p "$tmp/out"
PATH="$tmp/bin:$PATH" protoc \
  -I "$root/proto" \
  --go_out="$tmp/out" --go_opt=module=github.com/inmesh/inmesh \
  --go-grpc_out="$tmp/out" --go-grpc_opt=module=github.com/inmesh/inmesh \
  "$root"/proto/*.proto

if [ "${1:-}" = "--check" ]; then
  mkdir -p "$tmp/committed"
  cp "$root/$out_pkg"/*.pb.go "$tmp/committed/"
  if ! diff -ru "$tmp/committed" "$tmp/out/$out_pkg"; then
    echo "generate.sh: $out_pkg is stale; run proto/generate.sh" >&2
    exit 1
  fi
  echo "generate.sh: $out_pkg is up to date"
else
  rm -f "$root/$out_pkg"/*.pb.go
  cp "$tmp/out/$out_pkg"/*.pb.go "$root/$out_pkg/"
fi
