// Command books is a service in the mesh: it proves its own identity,
// terminates mTLS, and admits only the callers its Server's policy names.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7000", "address to serve on (the Pod's containerPort)")
	control := flag.String("control", "127.0.0.1:8086", "the control plane's Destination and policy APIs")
	idAddr := flag.String("identity", "127.0.0.1:8083", "the control plane's Identity API")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// Who this process is: the service account books in namespace default,
	// proved by its token, certified by the Identity API and renewed.
	id, err := identity.Start(ctx, identity.Config{
		Name:             "books.default.serviceaccount.identity.linkerd.cluster.local",
		TrustAnchorsFile: "mesh/identity/ca.crt",
		TokenFile:        "mesh/books.token",
		Addr:             *idAddr,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer id.Close()

	// The pod this process stands for, whose Servers apply to its ports.
	dst, err := destination.Dial(*control, destination.WithWorkload("default:books-0"))
	if err != nil {
		log.Fatal(err)
	}
	defer dst.Close()

	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "books, for %s\n", r.Header.Get("l5d-client-id"))
	})
	// Every service on this host connects from 127.0.0.1: WithoutLocalhost
	// keeps that from admitting them all.
	server := mesh.NewServer(app, mesh.WithIdentity(id.Local()),
		mesh.WithInboundPolicy(authz.WithSource(dst.InboundPolicies()), authz.WithoutLocalhost()))
	defer server.Close()

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("books listening on %s", lis.Addr())
	srv := origproto.NewServer(server)
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(server.Listener(lis)); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
