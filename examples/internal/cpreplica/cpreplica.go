// Package cpreplica runs a replica of inmesh's embedded control plane in
// this process, as examples/destination -etcd-endpoints does in its own:
// a controlplane.Store fed from etcd by etcdstore.Watch, and the
// Destination, OutboundPolicies and InboundServerPolicies APIs over it on
// a port of 127.0.0.1 that the kernel picks. The fleet demo and the bench
// start several and kill one.
package cpreplica

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Replica is a running control-plane replica.
type Replica struct {
	// Addr is the address of its gRPC APIs.
	Addr   string
	Store  *controlplane.Store
	Server *controlplane.Server

	srv      *grpc.Server
	cli      *clientv3.Client
	cancel   context.CancelFunc
	wait     func()
	stopOnce sync.Once
}

// Start starts a replica over the etcd cluster of endpoints (client URLs),
// reading the keys under prefix. It returns once the keys are loaded and
// the APIs serve. The replica lists its address in etcd and stands by
// while it cannot read etcd and another replica can
// (etcdstore.WithReplica).
func Start(endpoints []string, prefix string, log *slog.Logger, opts ...Option) (*Replica, error) {
	cfg := config{ttl: etcdstore.DefaultRegistrationTTL}
	for _, o := range opts {
		o(&cfg)
	}
	retry, err := backoff.Fixed(100 * time.Millisecond)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cli.Close()
		return nil, err
	}
	r := &Replica{Addr: lis.Addr().String(), Store: controlplane.NewStore(), cli: cli}
	cpOpts := []controlplane.Option{controlplane.WithLogger(log)}
	if cfg.registration {
		cpOpts = append(cpOpts, controlplane.WithRegistry(etcdstore.NewRegistry(cli, prefix, cfg.ttl)),
			controlplane.WithInsecureRegistration())
	}
	r.Server = controlplane.NewServer(r.Store, cpOpts...)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	watchOpts := []etcdstore.Option{etcdstore.WithLogger(log), etcdstore.WithStartTimeout(30 * time.Second), etcdstore.WithRetry(retry),
		etcdstore.WithReplica(r.Server, r.Addr)}
	if cfg.staleAfter > 0 {
		watchOpts = append(watchOpts, etcdstore.WithStaleAfter(cfg.staleAfter))
	}
	r.wait, err = etcdstore.Watch(ctx, r.Store, cli, prefix, watchOpts...)
	if err != nil {
		cancel()
		lis.Close()
		cli.Close()
		return nil, err
	}
	r.srv = grpc.NewServer(controlplane.KeepaliveOptions(cfg.ttl)...)
	r.Server.Register(r.srv)
	go r.srv.Serve(r.Server.Listener(lis))
	return r, nil
}

// Kill stops the replica as a crash would: its listener and every
// connection to it close at once, without ending the streams first; then
// its etcd watch ends and its etcd client closes.
func (r *Replica) Kill() {
	r.stopOnce.Do(func() {
		if r.srv != nil {
			r.srv.Stop()
		}
		r.cancel()
		r.wait()
		r.cli.Close()
	})
}

// Option configures [Start].
type Option func(*config)

type config struct {
	registration bool
	ttl          time.Duration
	staleAfter   time.Duration
}

// WithInsecureRegistration makes the replica serve the Registration API
// too, with leases in etcd (etcdstore.NewRegistry), to plaintext
// registrants: the insecure mode of development, for a fleet on one
// machine.
func WithInsecureRegistration() Option { return func(c *config) { c.registration = true } }

// WithRegistrationTTL sets the lease TTL of the registrations (default
// etcdstore.DefaultRegistrationTTL); d <= 0 changes nothing.
func WithRegistrationTTL(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.ttl = d
		}
	}
}

// WithStaleAfter sets how long the replica may fail to read etcd before
// it counts as stale (default etcdstore.DefaultStaleAfter); d <= 0
// changes nothing.
func WithStaleAfter(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.staleAfter = d
		}
	}
}
