package balancer

import (
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamer starts an endpoint that answers /fail with 500 and /stream with
// a first chunk at once and the rest when release is closed.
func streamer(t *testing.T, release <-chan struct{}) Endpoint {
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "last\n")
	}))
}

// A request in flight keeps its authority: a stream that lasts across
// idle sweeps keeps the endpoints' state (the tripped endpoint stays
// tripped, the stream stays pending on its endpoint) and the endpoint
// watch; once it ends, the authority idles out as any other.
func TestStreamKeepsAuthorityAcrossIdleSweeps(t *testing.T) {
	release := make(chan struct{})
	var once bool
	t.Cleanup(func() {
		if !once {
			close(release)
		}
	})
	x, y := streamer(t, release), streamer(t, release)
	src := &countingSource{Source: staticSource(t, map[string][]Endpoint{svc: {x, y}})}
	b, client := newClient(t, src, WithIdleTimeout(time.Hour),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1,
			Backoff: Backoff{MinBackoff: time.Hour, JitterRatio: -1}}}))

	status, _, _ := fetch(t, client, svcURL+"fail")
	require.Equal(t, 500, status)
	tripped, ready := x, y
	if stateOf(b, svc, x).State != "tripped" {
		tripped, ready = y, x
	}
	require.Equal(t, "tripped", stateOf(b, svc, tripped).State)

	resp, err := client.Get(svcURL + "stream")
	require.NoError(t, err)
	defer resp.Body.Close()
	buf := make([]byte, len("first\n"))
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	require.EqualValues(t, 1, stateOf(b, svc, ready).Pending)

	// Idle sweeps by hand, two idle timeouts apart, while the stream runs.
	now := time.Now()
	for i := 1; i <= 3; i++ {
		b.table.reg.Sweep(now.Add(time.Duration(2*i) * time.Hour))
	}
	assert.Equal(t, 1, b.table.len(), "the authority is kept")
	assert.EqualValues(t, 1, src.open.Load(), "its watch stays open")
	st := stateOf(b, svc, tripped)
	assert.Equal(t, "tripped", st.State, "its failure accrual is kept")
	assert.Equal(t, time.Hour, st.Penalty)
	assert.EqualValues(t, 1, stateOf(b, svc, ready).Pending, "the stream is still counted on its endpoint")

	status, _, _ = fetch(t, client, svcURL+"fail")
	assert.Equal(t, 500, status)
	assert.EqualValues(t, 1, src.started.Load(), "no second watch")

	once = true
	close(release)
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "last\n", string(rest))
	assert.EqualValues(t, 0, stateOf(b, svc, ready).Pending)

	// Idle now: the next sweeps release it.
	b.table.reg.Sweep(now.Add(8 * time.Hour))
	b.table.reg.Sweep(now.Add(10 * time.Hour))
	assert.Equal(t, 0, b.table.len())
	assert.EqualValues(t, 0, src.open.Load())
}

// Constructors refuse what would only fail later, on a request: a nil
// Source or a Balancer not made by New panic at once with a message that
// names the mistake (programmer errors); an endpoint without an address
// is an error naming the field, and the last good set stays.
func TestConstructorsRejectBadInput(t *testing.T) {
	for name, src := range map[string]Source{
		"nil interface":    nil,
		"nil StaticSource": (*StaticSource)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			assert.PanicsWithValue(t, "balancer: New: nil Source", func() { New(src) })
		})
	}
	assert.PanicsWithValue(t, "balancer: Transport of a Balancer not made by New", func() { (*Balancer)(nil).Transport(nil) })
	assert.PanicsWithValue(t, "balancer: Transport of a Balancer not made by New", func() { new(Balancer).Transport(nil) })

	good := backend(t, "good")
	src, err := NewStaticSource(map[string][]Endpoint{svc: {good}})
	require.NoError(t, err)
	for name, eps := range map[string][]Endpoint{
		"zero address": {good, {}},
		"zero port":    {{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)}},
	} {
		t.Run(name, func(t *testing.T) {
			err := src.Set(svc, eps)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "Addr")
			assert.Contains(t, err.Error(), svc)
			_, err = NewStaticSource(map[string][]Endpoint{svc: eps})
			assert.ErrorContains(t, err, "Addr")
		})
	}
	_, client := newClient(t, src, WithFallback(false))
	status, body, _ := fetch(t, client, svcURL)
	assert.Equal(t, 200, status, "the last good set stays")
	assert.Contains(t, body, "good")
}
