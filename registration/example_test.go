package registration_test

import (
	"context"
	"log"
	"net/netip"
	"time"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/registration"
)

// A workload registers itself as an endpoint of books:7000 over mTLS with
// its identity, and drains before its listener closes.
func Example() {
	var local *identity.Local // the workload's identity (identity.Start)
	conn, err := registration.Dial("10.0.0.1:8083,10.0.0.2:8083", local,
		"linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	reg, err := registration.Register(context.Background(), conn, []registration.Endpoint{{
		Authority: "books.default.svc.cluster.local:7000",
		Addr:      netip.MustParseAddrPort("10.0.0.5:7000"),
		H2:        true,
		Labels:    map[string]string{"zone": "zone-a"},
	}}, registration.WithReady(local.Ready()))
	if err != nil {
		log.Fatal(err)
	}
	// ... serve; then, on shutdown:
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = reg.Drain(ctx, registration.DefaultDrainDelay) // then close the listener
}
