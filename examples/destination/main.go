// Command destination runs inmesh's embedded control plane: it serves the
// ServiceProfiles of a directory and the endpoints of a file over Linkerd's
// Destination gRPC API, the outbound policies of the Service, HTTPRoute and
// GRPCRoute manifests of another directory over the OutboundPolicies API
// (same address), and reloads all of them when they change.
//
//	go run ./examples/destination -listen 127.0.0.1:8086 -profiles DIR -endpoints FILE -policies DIR
//
// With -identity-dir it also serves Linkerd's Identity API (Certify) over
// TLS on -identity-listen, with the identity service's own name
// (linkerd-identity.NS.serviceaccount.identity.NS.TRUSTDOMAIN), issuing
// certificates from the directory's issuer (ca.crt, issuer.crt,
// issuer.key; made there, and the path printed, when the directory holds
// none of them) to the workloads whose tokens -identity-tokens lists:
//
//	go run ./examples/destination ... -identity-dir DIR -identity-tokens FILE
//
// With -etcd-endpoints it serves the manifests and endpoints held in etcd
// under -etcd-prefix instead of files (package
// github.com/inmesh/inmesh/controlplane/etcdstore says which keys), so that
// any number of replicas over one etcd cluster serve the same answers;
// -etcd-cacert, -etcd-cert and -etcd-key give the TLS of etcd's client URLs:
//
//	go run ./examples/destination -etcd-endpoints https://10.0.0.1:2379,https://10.0.0.2:2379 -etcd-prefix /inmesh -etcd-cacert ca.crt ...
//
// A replica lists its address (-advertise, by default -listen) in etcd.
// One that cannot read etcd for -etcd-stale-after serves what it last
// read, and hands its clients over (it closes their connections, so that
// they connect to the next replica of their list) as soon as another
// replica answers that it reads etcd; it serves again once it reads etcd.
//
// Its subcommands apply, delete and get edit and list what etcd holds, as
// kubectl does a cluster's: apply validates a file or directory of
// manifests (and endpoints files) with the loader the control plane uses,
// together with what etcd holds, and writes them in one transaction, or
// nothing when a document is bad:
//
//	go run ./examples/destination apply -etcd-endpoints URLS -f examples/destination/policies -endpoints examples/destination/endpoints.yaml
//	go run ./examples/destination get -etcd-endpoints URLS
//	go run ./examples/destination delete -etcd-endpoints URLS -f authors.yaml
//
// Workloads register their own endpoints (package
// github.com/inmesh/inmesh/registration) over mTLS on -identity-listen,
// authenticated by their identity; with -etcd-endpoints the registrations
// are leased keys of etcd (-registration-ttl), served by every replica.
// -insecure-registration accepts plaintext registrants on -listen too, for
// development only.
//
// A bad file (or key) is logged with its file (or key), document and field,
// and the last good version stays served. On SIGTERM or SIGINT it ends every open stream, so
// that proxies re-subscribe at once (to its replacement), and exits within
// 5s.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "apply" || os.Args[1] == "delete" || os.Args[1] == "get") {
		os.Exit(runCommand(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
	}
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags]: serve the control-plane APIs\n"+
			"       %s apply|delete|get -etcd-endpoints URLS ...: edit and list what etcd holds (-h of each)\nflags:\n", os.Args[0], os.Args[0])
		flag.PrintDefaults()
	}
	listen := flag.String("listen", "127.0.0.1:8086", "address to serve the Destination API on")
	profilesDir := flag.String("profiles", "", "directory of ServiceProfile YAML files")
	endpoints := flag.String("endpoints", "", "endpoints YAML file")
	policies := flag.String("policies", "", "directory of the policy YAML files: Service, HTTPRoute and GRPCRoute (OutboundPolicies API); Pod, Server, AuthorizationPolicy, MeshTLSAuthentication, NetworkAuthentication, HTTPLocalRateLimitPolicy (InboundServerPolicies API)")
	interval := flag.Duration("interval", 500*time.Millisecond, "how often to check the files for changes")
	var id identityFlags
	flag.StringVar(&id.dir, "identity-dir", "", "directory of the trust anchors and issuer (ca.crt, issuer.crt, issuer.key; made when empty): serve the Identity API")
	flag.StringVar(&id.tokens, "identity-tokens", "", "tokens file: YAML list of token, serviceAccount, namespace")
	flag.DurationVar(&id.lifetime, "identity-lifetime", controlplane.DefaultIssuanceLifetime, "lifetime of issued certificates")
	flag.StringVar(&id.listen, "identity-listen", "127.0.0.1:8083", "address to serve the Identity API on (TLS)")
	flag.StringVar(&id.trustDomain, "trust-domain", "cluster.local", "identity trust domain")
	flag.StringVar(&id.namespace, "identity-namespace", "linkerd", "the control plane's namespace, in identity names")
	var ef etcdFlags
	flag.Func("etcd-endpoints", "comma-separated etcd client URLs: serve the manifests and endpoints held in etcd instead of files",
		func(v string) error { ef.endpoints = splitList(v); return nil })
	flag.StringVar(&ef.prefix, "etcd-prefix", "/inmesh", "etcd key prefix of the manifests and endpoints")
	flag.StringVar(&ef.caFile, "etcd-cacert", "", "PEM file of the CAs that sign etcd's server certificates (TLS to etcd)")
	flag.StringVar(&ef.certFile, "etcd-cert", "", "PEM client certificate for etcd (with -etcd-key)")
	flag.StringVar(&ef.keyFile, "etcd-key", "", "PEM private key of -etcd-cert")
	flag.StringVar(&ef.advertise, "advertise", "", "with -etcd-endpoints: the address (host:port) other replicas reach -listen at, listed in etcd so that a replica that loses etcd can hand its clients over to this one (default: -listen, when it names one IP address)")
	flag.DurationVar(&ef.staleAfter, "etcd-stale-after", etcdstore.DefaultStaleAfter, "with -etcd-endpoints: how long etcd may stay unreadable before this replica counts as stale and hands its clients over to a replica that reads etcd, if there is one")
	var inbound manifest.InboundOptions
	flag.Func("default-inbound-policy", "policy of pod ports no Server selects: all-unauthenticated (default), all-authenticated, cluster-unauthenticated, cluster-authenticated, deny or audit",
		func(v string) (err error) { inbound.DefaultMode, err = authz.ParseMode(v); return err })
	flag.Func("cluster-networks", "comma-separated CIDRs of the cluster-* policies (default Linkerd's: 10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12, 192.168.0.0/16)",
		func(v string) (err error) { inbound.ClusterNetworks, err = parsePrefixes(v); return err })
	insecureReg := flag.Bool("insecure-registration", false, "accept registrations from plaintext callers, unchecked (development only; registrations are otherwise authenticated by the workload's mTLS identity on -identity-listen)")
	regTTL := flag.Duration("registration-ttl", etcdstore.DefaultRegistrationTTL, "the lease TTL of a registration with -etcd-endpoints, the longest its endpoints outlive a replica that died (keep it above 1.5 x 15s, so that a live workload leaves a frozen replica before its lease expires); a silent client connection is pinged after half of it, and dropped when no answer comes within the other half")
	flag.Func("probe-networks", "comma-separated CIDRs the probe route of default policies admits (default none: no probe route)",
		func(v string) (err error) { inbound.ProbeNetworks, err = parsePrefixes(v); return err })
	flag.Parse()
	if err := id.check(); err != nil {
		fmt.Fprintln(os.Stderr, "destination:", err)
		os.Exit(2)
	}
	inbound.TrustDomain, inbound.ControlNamespace = id.trustDomain, id.namespace
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	store := controlplane.NewStore()
	store.SetInboundOptions(inbound)
	opts := []controlplane.Option{controlplane.WithLogger(log)}
	if *insecureReg {
		opts = append(opts, controlplane.WithInsecureRegistration())
	}
	if len(ef.endpoints) > 0 && (*profilesDir != "" || *endpoints != "" || *policies != "") {
		fmt.Fprintln(os.Stderr, "destination: -etcd-endpoints replaces -profiles, -endpoints and -policies")
		os.Exit(2)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "destination: -listen:", err)
		os.Exit(1)
	}
	var cli *clientv3.Client
	if len(ef.endpoints) > 0 {
		if cli, err = ef.client(); err != nil {
			fmt.Fprintln(os.Stderr, "destination:", err)
			os.Exit(1)
		}
		// Registrations are leased keys of etcd, which every replica
		// serves.
		opts = append(opts, controlplane.WithRegistry(etcdstore.NewRegistry(cli, ef.prefix, *regTTL)))
	}
	dst := controlplane.NewServer(store, opts...)
	wait := func() {}
	if cli != nil {
		wait, err = watchEtcd(ctx, store, cli, ef, dst, lis.Addr(), log)
	} else {
		err = watchFiles(ctx, store, *profilesDir, *endpoints, *policies, *interval, log)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "destination:", err)
		os.Exit(1)
	}
	if id.dir != "" {
		idSrv, err := serveIdentity(ctx, id, *interval, dst, log, controlplane.KeepaliveOptions(*regTTL)...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "destination:", err)
			os.Exit(1)
		}
		defer idSrv.Stop()
	}
	err = run(ctx, lis, dst, log, controlplane.KeepaliveOptions(*regTTL)...)
	stop()
	wait() // the etcd watch has returned and its client is closed
	if err != nil {
		fmt.Fprintln(os.Stderr, "destination:", err)
		os.Exit(1)
	}
}

