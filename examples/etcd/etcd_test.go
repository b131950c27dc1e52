// Package etcd_test runs the embedded control plane on a real etcd (from
// etcd's embed package): replicas that serve the same answers, a bad key
// refused by every replica, and a replica that resumes its watch after its
// connection to etcd broke.
package etcd_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/cpreplica"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/internal/testutil"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"
)

const (
	timeout   = 30 * time.Second
	prefix    = "/inmesh"
	authority = "authors.default.svc.cluster.local:7001"
)

// authorsYAML is one manifest file: a Service, its HTTPRoute and its
// ServiceProfile, as users keep a service's resources.
func authorsYAML(pathPrefix string) string {
	return `apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec:
  ports: [{port: 7001}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: authors, namespace: default}
spec:
  parentRefs:
  - {kind: Service, group: core, name: authors, port: 7001}
  rules:
  - matches:
    - path: {type: PathPrefix, value: ` + pathPrefix + `}
---
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: authors.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: GET /authors
    condition: {method: GET, pathRegex: /authors}
`
}

func endpointsYAML(addrs ...string) string {
	s := "- authority: " + authority + "\n  endpoints:\n"
	for _, a := range addrs {
		s += "  - addr: " + a + "\n"
	}
	return s
}

func newClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: timeout, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func put(t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := cli.Put(ctx, key, value)
	require.NoError(t, err)
}

// replica is one control-plane process: a Store fed from etcd and the
// Server of the Destination and policy APIs over it.
type replica struct {
	logs testutil.LogLines
	dst  pb.DestinationClient
	pol  outboundpb.OutboundPoliciesClient
	in   inboundpb.InboundServerPoliciesClient
	// stop ends the replica's etcd watch and returns once it has
	// returned.
	stop func()
}

func startReplica(t *testing.T, endpoint string) *replica {
	t.Helper()
	r := &replica{}
	ctx, cancel := context.WithCancel(context.Background())
	cli := newClient(t, endpoint)
	store := controlplane.NewStore()
	fast, err := backoff.Fixed(50 * time.Millisecond)
	require.NoError(t, err)
	wait, err := etcdstore.Watch(ctx, store, cli, prefix,
		etcdstore.WithLogger(r.logs.Logger()), etcdstore.WithLogInterval(time.Millisecond), etcdstore.WithRetry(fast))
	require.NoError(t, err)
	r.stop = func() { cancel(); wait() }
	t.Cleanup(r.stop) // before the client closes (cleanups run last first)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(r.logs.Logger())).Register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	r.dst, r.pol, r.in = pb.NewDestinationClient(cc), outboundpb.NewOutboundPoliciesClient(cc), inboundpb.NewInboundServerPoliciesClient(cc)
	return r
}

// streams are one client's open Get, GetProfile and OutboundPolicies
// Watch streams of the authors authority.
type streams struct {
	get     grpc.ServerStreamingClient[pb.Update]
	profile grpc.ServerStreamingClient[pb.DestinationProfile]
	policy  grpc.ServerStreamingClient[outboundpb.OutboundPolicy]
}

func (r *replica) open(t *testing.T) *streams {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &streams{}
	var err error
	s.get, err = r.dst.Get(ctx, &pb.GetDestination{Path: authority})
	require.NoError(t, err)
	s.profile, err = r.dst.GetProfile(ctx, &pb.GetDestination{Path: authority})
	require.NoError(t, err)
	s.policy, err = r.pol.Watch(ctx, &outboundpb.TrafficSpec{SourceWorkload: "pod:default:caller",
		Target: &outboundpb.TrafficSpec_Authority{Authority: authority}})
	require.NoError(t, err)
	return s
}

// recv returns the next message of a stream, failing the test past the
// deadline.
func recv[M any](t *testing.T, what string, f func() (M, error)) M {
	t.Helper()
	type result struct {
		m   M
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := f()
		ch <- result{m, err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err, what)
		return r.m
	case <-time.After(timeout):
		t.Fatalf("%s: no message within %v", what, timeout)
	}
	panic("unreachable")
}

