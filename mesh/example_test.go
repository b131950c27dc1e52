package mesh_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"go.opentelemetry.io/otel/metric/noop"
)

// Two meshed services on loopback, without a control plane: the server
// side is the inbound stack around an application, served on one port
// for HTTP/1 and h2c; the client side is the outbound stack, whose
// endpoints come from a static source that marks the server as a mesh
// peer. The HTTP/1 request crosses as HTTP/2 and reaches the application
// as the HTTP/1.1 request it was.
func Example() {
	noMetrics := mesh.WithMeterProvider(noop.NewMeterProvider())
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s for %s", r.Proto, r.URL.Path, r.Host)
	})
	server := mesh.NewServer(app, noMetrics)
	defer server.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := origproto.NewServer(server)
	go srv.Serve(origproto.GuardListener(lis))
	defer srv.Close()

	const books = "books.shop.svc.cluster.local:7000"
	endpoints, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := mesh.NewClient(mesh.WithEndpoints(endpoints), noMetrics)
	defer client.Close()
	resp, err := (&http.Client{Transport: client}).Get("http://" + books + "/books/12")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Proto, resp.StatusCode, string(body))
	// Output:
	// HTTP/1.1 200 HTTP/1.1 /books/12 for books.shop.svc.cluster.local:7000
}

// The inbound stack around a grpc.Server works the same way: a request
// that arrives as HTTP/2 reaches it as HTTP/2 (see NewServer).
func ExampleNewServer() {
	app := http.NotFoundHandler()
	server := mesh.NewServer(app, mesh.WithMeterProvider(noop.NewMeterProvider()))
	defer server.Close()
	_ = origproto.NewServer(server) // serve it on origproto.GuardListener(lis)
}
