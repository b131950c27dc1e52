package destination_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/profiles"
	"google.golang.org/grpc"
)

// A client watching the embedded control plane over loopback.
func ExampleClient_WatchEndpoints() {
	store := controlplane.NewStore()
	store.PutEndpoints("books.default.svc.cluster.local:7000", []endpoint.Endpoint{
		{Addr: netip.MustParseAddrPort("127.0.0.1:4143"), H2: true},
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := grpc.NewServer()
	controlplane.NewServer(store).Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	client, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	got := make(chan endpoint.Update, 1)
	stop, err := client.WatchEndpoints(context.Background(), "books.default.svc.cluster.local:7000",
		func(u endpoint.Update) { got <- u })
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	u := <-got
	for _, e := range u.Set.Endpoints {
		fmt.Println(e.Addr, "h2:", e.H2, "weight:", e.Weight)
	}

	profile := make(chan profiles.Update, 1)
	stopP, _ := client.Watch(context.Background(), "books.default.svc.cluster.local:7000",
		func(u profiles.Update) { profile <- u })
	defer stopP()
	p := (<-profile).Profile
	fmt.Println(p.FullyQualifiedName, "routes:", len(p.Routes), "retry ratio:", p.RetryBudget.RetryRatio)
	// Output:
	// 127.0.0.1:4143 h2: true weight: 10000
	// books.default.svc.cluster.local routes: 0 retry ratio: 0.2
}