// noMessage checks that a stream sends nothing within d.
func noMessage[M any](t *testing.T, what string, d time.Duration, f func() (M, error)) <-chan M {
	t.Helper()
	ch := make(chan M, 1)
	go func() {
		if m, err := f(); err == nil {
			ch <- m
		}
	}()
	select {
	case m := <-ch:
		t.Fatalf("%s: unexpected message %v", what, m)
	case <-time.After(d):
	}
	return ch
}

func same(t *testing.T, what string, a, b proto.Message) {
	t.Helper()
	assert.Empty(t, cmp.Diff(a, b, protocmp.Transform()), "%s: the replicas differ", what)
}

func addrs(u *pb.Update) []string {
	var out []string
	for _, a := range u.GetAdd().GetAddrs() {
		ip := a.GetAddr().GetIp().GetIpv4()
		out = append(out, net.IPv4(byte(ip>>24), byte(ip>>16), byte(ip>>8), byte(ip)).String())
	}
	return out
}

func pathPrefixes(p *outboundpb.OutboundPolicy) string {
	var b strings.Builder
	for _, r := range p.GetProtocol().GetDetect().GetHttp1().GetRoutes() {
		for _, rule := range r.GetRules() {
			for _, m := range rule.GetMatches() {
				b.WriteString(m.GetPath().GetPrefix() + " ")
			}
		}
	}
	return b.String()
}

// Two control-plane replicas over one etcd serve identical Destination,
// profile, OutboundPolicies and InboundServerPolicies answers, and a change
// written to etcd reaches the open streams of both.
func TestReplicasServeTheSameAnswers(t *testing.T) {
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/authors"))
	put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143"))

	a, b := startReplica(t, m.Endpoint), startReplica(t, m.Endpoint)
	sa, sb := a.open(t), b.open(t)
	ua, ub := recv(t, "a Get", sa.get.Recv), recv(t, "b Get", sb.get.Recv)
	assert.Equal(t, []string{"127.0.0.1"}, addrs(ua))
	same(t, "Get", ua, ub)
	pa, pb := recv(t, "a GetProfile", sa.profile.Recv), recv(t, "b GetProfile", sb.profile.Recv)
	require.Len(t, pa.GetRoutes(), 1, "the ServiceProfile from etcd is served")
	same(t, "GetProfile", pa, pb)
	oa, ob := recv(t, "a policy", sa.policy.Recv), recv(t, "b policy", sb.policy.Recv)
	assert.Contains(t, pathPrefixes(oa), "/authors", "the HTTPRoute from etcd is served")
	same(t, "OutboundPolicies", oa, ob)

	// An endpoint added in etcd reaches both replicas' streams.
	changed := time.Now()
	put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143", "127.0.0.2:4143"))
	ua, ub = recv(t, "a Get after the change", sa.get.Recv), recv(t, "b Get after the change", sb.get.Recv)
	t.Logf("an endpoint written to etcd reached both replicas' streams in %v", time.Since(changed))
	assert.Equal(t, []string{"127.0.0.2"}, addrs(ua))
	same(t, "Get after the change", ua, ub)

	// A route changed in etcd reaches both replicas' policy streams.
	put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/writers"))
	oa, ob = recv(t, "a policy after the change", sa.policy.Recv), recv(t, "b policy after the change", sb.policy.Recv)
	assert.Contains(t, pathPrefixes(oa), "/writers")
	same(t, "OutboundPolicies after the change", oa, ob)

	// The InboundServerPolicies answers of a pod port: the same from both,
	// and a Server written to etcd reaches both.
	const pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: web-0, namespace: default, labels: {app: web}}\nspec: {containers: [{name: web}]}\n"
	put(t, admin, etcdstore.ManifestKey(prefix, "web"), pod)
	const srv = "---\napiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: web-http, namespace: default}\nspec: {podSelector: {matchLabels: {app: web}}, port: 8080, proxyProtocol: HTTP/1}\n"
	inbound := func(r *replica) *inboundpb.Server {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		got, err := r.in.GetPort(ctx, &inboundpb.PortSpec{Workload: "default:web-0", Port: 8080})
		if err != nil {
			return nil
		}
		return got
	}
	for _, want := range []string{"all-unauthenticated", "web-http"} {
		if want == "web-http" {
			put(t, admin, etcdstore.ManifestKey(prefix, "web"), pod+srv)
		}
		for _, r := range []*replica{a, b} {
			require.Eventually(t, func() bool { return inbound(r).GetLabels()["name"] == want }, timeout, 10*time.Millisecond, want)
		}
		same(t, "InboundServerPolicies "+want, inbound(a), inbound(b))
	}

	// A client new to either replica gets the same state.
	na, nb := a.open(t), b.open(t)
	same(t, "a fresh Get", recv(t, "a fresh Get", na.get.Recv), recv(t, "b fresh Get", nb.get.Recv))
	same(t, "a fresh policy", recv(t, "a fresh policy", na.policy.Recv), recv(t, "b fresh policy", nb.policy.Recv))
}

