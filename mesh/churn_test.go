package mesh

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client whose table is full keeps sending to new Services, a few at a
// time, against a real control plane, with the destination client's bound
// equal to the stack's authority bound (as their defaults are). The router
// and the balancer each replace names in tables of their own, at slightly
// different moments, and both watch a name's profile; the client's
// headroom above the bound absorbs the names being replaced, so no watch
// is refused and every request is answered by the app. Without the
// headroom, about one new name in sixteen had its profile watch refused
// (and routed without its profile until the retry), and a few requests got
// a 503 for a refused endpoint watch.
func TestChurnPastAFullTableRefusesNoWatch(t *testing.T) {
	const (
		bound   = 64
		names   = 16 * bound
		workers = 4 // new names in flight at once: the headroom (bound/16) covers this many, no more
	)
	cp := startControlPlane(t)
	var served atomic.Int64
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	appAddr := netip.MustParseAddrPort(strings.TrimPrefix(app.URL, "http://"))
	sets := make(map[string][]endpoint.Endpoint, names)
	for i := range names {
		sets[churnName(i)] = []endpoint.Endpoint{{Addr: appAddr}}
	}
	cp.store.SetEndpoints(sets)

	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet), destination.WithMaxWatches(bound))
	require.NoError(t, err)
	defer dst.Close()
	cl := NewClient(WithDestination(dst), WithLogger(quiet), WithMaxAuthorities(bound))
	defer cl.Close()

	var next atomic.Int64
	var failed sync.Map // name -> status or error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= names {
					return
				}
				req, _ := http.NewRequest("GET", "http://"+churnName(i)+"/", nil)
				resp, err := cl.RoundTrip(req)
				if err != nil {
					failed.Store(churnName(i), err.Error())
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Store(churnName(i), fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("l5d-proxy-error")))
				}
			}
		}()
	}
	wg.Wait()
	var failures []string
	failed.Range(func(k, v any) bool {
		failures = append(failures, fmt.Sprint(k, ": ", v))
		return len(failures) < 5
	})
	assert.Empty(t, failures, "requests not answered by the app")
	assert.Equal(t, int64(names), served.Load())
	s := dst.Stats()
	assert.Zero(t, s.RejectedWatches, "watches refused: %+v", s)
	assert.LessOrEqual(t, s.ProfileWatches, bound+bound/16, "%+v", s)
}

func churnName(i int) string { return fmt.Sprintf("svc-%d.churn.svc.cluster.local:80", i) }
