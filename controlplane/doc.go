// Package controlplane is inmesh's embedded control plane: the servers of
// Linkerd's control-plane APIs that a Go process, or a proxy, can use
// without Kubernetes.
//
// A [Server] serves the Destination API (Get, GetProfile) and the
// OutboundPolicies API from a [Store] of ServiceProfiles, endpoint sets and
// Gateway API manifests, following the contracts of Linkerd's destination
// and policy controllers; [Server.Shutdown] ends all of its streams so that
// clients re-subscribe elsewhere at once. A replica's [Health] says
// whether its Store follows its source: on [Standby] (it lost etcd while
// another replica reads it) the Server drops its clients from the
// listeners of [Server.Listener], so that they move to that replica.
// [WatchFiles] and
// [WatchManifestFiles] feed a Store from files and keep the last good state
// against every bad file. The wire messages are made by package
// [github.com/inmesh/inmesh/destination], which also holds the clients.
//
// The Identity service's issuer ([Issuer]) signs workload certificates as
// Linkerd's identity controller does.
//
// A Server and the file watchers take [Option]s, the Issuer takes
// [IssuerOption]s; neither takes the other's, nor the client's.
package controlplane