// Once a replica's watch is cancelled and waited for, nothing more is
// loaded into its store: a change that another replica over the same etcd
// serves does not reach it, neither a fresh client nor an open stream.
func TestWatchWaitEndsLoading(t *testing.T) {
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/authors"))
	put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143"))
	stopped, live := startReplica(t, m.Endpoint), startReplica(t, m.Endpoint)
	ss, sl := stopped.open(t), live.open(t)
	assert.Equal(t, []string{"127.0.0.1"}, addrs(recv(t, "stopped Get", ss.get.Recv)))
	assert.Equal(t, []string{"127.0.0.1"}, addrs(recv(t, "live Get", sl.get.Recv)))

	stopped.stop()
	put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143", "127.0.0.2:4143"))
	assert.Equal(t, []string{"127.0.0.2"}, addrs(recv(t, "live Get after the change", sl.get.Recv)))
	fresh := stopped.open(t)
	assert.Equal(t, []string{"127.0.0.1"}, addrs(recv(t, "stopped fresh Get", fresh.get.Recv)), "the store kept the state before the wait")
	noMessage(t, "stopped Get after the change", time.Second, ss.get.Recv)
	assert.Zero(t, stopped.logs.Count("loaded the control-plane keys"), "nothing loaded after the first read:\n%s", stopped.logs.String())
}

