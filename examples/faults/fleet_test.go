package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/cpreplica"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/manifest"
	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/zap"
)

// fleetCaller is an outbound stack whose destination client lists two
// control-plane replicas, and the answers its requests got, by body.
type fleetCaller struct {
	hc           *http.Client
	sent, failed atomic.Int64
	mu           sync.Mutex
	bodies       map[string]int64
	samples      []string
}

func newFleetCaller(t *testing.T, replicas string) *fleetCaller {
	t.Helper()
	dst, err := destination.Dial(replicas, destination.WithLogger(quiet),
		destination.WithBackoff(backoff.Policy{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond}))
	require.NoError(t, err)
	c := inmesh.NewClient(inmesh.WithDestination(dst), inmesh.WithLogger(quiet), inmesh.WithMeterProvider(noop.NewMeterProvider()),
		inmesh.WithBalancerOptions(balancer.WithFallback(false)))
	t.Cleanup(func() {
		c.Close()
		dst.Close()
	})
	return &fleetCaller{hc: &http.Client{Transport: c, Timeout: 10 * time.Second}, bodies: map[string]int64{}}
}

// get sends one request to books and records its outcome.
func (c *fleetCaller) get() {
	c.sent.Add(1)
	req, _ := http.NewRequest("GET", "http://"+books+"/books/1", nil)
	resp, err := c.hc.Do(req)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		if err == nil {
			c.mu.Lock()
			c.bodies[string(b)]++
			c.mu.Unlock()
			return
		}
	}
	c.failed.Add(1)
	c.mu.Lock()
	if len(c.samples) < 10 {
		c.samples = append(c.samples, err.Error())
	}
	c.mu.Unlock()
}

func (c *fleetCaller) saw(body string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bodies[body] > 0
}

// The loss of a machine of a replicated control plane under load: a
// three-member etcd cluster in this process, replica A reading only the
// member that leads it, replica B all three, and two outbound stacks whose
// destination clients list both replicas (one A first, one B first),
// sending paced requests to books. Replica A and its etcd member die
// together (a crash: connections cut, no leadership handed over) a third
// of the way through. Every request of both callers is answered 200 (0
// failed), and an endpoint applied after the kills, once etcd has a new
// leader, reaches both callers through replica B. The examples/etcd test
// TestFleetSurvivesAReplicaAndAnEtcdMember does this once with processes
// and a few requests; this one is paced load, bigger with INMESH_FULL=1.
func TestFleetLosesAReplicaAndAnEtcdMemberUnderLoad(t *testing.T) {
	cluster := etcdtest.StartCluster(t, 3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	app := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	one, two := app("one"), app("two")
	const prefix = "/faults"
	apply := func(addrs ...string) {
		yaml := "- authority: " + books + "\n  endpoints:\n"
		for _, a := range addrs {
			yaml += "  - addr: " + a + "\n"
		}
		change := etcdstore.Change{Endpoints: []manifest.File{{Name: "books.yaml", Data: []byte(yaml)}}}
		// A write may fail while etcd elects a leader: an operator tries
		// again.
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := etcdstore.Apply(ctx, cli, prefix, change)
			return err == nil
		}, timeout, 50*time.Millisecond, "apply %v", addrs)
	}
	apply(one)

	var lead int
	require.Eventually(t, func() bool { lead = cluster.Leader(); return lead >= 0 }, timeout, 10*time.Millisecond, "no etcd leader")
	replicaA, err := cpreplica.Start([]string{cluster.Members[lead].Endpoint}, prefix, quiet)
	require.NoError(t, err)
	t.Cleanup(replicaA.Kill)
	replicaB, err := cpreplica.Start(cluster.Endpoints(), prefix, quiet)
	require.NoError(t, err)
	t.Cleanup(replicaB.Kill)

	callers := []*fleetCaller{
		newFleetCaller(t, replicaA.Addr+","+replicaB.Addr),
		newFleetCaller(t, replicaB.Addr+","+replicaA.Addr),
	}
	for i, c := range callers {
		// The first request on a fresh stack waits for discovery: it is
		// answered, and counted.
		c.get()
		require.Zero(t, c.failed.Load(), "caller %d's first request: %v", i, c.samples)
	}

	total, rate := size(20000, 1500), size(1000, 500) // each caller's requests, and per second
	span := time.Duration(total) * time.Second / time.Duration(rate)
	var wg sync.WaitGroup
	for _, c := range callers {
		tokens := make(chan struct{}, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range tokens {
					c.get()
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(tokens)
			start := time.Now()
			for i := range total {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
				tokens <- struct{}{}
			}
		}()
	}

	time.Sleep(span / 3) // the fault comes a third of the way through
	killed := time.Now()
	cluster.Kill(lead)
	replicaA.Kill()
	require.Eventually(t, func() bool { l := cluster.Leader(); return l >= 0 && l != lead }, timeout, 10*time.Millisecond, "etcd elects no new leader")
	elected := time.Since(killed)
	apply(one, two)
	applied := time.Now()
	for i, c := range callers {
		require.Eventually(t, func() bool { return c.saw("two") }, timeout, 5*time.Millisecond,
			"the endpoint applied after the kills never reached caller %d", i)
	}
	t.Logf("new etcd leader %v after the kills; the endpoint applied then reached both callers in %v",
		elected.Round(time.Millisecond), time.Since(applied).Round(time.Millisecond))
	wg.Wait()
	for i, c := range callers {
		t.Logf("caller %d: %d requests (%d over %v paced, the kills a third in), %d failed, answers %v",
			i, c.sent.Load(), total, span, c.failed.Load(), c.bodies)
		assert.Equal(t, int64(total+1), c.sent.Load())
		assert.Zero(t, c.failed.Load(), "caller %d: failed requests, e.g. %v", i, c.samples)
	}
}
