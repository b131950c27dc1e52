package hedge

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseDelay(t *testing.T) {
	for _, tc := range []struct {
		in    string
		delay time.Duration
		pct   float64
		err   bool
	}{
		{in: "20ms", delay: 20 * time.Millisecond},
		{in: "1.5s", delay: 1500 * time.Millisecond},
		{in: "15", delay: 15 * time.Millisecond},
		{in: "p95", pct: 95},
		{in: "P99.9", pct: 99.9},
		{in: "p0", err: true},
		{in: "p100", err: true},
		{in: "0s", err: true},
		{in: "-1ms", err: true},
		{in: "2h", err: true},
		{in: "soon", err: true},
	} {
		d, q, err := ParseDelay(tc.in)
		if tc.err {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.delay, d, tc.in)
		assert.Equal(t, tc.pct, q, tc.in)
	}
}

func TestParseMaxExtraLoad(t *testing.T) {
	for in, want := range map[string]float64{"5%": 0.05, "0.1": 0.1, "100%": 1, " 2.5 % ": 0.025} {
		got, err := ParseMaxExtraLoad(in)
		require.NoError(t, err, in)
		assert.InDelta(t, want, got, 1e-12, in)
	}
	for _, in := range []string{"0", "0%", "150%", "1.5", "-1%", "lots", "NaN"} {
		_, err := ParseMaxExtraLoad(in)
		assert.Error(t, err, in)
	}
}

// RFC 9110 section 9.2.2: GET, HEAD, OPTIONS, TRACE, PUT and DELETE are
// idempotent; POST, PATCH and CONNECT are not.
func TestIdempotentMethod(t *testing.T) {
	for m, want := range map[string]bool{"GET": true, "HEAD": true, "OPTIONS": true, "TRACE": true, "PUT": true, "DELETE": true,
		"POST": false, "PATCH": false, "CONNECT": false, "get": false} {
		assert.Equal(t, want, IdempotentMethod(m), m)
	}
}

// The share of extra load: a route starts with one hedge and earns its
// share per request, up to Burst.
func TestStateShare(t *testing.T) {
	s := NewState(Policy{Delay: time.Millisecond, MaxExtraLoad: 0.1})
	_, ok := s.Request()
	require.True(t, ok)
	assert.True(t, s.Spend(), "the first hedge of a fresh route")
	assert.False(t, s.Spend(), "0.1 earned is no hedge")
	for range 10 {
		s.Request()
	}
	assert.True(t, s.Spend(), "ten requests earn one")
	assert.False(t, s.Spend())
	for range 1000 {
		s.Request()
	}
	n := 0
	for s.Spend() {
		n++
	}
	assert.Equal(t, Burst, n, "at most Burst at once")
	st := s.Stats()
	assert.Equal(t, uint64(1011), st.Requests)
	assert.Equal(t, uint64(3), st.Refused)
}

// A percentile delay is learnt from the observed latencies after
// DefaultMinSamples, and follows the route across windows.
func TestStatePercentile(t *testing.T) {
	now := time.Unix(0, 0)
	s := newState(Policy{Percentile: 90}, func() time.Time { return now })
	_, ok := s.Delay()
	assert.False(t, ok, "nothing learnt")
	for i := range 100 {
		d := time.Millisecond
		if i >= 90 {
			d = 100 * time.Millisecond
		}
		s.Observe(d)
	}
	d, ok := s.Delay()
	require.True(t, ok)
	assert.InDelta(t, float64(time.Millisecond), float64(d), float64(time.Millisecond)/4, "p90 of 90 fast and 10 slow")
	now = now.Add(latencyWindow)
	d, ok = s.Delay()
	require.True(t, ok, "the previous window still counts")
	assert.InDelta(t, float64(time.Millisecond), float64(d), float64(time.Millisecond)/4)
	now = now.Add(2 * latencyWindow)
	_, ok = s.Delay()
	assert.False(t, ok, "both windows expired")
}

func TestPolicyValidateAndString(t *testing.T) {
	assert.Error(t, (&Policy{Percentile: 100}).Validate())
	assert.Error(t, (&Policy{MaxExtraLoad: 2}).Validate())
	assert.Error(t, (&Policy{Delay: -1}).Validate())
	assert.NoError(t, (&Policy{Delay: time.Millisecond}).Validate())
	assert.Equal(t, "after p95 of the route's latency, at most 5% extra load, idempotent methods", (&Policy{Percentile: 95}).String())
	assert.Equal(t, "off", (*Policy)(nil).String())
}
