package main

import (
	"log/slog"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/examples/internal/identityplane"
)

// The workloads' identities, as Linkerd names service accounts.
var (
	serverID = controlplane.ServiceAccountIdentity("interop", "default", "linkerd", "cluster.local")
	clientID = controlplane.ServiceAccountIdentity("web", "default", "linkerd", "cluster.local")
)

// startIdentities starts the example's identity plane: each workload
// obtains its certificate over Linkerd's Identity API with its service
// account's token.
func startIdentities(log *slog.Logger) (*identityplane.Plane, error) {
	return identityplane.Start(
		controlplane.StaticTokens{"interop-token": serverID, "web-token": clientID},
		identityplane.WithNames("inmesh grpc example root", "inmesh grpc example issuer"),
		identityplane.WithTokenDir("inmesh-grpc-tokens"),
		identityplane.WithLogger(log))
}
