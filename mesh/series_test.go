package mesh

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Services that share one endpoint address still get series of their own,
// each with its own labels, through a table that evicts: the outbound
// request metrics keep an endpoint's labels as the balancer holds them
// rather than a copy, and the balancer and classify drop a Service's state
// when a new one takes its place. A Service labelled before its state was
// evicted counts into its own series again when it comes back; one past
// the bound is counted under other with its own endpoint labels, never
// under the labels of the Service it replaced.
func TestServicesKeepTheirOwnSeriesThroughEviction(t *testing.T) {
	const bound = 2
	cp := startControlPlane(t)
	app := testutil.NewServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	appAddr := netip.MustParseAddrPort(strings.TrimPrefix(app.URL, "http://"))
	name := func(svc string) string { return svc + ".shelf.svc.cluster.local:80" }
	services := []string{"books", "authors", "reviews"}
	sets := make(map[string][]endpoint.Endpoint, len(services))
	for _, svc := range services {
		sets[name(svc)] = []endpoint.Endpoint{{Addr: appAddr}}
	}
	cp.store.SetEndpoints(sets)
	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()
	m := testutil.NewMetrics(t)
	cl := NewClient(WithDestination(dst), WithLogger(quiet), WithMeterProvider(m.Provider), WithMaxAuthorities(bound))
	defer cl.Close()

	get := func(svc string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+name(svc)+"/", nil)
		require.NoError(t, err)
		resp, err := cl.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	// reviews, past the bound, takes the place of books; books and then
	// authors come back and take their places again.
	for _, svc := range []string{"books", "authors", "reviews", "books", "authors", "books"} {
		get(svc)
	}

	for _, tc := range []struct {
		svc, authority, parent string
		want                   string
	}{
		{"books", name("books"), "books", "3"},
		{"authors", name("authors"), "authors", "2"},
		{"reviews", "other", "other", "1"},
	} {
		t.Run(tc.svc, func(t *testing.T) {
			own := []string{`direction="outbound"`, `authority="` + tc.authority + `"`, `dst_service="` + tc.svc + `"`,
				`dst_namespace="shelf"`, `target_addr="` + appAddr.String() + `"`, `tls="disabled"`}
			assert.Equal(t, tc.want, m.Value(t, "request_total", own...), "%v", m.Lines(t, "request_total"))
			assert.Equal(t, tc.want, m.Value(t, "response_total", append(own, `status_code="200"`, `classification="success"`)...),
				"%v", m.Lines(t, "response_total"))
			assert.Equal(t, tc.want, m.Value(t, "response_latency_ms_count", append(own, `status_code="200"`)...),
				"%v", m.Lines(t, "response_latency_ms_count"))
			assert.Len(t, m.Lines(t, "request_total", `dst_service="`+tc.svc+`"`), 1, "one series of the Service's endpoint labels")
			assert.Len(t, m.Lines(t, "request_total", `authority="`+tc.authority+`"`), 1, "one series of the authority")
			parent := []string{`parent_name="` + tc.parent + `"`, `backend_name="` + tc.parent + `"`}
			assert.Equal(t, tc.want, m.Value(t, "outbound_http_balancer_queue_requests_total", parent...),
				"%v", m.Lines(t, "outbound_http_balancer_queue_requests_total"))
		})
	}
}
