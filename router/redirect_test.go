package router

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRedirectLocation holds the cases of linkerd2-proxy's
// linkerd/http/route/src/http/filter/redirect.rs tests and of the Gateway
// API conformance tests httproute-redirect-port-and-scheme.go,
// httproute-redirect-path.go, httproute-redirect-host-and-status.go and
// httproute-redirect-port.go (a request to a listener's port is a request
// whose authority carries that port).
func TestRedirectLocation(t *testing.T) {
	prefix := func(p string) *policy.HTTPRouteMatch {
		return &policy.HTTPRouteMatch{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: p}}
	}
	exact := func(p string) *policy.HTTPRouteMatch {
		return &policy.HTTPRouteMatch{Path: &policy.PathMatch{Kind: policy.PathExact, Value: p}}
	}
	full := func(p string) *policy.PathModifier { return &policy.PathModifier{Full: p} }
	pfx := func(p string) *policy.PathModifier { return &policy.PathModifier{Full: p, Prefix: true} }
	tests := []struct {
		source, name string
		match        *policy.HTTPRouteMatch // nil: a rule without matches
		redirect     policy.Redirect
		url          string
		want         string // "" when the redirect does nothing
		wantErr      error
	}{
		{"redirect.rs", "default_noop", nil, policy.Redirect{}, "http://example.com/foo", "", nil},
		{"redirect.rs", "host", nil, policy.Redirect{Host: "example.org"}, "http://example.com/foo?a=b&c", "http://example.org/foo?a=b&c", nil},
		{"redirect.rs", "port", nil, policy.Redirect{Port: 8080}, "http://example.com/foo?a=b&c", "http://example.com:8080/foo?a=b&c", nil},
		{"redirect.rs", "port_default_is_omitted", nil, policy.Redirect{Port: 80}, "http://example.com:8080/foo?a=b&c", "http://example.com/foo?a=b&c", nil},
		{"redirect.rs", "port_default_is_omitted https", nil, policy.Redirect{Scheme: "https", Port: 443}, "http://example.com:8080/foo?a=b&c", "https://example.com/foo?a=b&c", nil},
		{"redirect.rs", "replace_path_full", nil, policy.Redirect{Path: full("/bar")}, "http://example.com/foo", "http://example.com/bar", nil},
		{"redirect.rs", "replace_path_full_overwrites_query_params", nil, policy.Redirect{Path: full("/bar")}, "http://example.com/foo?a=b&c=d", "http://example.com/bar", nil},
		{"redirect.rs", "replace_path_full_with_query_params", nil, policy.Redirect{Path: full("/bar?a=b&c")}, "http://example.com/foo", "http://example.com/bar?a=b&c", nil},
		{"redirect.rs", "replace_path_prefix", prefix("/foo"), policy.Redirect{Path: pfx("/qux")}, "http://example.com/foo/bar", "http://example.com/qux/bar", nil},
		{"redirect.rs", "replace_path_prefix_with_query_params", prefix("/foo"), policy.Redirect{Path: pfx("/qux")}, "http://example.com/foo/bar?a=b&c", "http://example.com/qux/bar?a=b&c", nil},
		{"redirect.rs", "replace_path_prefix_default_match", nil, policy.Redirect{Path: pfx("/qux")}, "http://example.com/foo/bar", "http://example.com/qux/foo/bar", nil},
		{"redirect.rs", "replace_path_prefix_root_match", prefix("/"), policy.Redirect{Path: pfx("/qux")}, "http://example.com/foo/bar", "http://example.com/qux/foo/bar", nil},
		{"redirect.rs", "replace_path_prefix_trailing_slash", prefix("/foo/"), policy.Redirect{Path: pfx("/qux")}, "http://example.com/foo/bar", "http://example.com/qux/bar", nil},
		{"redirect.rs", "replace_path_prefix_exact_match", exact("/foo/bar"), policy.Redirect{Path: pfx("/qux")}, "http://example.com/foo/bar", "", policy.ErrPrefixRedirect},
		{"redirect.rs", "scheme", nil, policy.Redirect{Scheme: "https"}, "http://example.com/foo?a=b&c", "https://example.com/foo?a=b&c", nil},

		{"httproute-redirect-port-and-scheme", "listener 80, scheme nil, port nil", nil, policy.Redirect{Host: "example.org"}, "http://gw/scheme-nil-and-port-nil", "http://example.org/scheme-nil-and-port-nil", nil},
		{"httproute-redirect-port-and-scheme", "listener 80, scheme nil, port 80", nil, policy.Redirect{Host: "example.org", Port: 80}, "http://gw/scheme-nil-and-port-80", "http://example.org/scheme-nil-and-port-80", nil},
		{"httproute-redirect-port-and-scheme", "listener 80, scheme nil, port 8080", nil, policy.Redirect{Host: "example.org", Port: 8080}, "http://gw/scheme-nil-and-port-8080", "http://example.org:8080/scheme-nil-and-port-8080", nil},
		{"httproute-redirect-port-and-scheme", "listener 80, scheme https, port nil", nil, policy.Redirect{Host: "example.org", Scheme: "https"}, "http://gw/scheme-https-and-port-nil", "https://example.org/scheme-https-and-port-nil", nil},
		{"httproute-redirect-port-and-scheme", "listener 80, scheme https, port 443", nil, policy.Redirect{Host: "example.org", Scheme: "https", Port: 443}, "http://gw/scheme-https-and-port-443", "https://example.org/scheme-https-and-port-443", nil},
		{"httproute-redirect-port-and-scheme", "listener 80, scheme https, port 8443", nil, policy.Redirect{Host: "example.org", Scheme: "https", Port: 8443}, "http://gw/scheme-https-and-port-8443", "https://example.org:8443/scheme-https-and-port-8443", nil},
		{"httproute-redirect-port-and-scheme", "listener 8080, scheme nil, port nil", nil, policy.Redirect{Host: "example.org"}, "http://gw:8080/scheme-nil-and-port-nil", "http://example.org:8080/scheme-nil-and-port-nil", nil},
		{"httproute-redirect-port-and-scheme", "listener 8080, scheme nil, port 80", nil, policy.Redirect{Host: "example.org", Port: 80}, "http://gw:8080/scheme-nil-and-port-80", "http://example.org/scheme-nil-and-port-80", nil},
		{"httproute-redirect-port-and-scheme", "listener 8080, scheme https, port nil", nil, policy.Redirect{Host: "example.org", Scheme: "https"}, "http://gw:8080/scheme-https-and-port-nil", "https://example.org/scheme-https-and-port-nil", nil},
		{"httproute-redirect-path", "prefix", prefix("/original-prefix"), policy.Redirect{Path: pfx("/replacement-prefix")}, "http://gw/original-prefix/lemon", "http://gw/replacement-prefix/lemon", nil},
		{"httproute-redirect-path", "full", prefix("/full"), policy.Redirect{Path: full("/full-path-replacement")}, "http://gw/full/path/original", "http://gw/full-path-replacement", nil},
		{"httproute-redirect-path", "path and host", prefix("/path-and-host"), policy.Redirect{Host: "example.org", Path: pfx("/replacement-prefix")}, "http://gw/path-and-host", "http://example.org/replacement-prefix", nil},
		{"httproute-redirect-path", "full path and host", prefix("/full-path-and-host"), policy.Redirect{Host: "example.org", Path: full("/replacement-full")}, "http://gw/full-path-and-host", "http://example.org/replacement-full", nil},
		{"httproute-redirect-host-and-status", "hostname", nil, policy.Redirect{Host: "example.org"}, "http://gw/hostname-redirect", "http://example.org/hostname-redirect", nil},
		{"httproute-redirect-port", "port 8083", nil, policy.Redirect{Port: 8083}, "http://gw/port", "http://gw:8083/port", nil},
		{"httproute-redirect-port", "port 8083 with host", nil, policy.Redirect{Host: "example.org", Port: 8083}, "http://gw/port-and-host", "http://example.org:8083/port-and-host", nil},
	}
	for _, tt := range tests {
		t.Run(tt.source+"/"+tt.name, func(t *testing.T) {
			rule := policy.HTTPRule{}
			if tt.match != nil {
				rule.Matches = []policy.HTTPRouteMatch{*tt.match}
			}
			rt := compileRoutes(t, rule)
			req := httptest.NewRequest(http.MethodGet, tt.url, nil)
			_, m := rt.Select(req)
			require.GreaterOrEqual(t, m.Route, 0, "the request must match")
			loc, same, err := tt.redirect.Location(req, m)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.want == "" {
				assert.True(t, same, "no redirect expected, got %q", loc)
				return
			}
			assert.False(t, same)
			assert.Equal(t, tt.want, loc)
		})
	}
}

func compileRoutes(t *testing.T, rules ...policy.HTTPRule) *policy.Table {
	t.Helper()
	p := &policy.Policy{Protocol: policy.ProtocolHTTP1, HTTP1: policy.HTTPProtocol{Routes: []policy.HTTPRoute{{Rules: rules}}}}
	tab, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	return tab
}
