package balancer

import (
	"io"
	"net/http"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

// eofReader is an empty response body that allocates nothing.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
func (eofReader) Close() error             { return nil }

// A request the Balancer sends to an endpoint it picked costs it two
// allocations, with or without the endpoint's identity: the request's copy
// for the endpoint (http.Request's WithContext) and one that holds the
// endpoint's context values (its h2 hint and TLS name, the endpoint, its
// metric labels), its URL and the watch on its response body.
func TestSendAllocs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ep       endpoint.Endpoint
		want     float64
		identity string
	}{
		{name: "plaintext", ep: endpoint.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.1:80"), H2: true}, want: 2},
		{name: "meshed", ep: endpoint.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.1:80"), H2: true, Identity: "books.ns.serviceaccount.identity.linkerd.cluster.local"}, want: 2,
			identity: "books.ns.serviceaccount.identity.linkerd.cluster.local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bal := New(staticSource(t, map[string][]endpoint.Endpoint{"a.ns:80": {tc.ep}}), WithLogger(quietLogger))
			defer bal.Close()
			resp := &http.Response{StatusCode: 200}
			var seen *http.Request
			rt := bal.Transport(roundTrip(func(r *http.Request) (*http.Response, error) {
				seen = r
				resp.Body, resp.Request = eofReader{}, r
				return resp, nil
			}))
			req, err := http.NewRequest("GET", "http://a.ns/books", nil)
			require.NoError(t, err)
			send := func() {
				got, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, got.Body)
				got.Body.Close()
			}
			send()
			ctx := seen.Context()
			assert.Equal(t, "10.0.0.1:80", seen.URL.Host)
			assert.Equal(t, "/books", seen.URL.Path)
			assert.Equal(t, "http://a.ns/books", req.URL.String(), "the caller's URL is left alone")
			peer, ok := origproto.PeerFromContext(ctx)
			assert.True(t, ok && peer, "the endpoint's h2 hint")
			assert.Equal(t, tc.ep.Addr, EndpointFromContext(ctx).Addr)
			assert.NotNil(t, classify.LabelsFromContext(ctx), "the endpoint's labels")
			assert.Equal(t, tc.identity, origproto.ServerIdentityFromContext(ctx))
			assert.Equal(t, tc.want, testing.AllocsPerRun(1000, send))
		})
	}
}
