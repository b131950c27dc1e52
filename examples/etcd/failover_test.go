package etcd_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// examples/proxy -destination a,b over two examples/destination replicas
// on one etcd: the replica the proxy uses is killed (SIGKILL) while
// requests flow through the proxy; none fails, and endpoints applied after
// the kill reach the proxy through the other replica.
func TestProxySurvivesAReplica(t *testing.T) {
	needCurl(t)
	bin := buildExamples(t)
	m := etcdtest.Start(t)
	one, two := newApp(t, "one"), newApp(t, "two")
	apply := func(addr string) { applyBooks(t, bin, m.Endpoint, addr) }
	apply(one)

	replicaA := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint)
	replicaB := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint)
	addrA, addrB := replicaA.waitLog(t, dstAddrRe), replicaB.waitLog(t, dstAddrRe)

	proxy := startProc(t, filepath.Join(bin, "proxy"), "-destination", addrA+","+addrB,
		"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", one, "-metrics", "127.0.0.1:0")
	out, metrics := proxy.waitLog(t, listenRe("outbound")), proxy.waitLog(t, listenRe("metrics"))
	waitReady(t, metrics)
	// The first request, on a fresh process.
	require.Equal(t, "one", curlBooks(t, out))

	tr := startTraffic(t, out, "books.default.svc.cluster.local:7000", 1)
	tr.flows(t, 20, "traffic before the kill")

	// The replica in use (the first of the list) dies.
	require.NoError(t, replicaA.cmd.Process.Signal(syscall.SIGKILL))
	_ = replicaA.cmd.Wait()
	tr.flows(t, 20, "traffic after the kill")

	start := time.Now()
	apply(two)
	require.Eventually(t, func() bool { return tr.saw("two") }, timeout, 5*time.Millisecond, "the endpoints applied after the kill never reached the proxy")
	t.Logf("change after the kill reached the proxy in %v", time.Since(start).Round(time.Millisecond))
	tr.end()
	assert.Zero(t, tr.failed.Load(), "requests failed out of %d", tr.sent.Load())
	t.Logf("%d requests through the kill, %d failed", tr.sent.Load(), tr.failed.Load())
}
