package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/inmesh/inmesh/identity"
	"go.opentelemetry.io/otel/metric"
)

// identityFlags are the proxy's identity settings; LINKERD2_PROXY_IDENTITY_*
// variables fill in those the flags leave unset, so that the proxy finds
// its identity in a Linkerd pod spec as Linkerd's proxy would.
type identityFlags struct {
	name, tokenFile, anchorsFile, addr, serverName string
	trustDomain, namespace                         string
	keepalive                                      time.Duration // identity.Config.Keepalive
}

func (f *identityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "identity-name", "", "the proxy's identity, e.g. books.default.serviceaccount.identity.linkerd.cluster.local (or "+identity.EnvLocalName+"); empty: no mTLS")
	fs.StringVar(&f.tokenFile, "identity-token-file", "", "file holding the token that proves the identity (or "+identity.EnvTokenFile+")")
	fs.StringVar(&f.anchorsFile, "identity-trust-anchors", "", "PEM file of the trust anchors (or "+identity.EnvTrustAnchors+" with the PEM itself)")
	fs.StringVar(&f.addr, "identity-addr", "127.0.0.1:8083", "the Identity API's address, or several replicas comma-separated (or "+identity.EnvSvcAddr+")")
	fs.StringVar(&f.serverName, "identity-server-name", "", "the Identity service's own identity (or "+identity.EnvSvcName+"; default linkerd-identity.NS.serviceaccount.identity.NS.TRUST-DOMAIN)")
	fs.StringVar(&f.trustDomain, "trust-domain", "cluster.local", "identity trust domain, for the default -identity-server-name")
	fs.StringVar(&f.namespace, "identity-namespace", "linkerd", "the control plane's namespace, for the default -identity-server-name")
}

// resolved returns the flags with the Identity service's default name
// filled in.
func (f identityFlags) resolved() identityFlags {
	if f.serverName == "" {
		f.serverName = "linkerd-identity." + f.namespace + ".serviceaccount.identity." + f.namespace + "." + f.trustDomain
	}
	return f
}

// startIdentity returns the proxy's local identity, certified in the
// background by the Identity API (identity.NewSession) until the returned
// stop; nil without an identity name. The proxy serves before the first
// certificate, and says it is not ready until then, as Linkerd's proxy.
func startIdentity(ctx context.Context, f identityFlags, mp metric.MeterProvider, log *slog.Logger) (*identity.Local, func(), error) {
	env, fromEnv, err := identity.FromEnv()
	if err != nil {
		return nil, nil, err
	}
	var cfg identity.Config
	var minRefresh, maxRefresh time.Duration
	source, anchorsName := "the -identity-* flags", "-identity-trust-anchors "+f.anchorsFile
	switch {
	case f.name != "":
		if f.anchorsFile == "" {
			return nil, nil, errors.New("-identity-name needs -identity-trust-anchors")
		}
		if f.tokenFile == "" {
			return nil, nil, errors.New("-identity-name needs -identity-token-file")
		}
		f = f.resolved()
		cfg = identity.Config{Name: f.name, TrustAnchorsFile: f.anchorsFile, TokenFile: f.tokenFile,
			Addr: f.addr, ServerName: f.serverName}
	case fromEnv:
		cfg, minRefresh, maxRefresh = env.Config(), env.MinRefresh, env.MaxRefresh
		source, anchorsName = "the LINKERD2_PROXY_IDENTITY_* variables", identity.EnvTrustAnchors
	default:
		return nil, func() {}, nil
	}
	cfg.Keepalive = f.keepalive
	s, err := identity.NewSession(cfg, identity.WithLogger(log), identity.WithMeterProvider(mp),
		identity.WithRefreshBounds(minRefresh, maxRefresh), identity.WithAnchorsName(anchorsName))
	if err != nil {
		return nil, nil, fmt.Errorf("%s (%s): %w", source, anchorsName, err)
	}
	local := s.Local()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-local.Ready():
			log.Info("identity certified", "identity", local.Name(), "expires", local.Expiry())
		case <-ctx.Done():
		}
	}()
	return local, func() {
		cancel()
		s.Close()
	}, nil
}
