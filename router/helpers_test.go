package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// authority is the service the tests route to; its name is never
// resolved: every backend is a forward address on loopback.
const authority = "svc.test:80"

var (
	parentMeta = policy.Metadata{Kind: "Service", Namespace: "ns", Name: "svc", Port: 80}
	// fiveXX is retry.linkerd.io/http: 5xx; a retry without status
	// ranges retries no response.
	fiveXX    = []policy.StatusRange{{Start: 500, End: 599}}
	routeMeta = policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "ns", Name: "web"}
)

// upstream is a loopback server that counts its requests and keeps what
// the last one carried.
type upstream struct {
	srv   *httptest.Server
	n     atomic.Int64
	mu    sync.Mutex
	last  http.Header
	body  []string
	serve func(n int64, w http.ResponseWriter, r *http.Request)
}

func newUpstream(t *testing.T, serve func(n int64, w http.ResponseWriter, r *http.Request)) *upstream {
	u := &upstream{serve: serve}
	u.srv = testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Counted once its headers and body are recorded: a test that
		// waits on the count then reads them.
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.last = r.Header.Clone()
		u.body = append(u.body, string(b))
		u.mu.Unlock()
		n := u.n.Add(1)
		if u.serve != nil {
			u.serve(n, w, r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	return u
}

func (u *upstream) header() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}

func (u *upstream) bodies() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.body...)
}

func (u *upstream) backend(name string) policy.RouteBackend {
	ap := netip.MustParseAddrPort(u.srv.Listener.Addr().String())
	return policy.RouteBackend{Backend: policy.Backend{
		Meta:    policy.Metadata{Kind: "Service", Namespace: "ns", Name: name, Port: ap.Port()},
		Forward: &endpoint.Endpoint{Addr: ap},
	}, Weight: 1}
}

// httpPolicy is a policy of one HTTP route with rules, for HTTP/1 and
// HTTP/2.
func httpPolicy(rules ...policy.HTTPRule) *policy.Policy {
	routes := []policy.HTTPRoute{{Meta: routeMeta, Rules: rules}}
	return &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolDetect,
		HTTP1: policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes}}
}

func to(bs ...policy.RouteBackend) policy.Distribution {
	return policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: bs}
}

// fixture is a router over a static policy source with a client through
// it.
type fixture struct {
	r      *Router
	client *http.Client
	pol    *policy.StaticSource
	m      *testutil.Metrics
	waits  chan time.Duration
}

func newFixture(t *testing.T, mode testutil.Mode, p *policy.Policy, opts ...Option) *fixture {
	f := &fixture{pol: policy.NewStaticSource(nil), m: testutil.NewMetrics(t), waits: make(chan time.Duration, 100)}
	if p != nil {
		f.pol.Set(authority, p)
	}
	opts = append([]Option{WithPolicies(f.pol), WithMeterProvider(f.m.Provider)}, opts...)
	f.r = New(opts...)
	f.r.cfg.wait = func(ctx context.Context, d time.Duration) bool {
		f.waits <- d
		return ctx.Err() == nil
	}
	t.Cleanup(f.r.Close)
	f.client = &http.Client{Transport: f.r.Transport(testutil.NewTransport(t, mode)),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if p != nil {
		f.waitModel(t, "http://svc.test/", ModelPolicy)
	}
	return f
}

func (f *fixture) waitModel(t *testing.T, url, model string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, url, nil)
	require.Eventually(t, func() bool { return f.r.Explain(req).Model == model },
		testutil.Timeout, 5*time.Millisecond, "model %s", model)
}

// do sends a request and returns the response with its body read.
func (f *fixture) do(t *testing.T, method, url, body string, h http.Header) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := f.client.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp, string(b)
}
