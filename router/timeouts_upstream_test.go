package router

import (
	"errors"
	"io"
	"net/http"
	"path"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpstreamStreamTimeouts holds the cases of linkerd2-proxy's
// linkerd/app/outbound/src/http/logical/tests/timeouts.rs, each against a
// real upstream: which timeout ends which part of the exchange, and how.
// A timeout that fires before the response head answers 504 with
// l5d-proxy-error; one that fires after it ends the response body with
// an error.
func TestUpstreamStreamTimeouts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		hold := func(r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		up := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
			switch path.Base(r.URL.Path) {
			case "no-head":
				hold(r)
			case "head-then-nothing":
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				hold(r)
			}
		})
		rule := func(path string, tm policy.Timeouts) policy.HTTPRule {
			return policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: path}}},
				Backends: to(up.backend("web")), Timeouts: tm}
		}
		p := httpPolicy(
			rule("/request", policy.Timeouts{Request: timeout}),
			rule("/response", policy.Timeouts{Response: timeout}),
			rule("/idle", policy.Timeouts{Idle: timeout}),
		)
		f := newFixture(t, mode, p)

		for _, tc := range []struct {
			name, path string
			body       io.Reader // nil: GET without a body
			// wantHead is the 504's l5d-proxy-error, "" when the head is
			// a 200 whose body must then fail.
			wantHead string
		}{
			{"request_timeout_response_headers", "/request/no-head", nil, "request timed out after 200ms"},
			{"request_timeout_request_body", "/request/no-head", pendingBody{release}, "request timed out after 200ms"},
			{"request_timeout_response_body", "/request/head-then-nothing", nil, ""},
			{"response_timeout_response_headers", "/response/no-head", nil, "response timed out after 200ms"},
			{"response_timeout_response_body", "/response/head-then-nothing", nil, ""},
			{"idle_timeout_response_body", "/idle/head-then-nothing", nil, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				method := "GET"
				if tc.body != nil {
					method = "POST"
				}
				req, err := http.NewRequest(method, "http://svc.test"+tc.path, tc.body)
				require.NoError(t, err)
				resp, err := f.client.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				if tc.wantHead != "" {
					assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
					assert.Equal(t, tc.wantHead, resp.Header.Get("L5d-Proxy-Error"))
					return
				}
				require.Equal(t, 200, resp.StatusCode, "the head came in time")
				_, err = io.ReadAll(resp.Body)
				assert.Error(t, err, "the timeout ends the response body")
			})
		}
	})
}

// pendingBody is a request body that never ends until done is closed.
type pendingBody struct{ done chan struct{} }

func (b pendingBody) Read([]byte) (int, error) {
	<-b.done
	return 0, errors.New("released")
}
