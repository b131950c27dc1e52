package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"google.golang.org/grpc"
)

// lineWriter passes each log line to a channel, so that the example prints
// them in a fixed order beside the updates.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- strings.TrimSpace(string(p))
	return len(p), nil
}

// A control plane serving an endpoints file over the Destination API: a
// client sees the file's endpoints; a bad edit is refused, named with its
// file and field, and the last good endpoints stay; the fix loads and
// says so.
func Example() {
	dir, err := os.MkdirTemp("", "controlplane-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	eps := filepath.Join(dir, "endpoints.yaml")
	write := func(content string) { // a finished copy renamed into place, as an editor or kubectl would
		tmp := eps + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			panic(err)
		}
		if err := os.Rename(tmp, eps); err != nil {
			panic(err)
		}
	}
	write("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - {addr: 127.0.0.1:4143, labels: {pod: books-0}}\n")

	logs := make(lineWriter, 16)
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		switch a.Key {
		case slog.TimeKey:
			return slog.Attr{} // stable output
		case "error", "file":
			return slog.String(a.Key, strings.ReplaceAll(a.Value.String(), dir+string(filepath.Separator), ""))
		}
		return a
	}}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := controlplane.NewStore()
	if err := controlplane.WatchFiles(ctx, store, "", eps, 20*time.Millisecond, controlplane.WithLogger(log)); err != nil {
		panic(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer()
	controlplane.NewServer(store).Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()

	client, err := destination.Dial(lis.Addr().String())
	if err != nil {
		panic(err)
	}
	defer client.Close()
	updates := make(chan endpoint.Update, 64)
	stop, err := client.WatchEndpoints(ctx, "books.default.svc.cluster.local:7000", func(u endpoint.Update) { updates <- u })
	if err != nil {
		panic(err)
	}
	defer stop()
	show := func(u endpoint.Update) {
		for _, e := range u.Set.Endpoints {
			fmt.Println("endpoint", e.Addr, "pod="+e.Labels["pod"])
		}
	}
	show(<-updates)

	write("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - {addr: 127.0.0.1:99999}\n")
	fmt.Println(<-logs)
	write("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - {addr: 127.0.0.1:4144, labels: {pod: books-1}}\n")
	for u := range updates { // the last good state may be sent again first
		if u.Set != nil && len(u.Set.Endpoints) == 1 && u.Set.Endpoints[0].Addr.Port() == 4144 {
			show(u)
			break
		}
	}
	fmt.Println(<-logs)
	// Output:
	// endpoint 127.0.0.1:4143 pod=books-0
	// level=WARN msg="rejected a control-plane file; serving the last good version" error="endpoints.yaml: [0].endpoints[0].addr: \"127.0.0.1:99999\" is not an ip:port address"
	// endpoint 127.0.0.1:4144 pod=books-1
	// level=INFO msg="loaded endpoints" file=endpoints.yaml
}

// Policy manifests that load but cannot work as written are named in the
// log with file, document and field: here a Server whose port no selected
// Pod declares and an AuthorizationPolicy requiring an authentication that
// no file defines.
func ExampleWatchManifestFiles() {
	dir, err := os.MkdirTemp("", "controlplane-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	const manifests = `apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec:
  containers:
  - name: app
    ports: [{name: http, containerPort: 7000}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books, namespace: default}
spec: {podSelector: {matchLabels: {app: books}}, port: 8080}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-authors, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books}
  requiredAuthenticationRefs:
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: authors}
`
	if err := os.WriteFile(filepath.Join(dir, "books.yaml"), []byte(manifests), 0o644); err != nil {
		panic(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		switch a.Key {
		case slog.TimeKey, "dir":
			return slog.Attr{} // stable output
		case "error":
			return slog.String(a.Key, strings.ReplaceAll(a.Value.String(), dir+string(filepath.Separator), ""))
		}
		return a
	}}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := controlplane.WatchManifestFiles(ctx, controlplane.NewStore(), dir, time.Second, controlplane.WithLogger(log)); err != nil {
		panic(err)
	}
	// Output:
	// level=WARN msg="a loaded policy manifest cannot work as written" error="books.yaml: document 3 (AuthorizationPolicy default/books-authors): spec.requiredAuthenticationRefs[0]: MeshTLSAuthentication default/authors is not defined in any file; the policy authorizes no one until it is"
	// level=WARN msg="a loaded policy manifest cannot work as written" error="books.yaml: document 2 (Server default/books): spec.port: 8080 is no TCP container port of the Pods it selects (default/books-0, which declare 7000); the ports they serve keep the default policy"
}
