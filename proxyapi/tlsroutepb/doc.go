// Package tlsroutepb holds the generated protobuf code of the TLS route server-name match of Linkerd's
// OutboundPolicies API (proto package io.linkerd.proxy.tls_route), generated from the .proto
// files in the repository's proto/ folder by proto/generate.sh. Do not edit
// the .pb.go files.
//
// The proto names are the ones Linkerd uses, which makes the messages
// wire-compatible with Linkerd's policy controller and proxies. A binary that
// also links Linkerd's own generated Go package for the same protos panics at
// start-up with a registration conflict; such a program should use one of the
// two packages, not both.
package tlsroutepb