// A bad manifest written to etcd is refused by every replica, logged with
// its key, document and field, and both keep serving the last good state;
// once the key is fixed, the change reaches both.
func TestBadKeyRefusedByEveryReplica(t *testing.T) {
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/authors"))
	put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143"))
	replicas := []*replica{startReplica(t, m.Endpoint), startReplica(t, m.Endpoint)}
	var open []*streams
	for _, r := range replicas {
		s := r.open(t)
		recv(t, "Get", s.get.Recv)
		recv(t, "policy", s.policy.Recv)
		open = append(open, s)
	}

	bad := strings.Replace(authorsYAML("/writers"), "PathPrefix", "Glob", 1)
	badKey := etcdstore.ManifestKey(prefix, "authors")
	put(t, admin, badKey, bad)
	badEndpoints := etcdstore.EndpointsKey(prefix, "more")
	put(t, admin, badEndpoints, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.\n")
	for i, r := range replicas {
		require.Eventually(t, func() bool {
			return r.logs.Count("rejected a control-plane key", badKey+": document 2 (HTTPRoute default/authors): spec.rules[0].matches[0].path.type") > 0 &&
				r.logs.Count("rejected a control-plane key", badEndpoints+": [0].endpoints[0].addr") > 0
		}, timeout, 10*time.Millisecond, "replica %d logs the bad keys with their fields:\n%s", i, r.logs.String())
		// The open streams got nothing, and a new one gets the last good state.
		noMessage(t, "policy stream after the bad key", 200*time.Millisecond, open[i].policy.Recv)
		fresh := r.open(t)
		assert.Contains(t, pathPrefixes(recv(t, "fresh policy", fresh.policy.Recv)), "/authors", "replica %d serves the last good route", i)
		assert.Equal(t, []string{"127.0.0.1"}, addrs(recv(t, "fresh Get", fresh.get.Recv)))
		p := recv(t, "fresh profile", fresh.profile.Recv)
		assert.Len(t, p.GetRoutes(), 1, "replica %d serves the last good profile", i)
	}

	// Fixed: every replica loads it.
	put(t, admin, badKey, authorsYAML("/writers"))
	for i, r := range replicas {
		fresh := r.open(t)
		require.Eventually(t, func() bool {
			return strings.Contains(pathPrefixes(recv(t, "policy", fresh.policy.Recv)), "/writers")
		}, timeout, time.Millisecond, "replica %d loads the fixed key", i)
	}
}

// proxy is a TCP proxy to etcd that can break every connection through it
// and refuse new ones, and later let them through again, on the same port.
type proxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	broken bool
	conns  []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{lis: lis, target: target}
	t.Cleanup(func() {
		lis.Close()
		p.setBroken(true)
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.broken {
				p.mu.Unlock()
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) setBroken(b bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = b
	if b {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// A replica whose connection to etcd breaks resumes its watch from the
// last revision it saw once etcd is reachable again: a change made
// meanwhile reaches its streams. When that revision was compacted
// meanwhile, it reads every key again and the change arrives too.
func TestReplicaResumesAfterBrokenConnection(t *testing.T) {
	for _, compact := range []bool{false, true} {
		name := "resume"
		if compact {
			name = "compacted"
		}
		t.Run(name, func(t *testing.T) {
			m := etcdtest.Start(t)
			admin := newClient(t, m.Endpoint)
			put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/authors"))
			put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143"))
			px := startProxy(t, strings.TrimPrefix(m.Endpoint, "http://"))
			r := startReplica(t, "http://"+px.lis.Addr().String())
			s := r.open(t)
			recv(t, "Get", s.get.Recv)
			recv(t, "policy", s.policy.Recv)

			px.setBroken(true)
			put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), endpointsYAML("127.0.0.1:4143", "127.0.0.2:4143"))
			put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/writers"))
			if compact {
				// Changes beyond the prefix move the revision on, then
				// everything before is compacted.
				put(t, admin, "/elsewhere", "x")
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				resp, err := admin.Get(ctx, "/elsewhere")
				require.NoError(t, err)
				_, err = admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
				cancel()
				require.NoError(t, err)
			}
			px.setBroken(false)

			u := recv(t, "Get after the reconnection", s.get.Recv)
			assert.Equal(t, []string{"127.0.0.2"}, addrs(u), "the endpoint added while the connection was broken arrives")
			assert.Contains(t, pathPrefixes(recv(t, "policy after the reconnection", s.policy.Recv)), "/writers")
			if compact {
				assert.Eventually(t, func() bool { return r.logs.Count("compacted") > 0 }, timeout, 10*time.Millisecond, r.logs.String())
			}
		})
	}
}

// A replica that starts while a key is bad refuses to start, naming the
// key and the field, as the file watcher does with a bad file; one that
// cannot reach etcd gives up after WithStartTimeout, saying so; keys
// outside the folders it reads are ignored.
func TestWatchFirstLoad(t *testing.T) {
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	put(t, admin, prefix+"/registrations/some/future/kind", "not YAML: [")
	put(t, admin, etcdstore.ManifestKey(prefix, "authors"), strings.Replace(authorsYAML("/a"), "PathPrefix", "Glob", 1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait, err := etcdstore.Watch(ctx, controlplane.NewStore(), newClient(t, m.Endpoint), prefix)
	require.Error(t, err)
	wait() // no goroutine: returns at once
	assert.Contains(t, err.Error(), prefix+"/manifests/authors: document 2 (HTTPRoute default/authors): spec.rules[0].matches[0].path.type")
	put(t, admin, etcdstore.ManifestKey(prefix, "authors"), authorsYAML("/a"))
	wait, err = etcdstore.Watch(ctx, controlplane.NewStore(), newClient(t, m.Endpoint), prefix)
	require.NoError(t, err)
	defer func() { cancel(); wait() }()

	// A port that is held but never answers.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	start := time.Now()
	_, err = etcdstore.Watch(ctx, controlplane.NewStore(), newClient(t, "http://"+lis.Addr().String()), prefix, etcdstore.WithStartTimeout(time.Second))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "etcd: reading "+prefix+"/")
	assert.Less(t, time.Since(start), timeout)
}

// What a replica logs as keys go bad and are fixed, with the default log
// interval (a line of a kind at most every 10 s): a refusal, then the fix
// confirmed however soon it comes; a key still refused is never reported
// as loaded because another key changed; a barrier key (refused, logged
// after the change before it) orders each step.
func TestFixConfirmedInTheLog(t *testing.T) {
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	key := etcdstore.ManifestKey(prefix, "authors")
	eps := etcdstore.EndpointsKey(prefix, "authors")
	put(t, admin, key, authorsYAML("/authors"))
	put(t, admin, eps, endpointsYAML("127.0.0.1:4143"))
	var logs testutil.LogLines
	ctx, cancel := context.WithCancel(context.Background())
	wait, err := etcdstore.Watch(ctx, controlplane.NewStore(), newClient(t, m.Endpoint), prefix, etcdstore.WithLogger(logs.Logger()))
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); wait() })
	barriers := 0
	barrier := func() {
		t.Helper()
		barriers++
		b := etcdstore.EndpointsKey(prefix, fmt.Sprint("barrier-", barriers))
		put(t, admin, b, "- authority: x.default.svc.cluster.local:1\n  endpoints:\n  - addr: 1.2.\n")
		require.Eventually(t, func() bool { return logs.Count("rejected a control-plane key", b) > 0 }, timeout, time.Millisecond, "%s", logs.String())
		_, err := admin.Delete(context.Background(), b)
		require.NoError(t, err)
	}
	loaded := func() int { return logs.Count("loaded the control-plane keys") }

	put(t, admin, key, strings.Replace(authorsYAML("/b"), "PathPrefix", "Glob", 1))
	require.Eventually(t, func() bool { return logs.Count("rejected a control-plane key", key) == 1 }, timeout, time.Millisecond)
	// Another key changes while the manifest is still refused.
	put(t, admin, eps, endpointsYAML("127.0.0.2:4143"))
	barrier()
	require.Zero(t, loaded(), "a refused manifest reported as loaded:\n%s", logs.String())

	put(t, admin, key, authorsYAML("/c")) // the fix
	require.Eventually(t, func() bool { return loaded() >= 1 }, timeout, time.Millisecond, "the fix is confirmed:\n%s", logs.String())

	// Manifests that load with a problem (an annotation Linkerd does not
	// read), within the log interval of that line, then their fix: the fix
	// is confirmed too, so the last line tells what is served.
	before := loaded()
	put(t, admin, key, strings.Replace(authorsYAML("/d"), "metadata: {name: authors, namespace: default}\nspec:\n  ports",
		"metadata: {name: authors, namespace: default, annotations: {retry.linkerd.io/limt: \"3\"}}\nspec:\n  ports", 1))
	require.Eventually(t, func() bool { return logs.Count("cannot work as written", "retry.linkerd.io/limt") == 1 }, timeout, time.Millisecond, "%s", logs.String())
	put(t, admin, key, authorsYAML("/e"))
	require.Eventually(t, func() bool { return loaded() > before }, timeout, time.Millisecond, "the fix of a problem is confirmed:\n%s", logs.String())
}

// startCP starts a control-plane replica process over the etcd endpoints,
// killed when the test ends.
func startCP(t *testing.T, endpoints []string, opts ...cpreplica.Option) *cpreplica.Replica {
	t.Helper()
	r, err := cpreplica.Start(endpoints, prefix, quiet, opts...)
	require.NoError(t, err)
	t.Cleanup(r.Kill)
	return r
}

// watchThrough watches authority's endpoints through a client of the
// replicas, once it has seen want: the addresses it has now, each time
// it is called.
func watchThrough(t *testing.T, want []string, replicas ...*cpreplica.Replica) func() []string {
	t.Helper()
	var addrs []string
	for _, r := range replicas {
		addrs = append(addrs, r.Addr)
	}
	client, err := destination.Dial(strings.Join(addrs, ","), destination.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	got := watchAddrs(t, client, authority)
	require.Eventually(t, func() bool { return slices.Equal(got(), want) }, timeout, 10*time.Millisecond)
	return got
}
