package etcd_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A live workload registered through "A,B" (examples/destination replicas
// over one etcd, with the default -registration-ttl) whose replica A
// freezes (SIGSTOP: its connections stay open, nothing answers, its
// lease keep-alives stop). The workload is alive and reachable all along:
// its registration must reach B before A's lease expires, two thirds of
// the TTL after the freeze at the earliest, so that it never leaves the
// answers. It did not: with a 5 s TTL the lease expired long before the
// registration's connection, which pings after 10 s of silence and waits
// 5 s more, left A; the workload was out of every answer for about 10 s.
func TestLiveRegistrationMovesOffAFrozenReplica(t *testing.T) {
	bin := buildExamples(t)
	m := etcdtest.Start(t)
	cli := newClient(t, m.Endpoint)
	put(t, cli, etcdstore.ManifestKey(prefix, "books"), regManifests)
	a := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint, "-insecure-registration")
	b := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint, "-insecure-registration")
	addrA, addrB := a.waitLog(t, dstAddrRe), b.waitLog(t, dstAddrRe)
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })

	reg := registerBooks(t, addrA+","+addrB)
	onB := followBooks(t, addrB)
	require.Eventually(t, func() bool { return onB.size() == 1 }, timeout, 10*time.Millisecond, "replica B does not serve the registration")
	leases := registrationLeases(t, cli, "127.0.0.9:7000")
	require.Len(t, leases, 1)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	frozen := time.Now()
	ttl := etcdstore.DefaultRegistrationTTL
	took := movedFrom(t, cli, "127.0.0.9:7000", leases[0], frozen, frozen.Add(ttl*2/3), reg)
	t.Logf("registered through replica B %v after A froze", took.Round(time.Millisecond))
	assert.Equal(t, 1, onB.size())
	if gone := onB.wentEmpty(); !gone.IsZero() {
		t.Errorf("the live workload left replica B's answers %v after A froze", gone.Sub(frozen).Round(time.Millisecond))
	}
}
