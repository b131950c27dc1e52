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
	Addr  string
	Store *controlplane.Store

	srv      *grpc.Server
	cli      *clientv3.Client
	cancel   context.CancelFunc
	wait     func()
	stopOnce sync.Once
}

// Start starts a replica over the etcd cluster of endpoints (client URLs),
// reading the keys under prefix. It returns once the keys are loaded and
// the APIs serve.
func Start(endpoints []string, prefix string, log *slog.Logger, opts ...Option) (*Replica, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	r := &Replica{Store: controlplane.NewStore(), cli: cli}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	retry, err := backoff.Fixed(100 * time.Millisecond)
	if err != nil {
		cancel()
		cli.Close()
		return nil, err
	}
	r.wait, err = etcdstore.Watch(ctx, r.Store, cli, prefix, etcdstore.WithLogger(log),
		etcdstore.WithStartTimeout(30*time.Second), etcdstore.WithRetry(retry))
	if err != nil {
		cancel()
		cli.Close()
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.Kill()
		return nil, err
	}
	r.Addr = lis.Addr().String()
	r.srv = grpc.NewServer(controlplane.KeepaliveOptions(etcdstore.DefaultRegistrationTTL)...)
	cpOpts := []controlplane.Option{controlplane.WithLogger(log)}
	if cfg.registration {
		cpOpts = append(cpOpts, controlplane.WithRegistry(etcdstore.NewRegistry(cli, prefix, etcdstore.DefaultRegistrationTTL)),
			controlplane.WithInsecureRegistration())
	}
	controlplane.NewServer(r.Store, cpOpts...).Register(r.srv)
	go r.srv.Serve(lis)
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

type config struct{ registration bool }

// WithInsecureRegistration makes the replica serve the Registration API
// too, with leases in etcd (etcdstore.NewRegistry), to plaintext
// registrants: the insecure mode of development, for a fleet on one
// machine.
func WithInsecureRegistration() Option { return func(c *config) { c.registration = true } }
