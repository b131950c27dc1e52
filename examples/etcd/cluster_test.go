package etcd_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The loss of a machine of the fleet under traffic: a three-member etcd
// cluster, replica A on the member that leads it (its only etcd
// endpoint), replica B on all three, and two examples/proxy callers, one
// using A first and one B first. Replica A (SIGKILL) and its member (cut
// off and stopped without handing its leadership over) die together while
// requests flow: none fails at either caller, and an endpoint applied
// after the kills (once etcd has a new leader) reaches both callers
// through replica B.
func TestFleetSurvivesAReplicaAndAnEtcdMember(t *testing.T) {
	needCurl(t)
	bin := buildExamples(t)
	c := etcdtest.StartCluster(t, 3)
	all := strings.Join(c.Endpoints(), ",")
	one, two := newApp(t, "one"), newApp(t, "two")
	applyBooks(t, bin, all, one)

	var lead int
	require.Eventually(t, func() bool { lead = c.Leader(); return lead >= 0 }, timeout, 10*time.Millisecond, "no etcd leader")
	replicaA := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", c.Members[lead].Endpoint)
	replicaB := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", all)
	addrA, addrB := replicaA.waitLog(t, dstAddrRe), replicaB.waitLog(t, dstAddrRe)

	var callers []*traffic
	for _, dst := range []string{addrA + "," + addrB, addrB + "," + addrA} {
		proxy := startProc(t, filepath.Join(bin, "proxy"), "-destination", dst,
			"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", one, "-metrics", "127.0.0.1:0")
		out, metrics := proxy.waitLog(t, listenRe("outbound")), proxy.waitLog(t, listenRe("metrics"))
		waitReady(t, metrics)
		// The first request, on a fresh process.
		require.Equal(t, "one", curlBooks(t, out))
		callers = append(callers, startTraffic(t, out, "books.default.svc.cluster.local:7000", 2))
	}
	for _, tr := range callers {
		tr.flows(t, 20, "traffic before the kills")
	}

	c.Kill(lead)
	require.NoError(t, replicaA.cmd.Process.Signal(syscall.SIGKILL))
	_ = replicaA.cmd.Wait()
	for _, tr := range callers {
		tr.flows(t, 20, "traffic after the kills")
	}
	require.Eventually(t, func() bool { l := c.Leader(); return l >= 0 && l != lead }, timeout, 10*time.Millisecond, "etcd elects no new leader")

	start := time.Now()
	applyBooks(t, bin, all, one, two)
	for i, tr := range callers {
		require.Eventually(t, func() bool { return tr.saw("two") }, timeout, 5*time.Millisecond,
			"the endpoint applied after the kills never reached caller %d", i)
	}
	t.Logf("the endpoint applied after the kills reached both callers in %v", time.Since(start).Round(time.Millisecond))
	for i, tr := range callers {
		tr.end()
		assert.Zero(t, tr.failed.Load(), "caller %d: requests failed out of %d", i, tr.sent.Load())
		t.Logf("caller %d: %d requests through the kills, %d failed", i, tr.sent.Load(), tr.failed.Load())
	}
}

// A replica started while a member of the three is down (the first of its
// -etcd-endpoints) loads the keys from the live ones and serves: the first
// request through a proxy on it is answered, and a change applied while
// the member is still down reaches the proxy.
func TestReplicaStartsWithAnEtcdMemberDown(t *testing.T) {
	needCurl(t)
	bin := buildExamples(t)
	c := etcdtest.StartCluster(t, 3)
	all := strings.Join(c.Endpoints(), ",")
	one, two := newApp(t, "one"), newApp(t, "two")
	applyBooks(t, bin, all, one)
	c.Kill(0)

	replica := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", all)
	addr := replica.waitLog(t, dstAddrRe)
	proxy := startProc(t, filepath.Join(bin, "proxy"), "-destination", addr,
		"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", one, "-metrics", "127.0.0.1:0")
	out, metrics := proxy.waitLog(t, listenRe("outbound")), proxy.waitLog(t, listenRe("metrics"))
	waitReady(t, metrics)
	require.Equal(t, "one", curlBooks(t, out), "the first request on a fresh proxy")

	applyBooks(t, bin, all, two)
	require.Eventually(t, func() bool { return curlBooks(t, out) == "two" }, timeout, 20*time.Millisecond,
		"the change applied with a member down never reached the proxy")
}
