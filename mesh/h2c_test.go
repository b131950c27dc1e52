//lint:file-ignore SA1019 the application under test answers h2c upgrades with x/net's deprecated h2c handler, as applications still do

package mesh

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

// An application served as h2c.NewHandler documents it, behind a server
// stack whose policy admits anyone to /public and routes nothing else. A
// client asking to upgrade its connection to h2c on /public would get an
// HTTP/2 connection served by the application itself, every later stream
// (to /admin, say, with a l5d-client-id of its choosing) past the policy.
// The ask never reaches the application: the request is answered as the
// HTTP/1 request it is, and the policy still answers /admin.
func TestH2CUpgradeNeverPassesThePolicy(t *testing.T) {
	reached := make(chan string, 4)
	app := h2c.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- r.Proto + " " + r.URL.Path
		io.WriteString(w, "app "+r.URL.Path)
	}), &http2.Server{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := netip.MustParseAddrPort(lis.Addr().String()).Port()
	anyone := authz.Authz{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "anyone"},
		Networks: []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}}}
	public := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"},
		Routes: []authz.Route{{
			Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "public"},
			Rules:          []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/public"}}}}},
			Authorizations: []authz.Authz{anyone},
		}},
	}
	srv := NewServer(app, WithLogger(quiet), WithInboundPolicy(authz.WithSource(authz.StaticSource{port: public}), authz.WithoutLocalhost()))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	go hs.Serve(srv.Listener(lis))
	defer hs.Close()

	conn, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(testutil.Timeout)))
	_, err = io.WriteString(conn, "GET /public HTTP/1.1\r\nHost: books\r\nConnection: Upgrade, HTTP2-Settings\r\n"+
		"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "answered, not switched (101)")
	assert.Equal(t, "app /public", string(body))
	assert.Equal(t, "HTTP/1.1 /public", <-reached)

	resp, err = testutil.NewTransport(t, testutil.H1).RoundTrip(httptestRequest(t, "http://"+lis.Addr().String()+"/admin"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "no route")
	assert.Empty(t, reached)
}

func httptestRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}
