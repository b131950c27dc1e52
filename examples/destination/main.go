// Command destination runs inmesh's embedded control plane: it serves the
// ServiceProfiles of a directory and the endpoints of a file over Linkerd's
// Destination gRPC API, the outbound policies of the Service, HTTPRoute and
// GRPCRoute manifests of another directory over the OutboundPolicies API
// (same address), and reloads all of them when they change.
//
//	go run ./examples/destination -listen 127.0.0.1:8086 -profiles DIR -endpoints FILE -policies DIR
//
// A bad file is logged with its file, document and field, and the last good
// version stays served. On SIGTERM or SIGINT it ends every open stream, so
// that proxies re-subscribe at once (to its replacement), and exits within
// 5s.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/destination"
	"google.golang.org/grpc"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8086", "address to serve the Destination API on")
	profilesDir := flag.String("profiles", "", "directory of ServiceProfile YAML files")
	endpoints := flag.String("endpoints", "", "endpoints YAML file")
	policies := flag.String("policies", "", "directory of Service, HTTPRoute and GRPCRoute YAML files (OutboundPolicies API)")
	interval := flag.Duration("interval", 500*time.Millisecond, "how often to check the files for changes")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *profilesDir, *endpoints, *policies, *interval, log); err != nil {
		fmt.Fprintln(os.Stderr, "destination:", err)
		os.Exit(1)
	}
}

func run(listen, profilesDir, endpoints, policies string, interval time.Duration, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	store := destination.NewStore()
	if err := destination.WatchFiles(ctx, store, profilesDir, endpoints, interval, destination.WithLogger(log)); err != nil {
		return err
	}
	if policies != "" {
		if err := destination.WatchManifestFiles(ctx, store, policies, interval, destination.WithLogger(log)); err != nil {
			return err
		}
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	dst := destination.NewServer(store, destination.WithLogger(log))
	dst.Register(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.Info("serving the Destination API", "addr", lis.Addr().String(), "also", "OutboundPolicies")
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown(srv, dst, log)
	return <-served
}

// shutdownTimeout bounds the exit after SIGTERM.
const shutdownTimeout = 4 * time.Second

// shutdown ends every Destination and OutboundPolicies stream first, so that proxies re-subscribe
// at once (to this process's replacement), then stops the gRPC server:
// gracefully within the bound, at once past it.
func shutdown(srv *grpc.Server, dst *destination.Server, log *slog.Logger) {
	log.Info("shutting down: ending every stream")
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	_ = dst.Shutdown(ctx)
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		log.Warn("streams still open at the shutdown deadline; closing them")
		srv.Stop()
		<-stopped
	}
}
