package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdFlags are the flags of the etcd store.
type etcdFlags struct {
	endpoints                 []string
	prefix                    string
	caFile, certFile, keyFile string
	// The replica's address for the others, and its bound on an etcd
	// out of reach.
	advertise  string
	staleAfter time.Duration
}

// etcdStartTimeout bounds the first read of the keys at start.
const etcdStartTimeout = 30 * time.Second

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// etcdClient connects to the etcd cluster of the flags.
func (f etcdFlags) client() (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: f.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if f.caFile != "" || f.certFile != "" || f.keyFile != "" {
		tc, err := f.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

func (f etcdFlags) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("-etcd-cacert: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-etcd-cacert: %s holds no PEM certificate", f.caFile)
		}
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, fmt.Errorf("-etcd-cert and -etcd-key go together")
	}
	if f.certFile != "" {
		c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("-etcd-cert, -etcd-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}

// watchEtcd feeds store from etcd through cli until ctx is done, and makes
// dst a replica (etcdstore.WithReplica) listed at the flags' -advertise,
// or else at listen when it names one IP address; wait returns, once ctx
// is done, when the watch has returned and cli is closed. When the watch
// cannot start, cli is closed at once.
func watchEtcd(ctx context.Context, store *controlplane.Store, cli *clientv3.Client, f etcdFlags, dst *controlplane.Server, listen net.Addr, log *slog.Logger) (wait func(), err error) {
	advertise := f.advertise
	if a, ok := listen.(*net.TCPAddr); advertise == "" && ok && !a.IP.IsUnspecified() {
		advertise = a.String()
	}
	if advertise == "" {
		log.Warn("no -advertise address: other replicas cannot hand their clients over to this one when they lose etcd", "listen", listen.String())
	}
	watched, err := etcdstore.Watch(ctx, store, cli, f.prefix, etcdstore.WithLogger(log), etcdstore.WithStartTimeout(etcdStartTimeout),
		etcdstore.WithReplica(dst, advertise), etcdstore.WithStaleAfter(f.staleAfter))
	if err != nil {
		cli.Close()
		return func() {}, err
	}
	// The client is closed once the watch has returned, never under it.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		<-ctx.Done()
		watched()
		cli.Close()
	}()
	log.Info("serving from etcd", "endpoints", strings.Join(f.endpoints, ","), "prefix", f.prefix, "advertise", advertise)
	return func() { <-closed }, nil
}
