// Command mesh runs an inmesh demo in one process on loopback: an embedded
// Destination control plane serving the books ServiceProfile and endpoints
// shipped beside this file, and a client that watches them over gRPC, prints
// what it learns, and sees a profile change pushed to it.
//
//	go run ./examples/mesh
//
// The control-plane backoff can be set with INMESH_CONTROL_EXP_BACKOFF_MIN,
// _MAX and _JITTER, or INMESH_CONTROL_BACKOFF_DELAY.
package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/profiles"
	"google.golang.org/grpc"
)

var (
	//go:embed books.yaml
	booksProfile []byte
	//go:embed endpoints.yaml
	booksEndpoints []byte
)

const authority = "books.default.svc.cluster.local:7000"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mesh:", err)
		os.Exit(1)
	}
}

func run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	policy, err := backoff.FromEnv("INMESH_CONTROL", backoff.DefaultPolicy)
	if err != nil {
		return err
	}

	// The embedded control plane.
	sps, err := profiles.ParseServiceProfiles(booksProfile)
	if err != nil {
		return fmt.Errorf("books.yaml: %w", err)
	}
	sets, err := destination.ParseEndpoints(booksEndpoints)
	if err != nil {
		return fmt.Errorf("endpoints.yaml: %w", err)
	}
	store := destination.NewStore()
	store.SetServiceProfiles(sps)
	store.SetEndpoints(sets)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	destination.NewServer(store, log).Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()
	fmt.Printf("destination server on %s\n", lis.Addr())

	// The data plane's view of it.
	client, err := destination.Dial(lis.Addr().String(), destination.WithBackoff(policy), destination.WithLogger(log))
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	updates := make(chan profiles.Update, 8)
	stop, err := client.Watch(ctx, authority, func(u profiles.Update) { updates <- u })
	if err != nil {
		return err
	}
	defer stop()
	endpoints := make(chan destination.EndpointsUpdate, 8)
	stopEps, err := client.WatchEndpoints(ctx, authority, func(u destination.EndpointsUpdate) { endpoints <- u })
	if err != nil {
		return err
	}
	defer stopEps()

	p, err := next(ctx, updates)
	if err != nil {
		return err
	}
	printProfile(p)
	select {
	case u := <-endpoints:
		if u.Set == nil {
			return fmt.Errorf("endpoints: %v", u.Err)
		}
		fmt.Printf("\nendpoints of %s:\n", authority)
		for _, e := range u.Set.Endpoints {
			fmt.Printf("  %-16s weight %-5d h2 %-5v labels %v\n", e.Addr, e.Weight, e.H2, e.Labels)
		}
	case <-ctx.Done():
		return errors.New("no endpoints")
	}

	// An edit on the control plane reaches the watcher without polling.
	edited := *sps[0]
	edited.Routes = append([]profiles.Route{{
		Condition: profiles.MatchAll{profiles.Method("DELETE"), profiles.PathRegex("/books/[^/]+")},
		Labels:    map[string]string{"route": "DELETE /books/{id}"},
	}}, edited.Routes...)
	start := time.Now()
	store.PutServiceProfile(&edited)
	p, err = next(ctx, updates)
	if err != nil {
		return err
	}
	fmt.Printf("\nprofile update pushed in %v:\n", time.Since(start).Round(time.Microsecond))
	printProfile(p)
	return nil
}

func next(ctx context.Context, updates <-chan profiles.Update) (*profiles.Profile, error) {
	select {
	case u := <-updates:
		if u.Profile == nil {
			return nil, fmt.Errorf("no profile: %v", u.Err)
		}
		return u.Profile, nil
	case <-ctx.Done():
		return nil, errors.New("no profile arrived")
	}
}

func printProfile(p *profiles.Profile) {
	fmt.Printf("\nprofile of %s (retry budget %.0f%% + %d/s, ttl %v):\n", p.FullyQualifiedName,
		p.RetryBudget.RetryRatio*100, p.RetryBudget.MinRetriesPerSecond, p.RetryBudget.TTL)
	fmt.Printf("  %-22s %-10s %-8s\n", "ROUTE", "RETRYABLE", "TIMEOUT")
	for _, r := range p.Routes {
		timeout := "-"
		if r.Timeout > 0 {
			timeout = r.Timeout.String()
		}
		fmt.Printf("  %-22s %-10v %-8s\n", r.Labels["route"], r.Retryable, timeout)
	}
}