// parsePrefixes reads a comma-separated list of CIDRs.
func parsePrefixes(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(v, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// watchFiles feeds store from the files, as before etcd.
func watchFiles(ctx context.Context, store *controlplane.Store, profilesDir, endpoints, policies string, interval time.Duration, log *slog.Logger) error {
	if err := controlplane.WatchFiles(ctx, store, profilesDir, endpoints, interval, controlplane.WithLogger(log)); err != nil {
		return err
	}
	if policies != "" {
		return controlplane.WatchManifestFiles(ctx, store, policies, interval, controlplane.WithLogger(log))
	}
	return nil
}

// run serves dst's APIs on lis until ctx is done, then shuts down. A
// replica on standby (controlplane.Standby) closes its connections, so
// that its clients move to another replica.
func run(ctx context.Context, lis net.Listener, dst *controlplane.Server, log *slog.Logger, srvOpts ...grpc.ServerOption) error {
	srv := grpc.NewServer(srvOpts...)
	dst.Register(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(dst.Listener(lis)) }()
	log.Info("serving the Destination API", "addr", lis.Addr().String(), "also", "OutboundPolicies, InboundServerPolicies")
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
func shutdown(srv *grpc.Server, dst *controlplane.Server, log *slog.Logger) {
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

type identityFlags struct {
	dir, tokens, listen, trustDomain, namespace string
	lifetime                                    time.Duration
}

// check refuses identity flags that serve nothing: tokens without the
// issuer's directory would leave the Identity API unserved without a word.
func (f identityFlags) check() error {
	switch {
	case f.tokens != "" && f.dir == "":
		return fmt.Errorf("-identity-tokens %s needs -identity-dir (the trust anchors and issuer) to serve the Identity API", f.tokens)
	case f.dir != "" && f.tokens == "":
		return fmt.Errorf("-identity-dir %s needs -identity-tokens (who may be certified)", f.dir)
	}
	return nil
}

// serveIdentity serves the Identity API on its own TLS listener, with the
// identity service's own certificate from its issuer, renewed as any; the
// same listener serves dst's APIs, Registration among them, to workloads
// that show their certificate (mTLS), whose identity authenticates their
// registrations.
func serveIdentity(ctx context.Context, f identityFlags, interval time.Duration, dst *controlplane.Server, log *slog.Logger, srvOpts ...grpc.ServerOption) (*grpc.Server, error) {
	dir, created, err := controlplane.LoadIdentityDir(f.dir)
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("made a new trust anchor and issuer", "dir", f.dir, "anchors", filepath.Join(f.dir, controlplane.TrustAnchorsFile))
	}
	tokens := controlplane.NewTokens(f.namespace, f.trustDomain)
	if err := controlplane.WatchTokens(ctx, tokens, f.tokens, interval, log); err != nil {
		return nil, err
	}
	issuer, err := controlplane.NewIssuer(dir.Anchors, dir.Chain, dir.Key, tokens,
		controlplane.WithIssuanceLifetime(f.lifetime), controlplane.WithIssuerLogger(log))
	if err != nil {
		return nil, err
	}
	self, err := identity.NewLocal(controlplane.IdentityServiceName(f.namespace, f.trustDomain), dir.Anchors)
	if err != nil {
		return nil, err
	}
	if err := issuer.CertifyLocal(self); err != nil {
		return nil, err
	}
	go issuer.KeepCertified(ctx, self)
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, fmt.Errorf("-identity-listen: %w", err)
	}
	// Linkerd's proxies negotiate no ALPN with the identity service.
	srv := grpc.NewServer(append(srvOpts, grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig())))...)
	issuer.Register(srv)
	dst.Register(srv)
	go srv.Serve(dst.Listener(lis))
	log.Info("serving the Identity API", "addr", lis.Addr().String(), "identity", self.Name())
	return srv, nil
}
