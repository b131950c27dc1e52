package balancer

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingTransport counts the requests it passes on, by endpoint.
type countingTransport struct {
	base http.RoundTripper
	sent atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.sent.Add(1)
	return c.base.RoundTrip(r)
}

// refusedClient is newClient with a count of what the balancer sends.
func refusedClient(t *testing.T, eps []endpoint.Endpoint) (*http.Client, *countingTransport) {
	t.Helper()
	b := New(staticSource(t, map[string][]endpoint.Endpoint{books + ":7000": eps}), WithLogger(quietLogger))
	t.Cleanup(b.Close)
	h2 := origproto.NewH2Transport()
	t.Cleanup(h2.CloseIdleConnections)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	ct := &countingTransport{base: origproto.NewTransport(origproto.WithH2(h2), origproto.WithHTTP1(h1))}
	return &http.Client{Transport: b.Transport(ct), Timeout: testutil.Timeout}, ct
}

// dead is an endpoint whose process died: its port refuses connections.
func dead(t *testing.T, weight uint32) endpoint.Endpoint {
	return endpoint.Endpoint{Addr: testutil.RefusedAddr(t), Weight: weight}
}

// A workload that dies stays in the control plane's answers until its
// registration or lease ends. The first request of a fresh process, which
// the balancer sends to the dead endpoint (it holds nearly all the
// weight), reaches the live one instead: a refused connection sent
// nothing, so the request goes to another endpoint, its body again when
// it can be had again.
func TestRefusedConnectionGoesToAnotherEndpoint(t *testing.T) {
	echo := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "live "+r.Method+" "+string(b))
	}))
	echo.Weight = 1
	for _, tc := range []struct {
		name string
		req  func() *http.Request
		want string
	}{
		{"GET", func() *http.Request { r, _ := http.NewRequest(http.MethodGet, "http://"+books+":7000/", nil); return r }, "live GET "},
		{"POST with GetBody", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://"+books+":7000/", bytes.NewReader([]byte("the body")))
			return r
		}, "live POST the body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, sent := refusedClient(t, []endpoint.Endpoint{dead(t, 1_000_000), echo})
			for i := range 20 {
				resp, err := c.Do(tc.req())
				require.NoError(t, err, "request %d", i)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err)
				assert.Equal(t, http.StatusOK, resp.StatusCode, "request %d", i)
				assert.Equal(t, tc.want, string(b), "request %d", i)
			}
			assert.GreaterOrEqual(t, sent.sent.Load(), int64(21), "the first request went to the dead endpoint first")
		})
	}
}

// A body that cannot be had again is not sent again: the caller gets the
// refusal. Nor does a request go to more than MaxRefusedConnects
// endpoints when every one refuses.
func TestRefusedConnectionNotResent(t *testing.T) {
	t.Run("body without GetBody", func(t *testing.T) {
		var got atomic.Int64
		live := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.Add(1) }))
		live.Weight = 1
		c, sent := refusedClient(t, []endpoint.Endpoint{dead(t, 1_000_000), live})
		req, err := http.NewRequest(http.MethodPost, "http://"+books+":7000/", io.NopCloser(strings.NewReader("once")))
		require.NoError(t, err)
		_, err = c.Do(req)
		require.ErrorContains(t, err, "connection refused")
		assert.EqualValues(t, 1, sent.sent.Load())
		assert.Zero(t, got.Load(), "the live endpoint got nothing")
	})
	t.Run("every endpoint refuses", func(t *testing.T) {
		eps := []endpoint.Endpoint{dead(t, 1), dead(t, 1), dead(t, 1), dead(t, 1), dead(t, 1)}
		c, sent := refusedClient(t, eps)
		_, err := c.Get("http://" + books + ":7000/")
		require.ErrorContains(t, err, "connection refused")
		assert.EqualValues(t, MaxRefusedConnects, sent.sent.Load())
	})
}
