package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/inmesh/inmesh/identity"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// identityFlags are the proxy's identity settings; LINKERD2_PROXY_IDENTITY_*
// variables fill in those the flags leave unset, so that the proxy finds
// its identity in a Linkerd pod spec as Linkerd's proxy would.
type identityFlags struct {
	name, tokenFile, anchorsFile, addr, serverName string
	trustDomain, namespace                         string
}

func (f *identityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "identity-name", "", "the proxy's identity, e.g. books.default.serviceaccount.identity.linkerd.cluster.local (or "+identity.EnvLocalName+"); empty: no mTLS")
	fs.StringVar(&f.tokenFile, "identity-token-file", "", "file holding the token that proves the identity (or "+identity.EnvTokenFile+")")
	fs.StringVar(&f.anchorsFile, "identity-trust-anchors", "", "PEM file of the trust anchors (or "+identity.EnvTrustAnchors+" with the PEM itself)")
	fs.StringVar(&f.addr, "identity-addr", "127.0.0.1:8083", "the Identity API's address (or "+identity.EnvSvcAddr+")")
	fs.StringVar(&f.serverName, "identity-server-name", "", "the Identity service's own identity (or "+identity.EnvSvcName+"; default linkerd-identity.NS.serviceaccount.identity.NS.TRUST-DOMAIN)")
	fs.StringVar(&f.trustDomain, "trust-domain", "cluster.local", "identity trust domain, for the default -identity-server-name")
	fs.StringVar(&f.namespace, "identity-namespace", "linkerd", "the control plane's namespace, for the default -identity-server-name")
}

// startIdentity returns the proxy's local identity, certified in the
// background by the Identity API until ctx is done; nil without an
// identity name.
func startIdentity(ctx context.Context, f identityFlags, mp metric.MeterProvider, log *slog.Logger) (*identity.Local, func(), error) {
	env, fromEnv, err := identity.FromEnv()
	if err != nil {
		return nil, nil, err
	}
	var minRefresh, maxRefresh time.Duration
	anchorsPEM, anchorsName := []byte(nil), "-identity-trust-anchors "+f.anchorsFile
	if f.name == "" && fromEnv {
		f.name, f.tokenFile, f.addr, f.serverName = env.LocalName, env.TokenFile, env.SvcAddr, env.SvcName
		anchorsPEM, anchorsName = []byte(env.TrustAnchors), identity.EnvTrustAnchors
		minRefresh, maxRefresh = env.MinRefresh, env.MaxRefresh
	}
	if f.name == "" {
		return nil, func() {}, nil
	}
	if anchorsPEM == nil {
		if f.anchorsFile == "" {
			return nil, nil, errors.New("-identity-name needs -identity-trust-anchors")
		}
		if anchorsPEM, err = os.ReadFile(f.anchorsFile); err != nil {
			return nil, nil, fmt.Errorf("-identity-trust-anchors: %w", err)
		}
	}
	if f.tokenFile == "" {
		return nil, nil, errors.New("-identity-name needs -identity-token-file")
	}
	if f.serverName == "" {
		f.serverName = "linkerd-identity." + f.namespace + ".serviceaccount.identity." + f.namespace + "." + f.trustDomain
	}
	anchors, err := identity.ParseAnchors(anchorsPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", anchorsName, err)
	}
	local, err := identity.NewLocal(f.name, anchors)
	if err != nil {
		return nil, nil, fmt.Errorf("-identity-name: %w", err)
	}
	// grpc-go's reconnect backoff reaches 120 s by default: after a long
	// outage of the identity service the proxy would wait that long to
	// renew. Cap it at the minimum refresh interval, how often the
	// Certifier retries a failed renewal.
	reconnect := grpcbackoff.DefaultConfig
	reconnect.MaxDelay = identity.DefaultMinRefresh
	if minRefresh > 0 {
		reconnect.MaxDelay = max(minRefresh, reconnect.BaseDelay)
	}
	conn, err := grpc.NewClient("passthrough:///"+f.addr, grpc.WithTransportCredentials(local.TransportCredentials(f.serverName)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 20 * time.Second}))
	if err != nil {
		return nil, nil, fmt.Errorf("-identity-addr: %w", err)
	}
	c := identity.NewCertifier(local, conn, f.tokenFile, identity.WithLogger(log), identity.WithMeterProvider(mp),
		identity.WithRefreshBounds(minRefresh, maxRefresh), identity.WithAnchorsName(anchorsName))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	go func() {
		select {
		case <-local.Ready():
			log.Info("identity certified", "identity", local.Name(), "expires", local.Expiry())
		case <-ctx.Done():
		}
	}()
	return local, func() {
		cancel()
		<-done
		conn.Close()
	}, nil
}
