package mesh

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/authz"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
)

// A path is authorized as the application reads it: a client the admin
// route refuses cannot reach the admin handler of a net/http ServeMux (which
// decodes the path) by percent-encoding a letter of "/admin", or a
// sub-delimiter of a route's path.
func TestEncodedPathAuthorizedAsDecoded(t *testing.T) {
	all := []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}, {Net: netip.MustParsePrefix("::/0")}}
	onlyAdmins := []authz.Authz{{
		Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "admins"},
		Networks:       all,
		Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{"admin.default.serviceaccount.identity.linkerd.cluster.local"}}},
	}}
	route := func(name string, m *policy.PathMatch, az []authz.Authz) authz.Route {
		return authz.Route{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: name},
			Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Path: m}}}}, Authorizations: az}
	}
	server := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "app"},
		Routes: []authz.Route{
			route("admin", &policy.PathMatch{Kind: policy.PathPrefix, Value: "/admin"}, onlyAdmins),
			route("plus", &policy.PathMatch{Kind: policy.PathExact, Value: "/a+b"}, onlyAdmins),
			route("public", &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}, []authz.Authz{{
				Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "everyone"}, Networks: all}}),
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/admin/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "admin") })
	mux.HandleFunc("/a+b", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "plus") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "public") })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := uint16(lis.Addr().(*net.TCPAddr).Port)
	s := NewServer(mux, WithInboundPolicy(authz.WithSource(authz.StaticSource{port: server}), authz.WithoutLocalhost()))
	defer s.Close()
	srv := origproto.NewServer(s)
	go srv.Serve(s.Listener(lis))
	defer srv.Close()

	// Raw request lines, so that the target is sent exactly as written.
	get := func(target string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", lis.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	for _, tt := range []struct {
		target string
		want   int
		body   string
	}{
		{"/admin/secret", http.StatusForbidden, ""},
		{"/%61dmin/secret", http.StatusForbidden, ""},
		{"/%61%64%6D%69%6e/secret", http.StatusForbidden, ""},
		{"/adm%69n/secret", http.StatusForbidden, ""},
		{"/a+b", http.StatusForbidden, ""},
		{"/a%2Bb", http.StatusForbidden, ""},
		{"/a%2bb", http.StatusForbidden, ""},
		{"/public", http.StatusOK, "public"},
		{"/%70ublic", http.StatusOK, "public"},
	} {
		code, body := get(tt.target)
		assert.Equal(t, tt.want, code, "GET %s: %q", tt.target, body)
		if tt.body != "" {
			assert.Equal(t, tt.body, body, "GET %s", tt.target)
		}
	}
}
