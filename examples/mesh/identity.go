package main

import (
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/examples/internal/identityplane"
)

// The peers' identities, as Linkerd names service accounts' workloads.
var (
	booksID   = controlplane.ServiceAccountIdentity("books", "default", "linkerd", "cluster.local")
	webID     = controlplane.ServiceAccountIdentity("web", "default", "linkerd", "cluster.local")
	reviewsID = controlplane.ServiceAccountIdentity("reviews", "default", "linkerd", "cluster.local")
)

// startIdentities starts the demo's identity plane: each peer obtains its
// certificate over Linkerd's Identity API with its service account's
// token, as a proxy in a pod obtains its own.
func startIdentities() (*identityplane.Plane, error) {
	return identityplane.Start(
		controlplane.StaticTokens{"books-token": booksID, "web-token": webID, "reviews-token": reviewsID},
		identityplane.WithNames("inmesh demo root", "inmesh demo issuer"),
		identityplane.WithTokenDir("inmesh-demo-tokens"))
}
