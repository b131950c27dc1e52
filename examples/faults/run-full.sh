#!/usr/bin/env bash
# Runs the fault and load suite at full size: 10,000 requests across five
# control-plane restarts, 60 s of control-plane flapping, 100,000 requests
# from h2load at each listener, 100,000 reset streams, 100,000 distinct
# Hosts, 20,000 connections at a meshed TLS port (garbage, cut-short and
# foreign-SNI ClientHellos, full handshakes), 100,000 requests an inbound
# policy refuses, five certificate renewals each meeting a control-plane
# restart, 10,000 gRPC streams opened and cancelled through the proxy
# pair. Everything stays on 127.0.0.1; each test is bounded in time (the
# whole run takes about 8-12 minutes on 2 cores) and stops every process
# it started. Needs h2load (Debian: nghttp2-client).
#
#   examples/faults/run-full.sh            # all of it
#   examples/faults/run-full.sh -run Flap  # one test
set -euo pipefail
cd "$(dirname "$0")/../.."
INMESH_FULL=1 exec go test -count=1 -timeout 20m -v "$@" ./examples/faults/
