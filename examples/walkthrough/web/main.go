// Command web calls books through the mesh: discovery by name, mTLS to
// the identity the control plane names for the endpoint, its own identity
// presented.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
)

func main() {
	control := flag.String("control", "127.0.0.1:8086", "the control plane's Destination and policy APIs")
	idAddr := flag.String("identity", "127.0.0.1:8083", "the control plane's Identity API")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	id, err := identity.Start(ctx, identity.Config{
		Name:             "web.default.serviceaccount.identity.linkerd.cluster.local",
		TrustAnchorsFile: "mesh/identity/ca.crt",
		TokenFile:        "mesh/web.token",
		Addr:             *idAddr,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer id.Close()

	dst, err := destination.Dial(*control, destination.WithWorkload("default:web-0"))
	if err != nil {
		log.Fatal(err)
	}
	defer dst.Close()
	client := mesh.NewClient(mesh.WithDestination(dst), mesh.WithIdentity(id.Local()))
	defer client.Close()

	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}
	resp, err := hc.Get("http://books.default.svc.cluster.local:7000/books")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%s: %s", resp.Status, body)
}
