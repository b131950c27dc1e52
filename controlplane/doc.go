// Package controlplane is inmesh's embedded control plane: the servers of
// Linkerd's control-plane APIs that a Go process, or a proxy, can use
// without Kubernetes. It holds the Identity service's issuer ([Issuer]),
// which signs workload certificates as Linkerd's identity controller does.
package controlplane
