package router

import (
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A hedge of a request to an address whose ServiceProfile splits its
// traffic draws its backend as a retry does (see
// TestRetryOfASplitRequestDrawsItsBackendAgain in package mesh): the
// split's two backends, one endpoint each, both stall every first attempt,
// so only a hedge answers, and the hedge of a request can only reach the
// other backend's endpoint (the balancer sends it to no endpoint the
// request tried). Drawn anew, about half of the hedges reach the other
// backend; drawn once with the request, none would.
func TestProfileHedgeDrawsItsSplitBackend(t *testing.T) {
	const (
		ip       = "127.0.0.9:80"
		requests = 20
	)
	h := newHedgeEndpoints(t, 2, 2*time.Second)
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		"shelf-a.test:80": {h.eps[0]}, "shelf-b.test:80": {h.eps[1]},
	})
	require.NoError(t, err)
	bal := balancer.New(src)
	t.Cleanup(bal.Close)
	budget := profiles.DefaultRetryBudget()
	p := &profiles.Profile{FullyQualifiedName: "shelf.test", RetryBudget: &budget,
		Routes: []profiles.Route{{Condition: profiles.PathRegex("/.*"), Labels: map[string]string{"route": "all"},
			Hedge: &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 1}}},
		DstOverrides: []endpoint.WeightedDst{{Authority: "shelf-a.test:80", Weight: 50}, {Authority: "shelf-b.test:80", Weight: 50}},
	}
	r := New(WithProfiles(profiles.NewStaticSource(map[string]*profiles.Profile{ip: p})), WithBalancer(bal), WithLogger(quietLogger))
	t.Cleanup(r.Close)
	client := &http.Client{Transport: r.Transport(hedgeMarker{base: bal.Transport(testutil.NewTransport(t, testutil.H1))}), Timeout: testutil.Timeout}
	probe, _ := http.NewRequest("GET", "http://"+ip+"/", nil)
	require.Eventually(t, func() bool { return r.Explain(probe).Model == ModelProfile }, testutil.Timeout, 5*time.Millisecond)

	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			req, err := http.NewRequest("GET", "http://"+ip+"/", nil)
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("X-Request-Id", strconv.Itoa(i))
			req.Header.Set("X-Stall", "1")
			resp, err := client.Do(req)
			if assert.NoError(t, err) {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	crossed := 0
	for i := range requests {
		if len(h.reached(strconv.Itoa(i))) == 2 {
			crossed++
		}
	}
	// Each hedge reaches the other backend with a chance of one half:
	// none of 20 do with a chance of 1e-6.
	assert.Positive(t, crossed, "requests whose hedge reached the other backend, of %d", requests)
}
