#!/usr/bin/env bash
# Regenerates the protobuf and gRPC packages from the .proto files in this
# folder, one Go package per Linkerd API under proxyapi/: destinationpb
# (Destination API), outboundpb, httproutepb, grpcroutepb, opaqueroutepb and
# tlsroutepb (OutboundPolicies API), identitypb (Identity API), inboundpb
# (InboundServerPolicies API), and inmesh's own registrationpb (Registration
# API) and watchespb (Watches API: a client's watches over one stream), hedgepb, mirrorpb and outlierpb (fields 1001-1003 that Linkerd's
# proxies skip). Each Go package holds one or more proto
# packages, as their go_package options say.
#   proto/generate.sh          write the generated code
#   proto/generate.sh --check  fail when any committed package is stale
# Needs protoc (Debian: protobuf-compiler); the Go plugins are pinned below and
# built from the module proxy into a private folder.
set -euo pipefail

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

root=$(cd "$(dirname "$0")/.." && pwd)
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

# The packages are whatever folders the go_package options name.
pkgs=$(cd "$tmp/out" && find . -name '*.pb.go' -exec dirname {} \; | sed 's|^\./||' | sort -u)
[ -n "$pkgs" ] || { echo "generate.sh: protoc generated nothing" >&2; exit 1; }

stale=0
for pkg in $pkgs; do
  if [ "${1:-}" = "--check" ]; then
    mkdir -p "$tmp/committed/$pkg"
    cp "$root/$pkg"/*.pb.go "$tmp/committed/$pkg/" 2>/dev/null || true
    if ! diff -ru "$tmp/committed/$pkg" "$tmp/out/$pkg"; then
      echo "generate.sh: $pkg is stale; run proto/generate.sh" >&2
      stale=1
    else
      echo "generate.sh: $pkg is up to date"
    fi
  else
    mkdir -p "$root/$pkg"
    rm -f "$root/$pkg"/*.pb.go
    cp "$tmp/out/$pkg"/*.pb.go "$root/$pkg/"
    echo "generate.sh: wrote $pkg"
  fi
done
exit $stale
