#!/usr/bin/env bash
# Runs the fault and load suite at full size: 10,000 requests across five
# control-plane restarts, 60 s of control-plane flapping, 100,000 requests
# from h2load at each listener, 100,000 reset streams, 100,000 distinct
# Hosts, 20,000 connections at a meshed TLS port (garbage, cut-short and
# foreign-SNI ClientHellos, full handshakes), 100,000 requests an inbound
# policy refuses, five certificate renewals each meeting a control-plane
# restart, 10,000 gRPC streams opened and cancelled through the proxy
# pair, 20,000 paced requests from each of two callers while a
# control-plane replica and its etcd member die, 5,000 registrants of
# each of three kinds past the registration limits, 5,000 of each of six
# kinds of forged registration, 20,000 requests past two tap viewers that
# read nothing, 30 s of 36 dashboard readers beside traffic, 20,000
# requests to a hedged and mirrored route whose backends fail. Everything
# stays on 127.0.0.1 (but for the dashboard's refusal of a client at this
# machine's own non-loopback address); each test is bounded in time (the
# whole run takes about 15-20 minutes on 2 cores) and stops every process
# it started. Needs h2load (Debian: nghttp2-client).
#
#   examples/faults/run-full.sh            # all of it
#   examples/faults/run-full.sh -run Flap  # one test
set -euo pipefail
cd "$(dirname "$0")/../.."
INMESH_FULL=1 exec go test -count=1 -timeout 30m -v "$@" ./examples/faults/
