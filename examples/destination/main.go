// Command destination runs inmesh's embedded Destination control plane: it
// serves the ServiceProfiles of a directory and the endpoints of a file over
// Linkerd's Destination gRPC API, and reloads both when they change.
//
//	go run ./examples/destination -listen 127.0.0.1:8086 -profiles DIR -endpoints FILE
//
// A bad file is logged with its file, document and field, and the last good
// version stays served.
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
	interval := flag.Duration("interval", 500*time.Millisecond, "how often to check the files for changes")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *profilesDir, *endpoints, *interval, log); err != nil {
		fmt.Fprintln(os.Stderr, "destination:", err)
		os.Exit(1)
	}
}

func run(listen, profilesDir, endpoints string, interval time.Duration, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	store := destination.NewStore()
	if err := destination.WatchFiles(ctx, store, profilesDir, endpoints, interval, destination.WithLogger(log)); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	destination.NewServer(store, destination.WithLogger(log)).Register(srv)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Info("serving the Destination API", "addr", lis.Addr().String())
	return srv.Serve(lis)
}
