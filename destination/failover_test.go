package destination_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// replica is one control-plane replica: every API of a controlplane.Server
// on a gRPC server over a port the test holds, which stays held (and
// refuses gRPC) once the replica is stopped.
type replica struct {
	addr string
	srv  *grpc.Server
	done chan struct{}
}

func startReplica(t *testing.T, store *controlplane.Store) *replica {
	t.Helper()
	h := holdListener(t)
	lis := h.generation()
	r := &replica{addr: h.addr(), srv: grpc.NewServer(), done: make(chan struct{})}
	controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(r.srv)
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(lis)
	}()
	t.Cleanup(r.stop)
	return r
}

// stop kills the replica: its streams are cut and no new one is accepted.
func (r *replica) stop() {
	r.srv.Stop()
	<-r.done
}

// A client given two replicas ("a,b") moves to the second when the first
// dies while a watch is open and requests flow: the watch keeps its last
// state (no update without endpoints, no error), a change written after
// the kill arrives through the live replica, and no request fails.
func TestClientFailsOverToAnotherReplica(t *testing.T) {
	_, a := backend(t, "a")
	_, b := backend(t, "b")
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{a})
	first, second := startReplica(t, store), startReplica(t, store)

	c := newTestClient(t, first.addr+","+second.addr)
	rec := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	_, client := balancedClient(t, c, balancer.WithFallback(false))

	// The first request on the fresh client, then traffic all along.
	status, body, _ := fetch(t, client, "http://"+books+":7000/")
	require.Equal(t, 200, status)
	require.Equal(t, "a HTTP/1.1 "+books+":7000", body)
	var sent, failed atomic.Int64
	var sawB atomic.Bool
	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for trafficCtx.Err() == nil {
			sent.Add(1)
			resp, err := client.Get("http://" + books + ":7000/")
			if err != nil {
				failed.Add(1)
				t.Logf("request failed: %v", err)
				continue
			}
			var buf [64]byte
			n, _ := resp.Body.Read(buf[:])
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
				t.Logf("request answered %d: %s", resp.StatusCode, buf[:n])
				continue
			}
			if string(buf[:1]) == "b" {
				sawB.Store(true)
			}
		}
	}()
	defer func() {
		stopTraffic()
		wg.Wait()
	}()

	// The replica in use (the first of the list) dies.
	first.stop()
	require.Eventually(t, func() bool { return sent.Load() > 20 }, defaultTestTimeout, time.Millisecond,
		"traffic after the kill")

	// A change written after the kill reaches the watch and the requests:
	// only the second replica can have carried it.
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{b})
	require.Eventually(t, func() bool {
		got := rec.all()
		last := got[len(got)-1]
		return last.Set != nil && len(last.Set.Endpoints) == 1 && last.Set.Endpoints[0].Addr == b.Addr
	}, defaultTestTimeout, 5*time.Millisecond, "the change after the kill never arrived: %v", rec.all())
	require.Eventually(t, sawB.Load, defaultTestTimeout, 5*time.Millisecond, "no request reached b")
	stopTraffic()
	wg.Wait()

	for i, u := range rec.all() {
		assert.NoError(t, u.Err, "update %d", i)
		if assert.NotNil(t, u.Set, "update %d", i) {
			assert.Len(t, u.Set.Endpoints, 1, "update %d: the last state was dropped", i)
		}
	}
	assert.Zero(t, failed.Load(), "requests failed out of %d", sent.Load())
	t.Logf("%d requests during the failover, %d failed", sent.Load(), failed.Load())
}

// A malformed list of replicas is refused by Dial, naming the address.
func TestDialRefusesBadReplicaList(t *testing.T) {
	for _, target := range []string{"127.0.0.1:1,", "127.0.0.1:1,127.0.0.1", "127.0.0.1:1, 127.0.0.1:1"} {
		c, err := destination.Dial(target)
		if !assert.Error(t, err, "%q", target) {
			c.Close()
		}
	}
}
