// Package destinationpb holds the generated protobuf and gRPC code of
// Linkerd's Destination API (proto packages io.linkerd.proxy.destination,
// io.linkerd.proxy.net, io.linkerd.proxy.http_types and
// io.linkerd.proxy.meta), generated from the .proto files in the
// repository's proto/ folder by proto/generate.sh. Do not edit the .pb.go
// files.
//
// The proto names are the ones Linkerd uses, which makes the messages
// wire-compatible with a Linkerd control plane. It also means that a binary
// that links Linkerd's own generated Go package for the same protos panics at
// start-up with a registration conflict; such a program should use one of the
// two packages, not both.
package destinationpb
