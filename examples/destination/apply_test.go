package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/internal/testutil"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// command runs a subcommand as a user would, returning its exit code,
// standard output and standard error.
func command(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runCommand(args[0], args[1:], &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// apply validates with the control plane's loader and writes a directory
// in one transaction; a bad document (a route regex the proxies would not
// compile among them) is refused with its file, document and field, and
// nothing is written; get lists the keys; delete removes them.
func TestApplyWritesAllOrNothing(t *testing.T) {
	m := etcdtest.Start(t)
	etcd := []string{"-etcd-endpoints", m.Endpoint, "-etcd-prefix", "/mesh"}

	code, out, errOut := command(t, append([]string{"apply", "-f", "policies", "-f", "../mesh/books.yaml", "-endpoints", "endpoints.yaml"}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "manifests/Service/default/authors created")
	assert.Contains(t, out, "manifests/HTTPRoute/default/authors-routes created")
	assert.Contains(t, out, "manifests/ServiceProfile/books.default.svc.cluster.local created")
	assert.Contains(t, out, "endpoints/endpoints.yaml created")
	code, listed, errOut := command(t, append([]string{"get"}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"manifests/Service/default/authors ", "manifests/HTTPRoute/default/authors-routes ",
		"manifests/ServiceProfile/books.default.svc.cluster.local ", "endpoints/endpoints.yaml "} {
		assert.Contains(t, listed, want)
	}

	// A directory with a good file and a bad one: refused, nothing written.
	dir := t.TempDir()
	writeFile(t, dir, "good.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: writers}\nspec: {ports: [{port: 7002}]}\n")
	bad := writeFile(t, dir, "routes.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: other}\n---\n"+
		"apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - matches:\n    - path: {type: Glob, value: /x}\n")
	code, _, errOut = command(t, append([]string{"apply", "-f", dir}, etcd...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, bad+": document 2 (HTTPRoute default/r): spec.rules[0].matches[0].path.type")
	assert.Contains(t, errOut, "nothing written")
	// A route regex the proxies would not compile: refused with its field.
	badRegex := writeFile(t, t.TempDir(), "regex.yaml", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n"+
		"  - matches:\n    - headers: [{type: RegularExpression, name: x-user, value: \"(admin\"}]\n")
	code, _, errOut = command(t, append([]string{"apply", "-f", badRegex}, etcd...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, badRegex+": document 1 (HTTPRoute default/r): spec.rules[0].matches[0].headers[0].value: bad regular expression: error parsing regexp: missing closing ): `(admin`")
	assert.Contains(t, errOut, "nothing written")
	// A resource defined twice in what is applied: refused, naming both files.
	dup := writeFile(t, dir, "dup.yml", "apiVersion: v1\nkind: Service\nmetadata: {name: authors}\nspec: {ports: [{port: 7001}]}\n")
	code, _, errOut = command(t, append([]string{"apply", "-f", dup, "-f", "policies/authors.yaml"}, etcd...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "policies/authors.yaml: Service default/authors is also defined in "+dup)
	// Bad endpoints: refused with the file and the field.
	badEps := writeFile(t, dir, "more-endpoints.yaml", "- authority: writers.default.svc.cluster.local:7002\n  endpoints:\n  - addr: 127.0.\n")
	code, _, errOut = command(t, append([]string{"apply", "-endpoints", badEps}, etcd...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, badEps+": [0].endpoints[0].addr")
	code, after, _ := command(t, append([]string{"get"}, etcd...)...)
	require.Equal(t, 0, code)
	assert.Equal(t, listed, after, "the refused applies wrote nothing")

	// A resource already held by a key written by hand (a whole file):
	// refused, naming that key.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Endpoint}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, "/mesh/manifests/by-hand.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: writers}\nspec: {ports: [{port: 7002}]}\n")
	require.NoError(t, err)
	code, _, errOut = command(t, append([]string{"apply", "-f", filepath.Join(dir, "good.yaml")}, etcd...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "/mesh/manifests/by-hand.yaml: Service default/writers is also defined in "+filepath.Join(dir, "good.yaml"))
	code, _, errOut = command(t, append(append([]string{"delete"}, etcd...), "manifests/by-hand.yaml")...)
	require.Equal(t, 0, code, errOut)

	// A resource applied again is unchanged.
	code, out, errOut = command(t, append([]string{"apply", "-f", "policies"}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "manifests/Service/default/authors unchanged")

	// delete: an unknown name deletes nothing; a file's resources, or a
	// name as get lists it, are gone.
	books := "manifests/ServiceProfile/books.default.svc.cluster.local"
	code, _, errOut = command(t, append(append([]string{"delete"}, etcd...), books, "manifests/Service/default/nope")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no such key: /mesh/manifests/Service/default/nope")
	code, _, errOut = command(t, append(append([]string{"delete"}, etcd...), books)...)
	require.Equal(t, 0, code, errOut)
	_, after, _ = command(t, append([]string{"get"}, etcd...)...)
	assert.NotContains(t, after, books)
	assert.Contains(t, after, "manifests/Service/default/authors ")
	code, _, errOut = command(t, append([]string{"delete", "-f", "policies"}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	_, after, _ = command(t, append([]string{"get"}, etcd...)...)
	assert.NotContains(t, after, "manifests/")
}

// modRevisions returns the mod revision of every key under prefix, by key.
func modRevisions(t *testing.T, cli *clientv3.Client, prefix string) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix())
	require.NoError(t, err)
	out := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// apply of what etcd already holds says "unchanged" for each key and
// writes nothing, as kubectl apply: the keys keep their mod revisions, so
// no replica sees an event. A file with one document edited rewrites
// that document's key alone ("configured"), and a new document is
// "created".
func TestApplyWritesOnlyWhatChanged(t *testing.T) {
	m := etcdtest.Start(t)
	etcd := []string{"-etcd-endpoints", m.Endpoint, "-etcd-prefix", "/mesh"}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Endpoint}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()

	dir := t.TempDir()
	const service = "apiVersion: v1\nkind: Service\nmetadata: {name: authors}\nspec: {ports: [{port: 7001}]}\n"
	const route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: authors-routes}\n" +
		"spec:\n  parentRefs: [{group: core, kind: Service, name: authors, port: 7001}]\n" +
		"  rules:\n  - matches: [{path: {type: PathPrefix, value: /authors}}]\n"
	file := writeFile(t, dir, "authors.yaml", service+"---\n"+route)
	eps := writeFile(t, dir, "endpoints.yaml", "- authority: authors.default.svc.cluster.local:7001\n  endpoints:\n  - addr: 127.0.0.1:7001\n")
	const svcKey, routeKey, epsKey = "/mesh/manifests/Service/default/authors", "/mesh/manifests/HTTPRoute/default/authors-routes", "/mesh/endpoints/endpoints.yaml"

	code, out, errOut := command(t, append([]string{"apply", "-f", file, "-endpoints", eps}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "manifests/Service/default/authors created\nmanifests/HTTPRoute/default/authors-routes created\nendpoints/endpoints.yaml created\n", firstLines(out, 3))
	first := modRevisions(t, cli, "/mesh")
	require.Contains(t, first, svcKey)
	require.Contains(t, first, routeKey)
	require.Contains(t, first, epsKey)

	// The same files again: nothing written.
	code, out, errOut = command(t, append([]string{"apply", "-f", file, "-endpoints", eps}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "manifests/Service/default/authors unchanged\nmanifests/HTTPRoute/default/authors-routes unchanged\nendpoints/endpoints.yaml unchanged\n", firstLines(out, 3))
	assert.Contains(t, out, "(nothing written)")
	assert.Equal(t, first, modRevisions(t, cli, "/mesh"), "an unchanged apply rewrote keys")

	// One document of the file edited, and a new one: the edited key is
	// rewritten, the new one created, the others untouched.
	writeFile(t, dir, "authors.yaml", strings.Replace(service, "port: 7001", "port: 7002", 1)+"---\n"+route+
		"---\napiVersion: v1\nkind: Service\nmetadata: {name: writers}\nspec: {ports: [{port: 7003}]}\n")
	code, out, errOut = command(t, append([]string{"apply", "-f", file, "-endpoints", eps}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "manifests/Service/default/authors configured\nmanifests/HTTPRoute/default/authors-routes unchanged\n"+
		"manifests/Service/default/writers created\nendpoints/endpoints.yaml unchanged\n", firstLines(out, 4))
	assert.NotContains(t, out, "nothing written")
	second := modRevisions(t, cli, "/mesh")
	assert.Greater(t, second[svcKey], first[svcKey], "the edited document's key was not rewritten")
	assert.Equal(t, first[routeKey], second[routeKey], "an unchanged document's key was rewritten")
	assert.Equal(t, first[epsKey], second[epsKey], "an unchanged endpoints file was rewritten")
	assert.Equal(t, second[svcKey], second["/mesh/manifests/Service/default/writers"], "one transaction")
}

// firstLines returns the first n lines of s, each with its newline.
func firstLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "")
}

// The control plane started with -etcd-endpoints serves what apply wrote,
// and a later apply reaches its open streams.
func TestServeFromEtcd(t *testing.T) {
	m := etcdtest.Start(t)
	etcd := []string{"-etcd-endpoints", m.Endpoint}
	code, _, errOut := command(t, append([]string{"apply", "-f", "policies", "-endpoints", "endpoints.yaml"}, etcd...)...)
	require.Equal(t, 0, code, errOut)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := controlplane.NewStore()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := etcdFlags{endpoints: []string{m.Endpoint}, prefix: "/inmesh"}
	cli, err := f.client()
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dst := controlplane.NewServer(store, controlplane.WithLogger(log))
	wait, err := watchEtcd(ctx, store, cli, f, dst, lis.Addr(), log)
	require.NoError(t, err)
	defer func() { cancel(); wait() }()
	srv := grpc.NewServer()
	dst.Register(srv)
	go srv.Serve(dst.Listener(lis))
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	st, err := pb.NewDestinationClient(cc).Get(ctx, &pb.GetDestination{Path: "authors.default.svc.cluster.local:7001"})
	require.NoError(t, err)
	first, err := st.Recv()
	require.NoError(t, err)
	require.Len(t, first.GetAdd().GetAddrs(), 1)
	assert.Equal(t, "authors-0", first.GetAdd().GetAddrs()[0].GetMetricLabels()["pod"])

	// The HTTPRoute, kept under its own key, is served.
	pol, err := outboundpb.NewOutboundPoliciesClient(cc).Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "pod:default:caller",
		Target: &outboundpb.TrafficSpec_Authority{Authority: "authors.default.svc.cluster.local:7001"}})
	require.NoError(t, err)
	var routes []string
	for _, r := range pol.GetProtocol().GetDetect().GetHttp1().GetRoutes() {
		routes = append(routes, r.GetMetadata().GetResource().GetName())
	}
	assert.Contains(t, routes, "authors-routes")

	eps := writeFile(t, t.TempDir(), "endpoints.yaml", strings.Replace(mustRead(t, "endpoints.yaml"), "pod: authors-0", "pod: authors-1", 1))
	code, _, errOut = command(t, append([]string{"apply", "-endpoints", eps}, etcd...)...)
	require.Equal(t, 0, code, errOut)
	got := make(chan *pb.Update, 1)
	go func() {
		if u, err := st.Recv(); err == nil {
			got <- u
		}
	}()
	select {
	case u := <-got:
		require.Len(t, u.GetAdd().GetAddrs(), 1)
		assert.Equal(t, "authors-1", u.GetAdd().GetAddrs()[0].GetMetricLabels()["pod"])
	case <-time.After(30 * time.Second):
		t.Fatal("the applied change did not reach the stream within 30s")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// With -etcd-cacert, -etcd-cert and -etcd-key the commands and the control
// plane reach an etcd that serves TLS and requires client certificates;
// without the client certificate etcd refuses them.
func TestEtcdOverTLS(t *testing.T) {
	m := etcdtest.StartTLS(t)
	tlsFlags := []string{"-etcd-endpoints", m.Endpoint, "-etcd-cacert", m.CAFile, "-etcd-cert", m.CertFile, "-etcd-key", m.KeyFile}
	code, _, errOut := command(t, append([]string{"apply", "-f", "policies", "-endpoints", "endpoints.yaml"}, tlsFlags...)...)
	require.Equal(t, 0, code, errOut)
	code, listed, errOut := command(t, append([]string{"get"}, tlsFlags...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, listed, "manifests/Service/default/authors ")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := controlplane.NewStore()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ef := etcdFlags{endpoints: []string{m.Endpoint}, prefix: "/inmesh", caFile: m.CAFile, certFile: m.CertFile, keyFile: m.KeyFile}
	watchCli, err := ef.client()
	require.NoError(t, err)
	wait, err := watchEtcd(ctx, store, watchCli, ef, controlplane.NewServer(store, controlplane.WithLogger(log)), &net.TCPAddr{}, log)
	require.NoError(t, err)
	defer func() { cancel(); wait() }()

	// No client certificate: refused within the bound.
	ef.certFile, ef.keyFile = "", ""
	cli, err := ef.client()
	require.NoError(t, err)
	defer cli.Close()
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	_, err = cli.Get(short, "/inmesh/", clientv3.WithPrefix())
	assert.Error(t, err)
	// Half a key pair is a flag error.
	ef.certFile = m.CertFile
	_, err = ef.client()
	assert.ErrorContains(t, err, "-etcd-cert and -etcd-key go together")
}

// Endpoints where no etcd answers: each command says so within its reach
// timeout, naming the endpoints, instead of waiting out the command's.
func TestCommandSaysEtcdDoesNotAnswer(t *testing.T) {
	addr := "http://" + testutil.RefusedAddr(t).String()
	for _, args := range [][]string{{"get"}, {"apply", "-f", "policies"}} {
		code, _, errOut := command(t, append([]string{args[0], "-etcd-endpoints", addr}, args[1:]...)...)
		assert.Equal(t, 1, code, "%v", args)
		assert.Contains(t, errOut, "etcd at "+addr+" did not answer within 5s", "%v", args)
	}
}
