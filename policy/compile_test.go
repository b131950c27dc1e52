package policy

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

func TestCompileErrorsNameTheField(t *testing.T) {
	one := func(rule HTTPRule) *Policy {
		return &Policy{Protocol: ProtocolHTTP1, HTTP1: HTTPProtocol{Routes: []HTTPRoute{{Rules: []HTTPRule{{}, rule}}}}}
	}
	fwd := &endpoint.Endpoint{}
	tests := []struct {
		name string
		p    *Policy
		want string
	}{
		{"bad path regex", one(HTTPRule{Matches: []HTTPRouteMatch{{}, {Path: regex("/(")}}}), "http1.routes[0].rules[1].matches[1].path.regex: bad regex: "},
		{"regex too long", one(HTTPRule{Matches: []HTTPRouteMatch{{Path: regex(strings.Repeat("a", 1025))}}}), "http1.routes[0].rules[1].matches[0].path.regex: regex of 1025 bytes is longer than the limit of 1024"},
		{"bad header name", one(HTTPRule{Matches: []HTTPRouteMatch{{Headers: []HeaderMatch{{Name: "a b", Value: "x"}}}}}), `http1.routes[0].rules[1].matches[0].headers[0].name: "a b" is not a header name`},
		{"bad header value", one(HTTPRule{Matches: []HTTPRouteMatch{{Headers: []HeaderMatch{{Name: "a", Value: "x\r\n"}}}}}), `http1.routes[0].rules[1].matches[0].headers[0].value: "x\r\n" is not a header value`},
		{"bad header regex", one(HTTPRule{Matches: []HTTPRouteMatch{{Headers: []HeaderMatch{{Name: "a", Value: "[", Regex: true}}}}}), "http1.routes[0].rules[1].matches[0].headers[0].regex: bad regex"},
		{"query param without a name", one(HTTPRule{Matches: []HTTPRouteMatch{{QueryParams: []QueryParamMatch{{Value: "x"}}}}}), "http1.routes[0].rules[1].matches[0].queryParams[0].name: required"},
		{"bad method", one(HTTPRule{Matches: []HTTPRouteMatch{{Method: "G T"}}}), `http1.routes[0].rules[1].matches[0].method: "G T" is not an HTTP method`},
		{"two filter kinds", one(HTTPRule{Filters: []Filter{{RequestHeaders: &HeaderModifier{}, Redirect: &Redirect{}}}}), "http1.routes[0].rules[1].filters[0]: 2 filter kinds set, want exactly 1"},
		{"no filter kind", one(HTTPRule{Filters: []Filter{{}}}), "http1.routes[0].rules[1].filters[0]: 0 filter kinds set, want exactly 1"},
		{"bad modifier header", one(HTTPRule{Filters: []Filter{{ResponseHeaders: &HeaderModifier{Set: []Header{{"x y", "1"}}}}}}), `http1.routes[0].rules[1].filters[0].responseHeaderModifier.set[0].name: "x y" is not a header name`},
		{"bad failure status", one(HTTPRule{Filters: []Filter{{FailureInjector: &FailureInjector{Status: 0}}}}), "http1.routes[0].rules[1].filters[0].failureInjector.status: 0 is not an HTTP status code"},
		{"bad failure ratio", one(HTTPRule{Filters: []Filter{{FailureInjector: &FailureInjector{Status: 500, Ratio: Ratio{2, 1}}}}}), "http1.routes[0].rules[1].filters[0].failureInjector.ratio: 2/1 is more than 1"},
		{"gRPC injector on HTTP", one(HTTPRule{Filters: []Filter{{GRPCFailureInjector: &GRPCFailureInjector{}}}}), "http1.routes[0].rules[1].filters[0].grpcFailureInjector: not allowed on an HTTP route"},
		{"relative redirect path", one(HTTPRule{Filters: []Filter{{Redirect: &Redirect{Path: &PathModifier{Full: "x"}}}}}), `http1.routes[0].rules[1].filters[0].redirect.path: "x" is not an absolute path`},
		{"bad redirect scheme", one(HTTPRule{Filters: []Filter{{Redirect: &Redirect{Scheme: "1http"}}}}), `http1.routes[0].rules[1].filters[0].redirect.scheme: "1http" is not a URL scheme`},
		{"bad redirect status", one(HTTPRule{Filters: []Filter{{Redirect: &Redirect{Status: 42}}}}), "http1.routes[0].rules[1].filters[0].redirect.status: 42 is not an HTTP status code"},
		{"empty random distribution", one(HTTPRule{Backends: Distribution{Kind: DistributionRandomAvailable}}), "http1.routes[0].rules[1].backends: a random_available distribution may not be empty"},
		{"backends on empty distribution", one(HTTPRule{Backends: Distribution{Backends: []RouteBackend{{}}}}), "http1.routes[0].rules[1].backends: an empty distribution has 1 backends"},
		{"balancer and forward", one(HTTPRule{Backends: Distribution{Kind: DistributionFirstAvailable, Backends: []RouteBackend{{Backend: Backend{Balancer: &Balancer{}, Forward: fwd}}}}}), "http1.routes[0].rules[1].backends.backends[0].backend: both balancer and forward set"},
		{"bad backend filter", one(HTTPRule{Backends: Distribution{Kind: DistributionFirstAvailable, Backends: []RouteBackend{{Filters: []Filter{{}}}}}}), "http1.routes[0].rules[1].backends.backends[0].filters[0]: 0 filter kinds set"},
		{"negative timeout", one(HTTPRule{Timeouts: Timeouts{Idle: -time.Second}}), "http1.routes[0].rules[1].timeouts.idle: negative duration"},
		{"bad status range", one(HTTPRule{Retry: &Retry{StatusRanges: []StatusRange{{500, 600}}}}), "http1.routes[0].rules[1].retry.statusRanges[0]: 500-600 is not a range of status codes up to 599"},
		{"inverted status range", one(HTTPRule{Retry: &Retry{StatusRanges: []StatusRange{{504, 502}}}}), "http1.routes[0].rules[1].retry.statusRanges[0]: 504-502"},
		{"gRPC codes on HTTP", one(HTTPRule{Retry: &Retry{GRPCCodes: []codes.Code{codes.Internal}}}), "http1.routes[0].rules[1].retry.grpcCodes: not allowed on an HTTP route"},
		{"bad retry backoff", one(HTTPRule{Retry: &Retry{Backoff: &backoff.Policy{Min: 2 * time.Second, Max: time.Second}}}), "http1.routes[0].rules[1].retry.backoff: backoff: min 2s is greater than max 1s"},
		{"too many routes", &Policy{Protocol: ProtocolHTTP2, HTTP2: HTTPProtocol{Routes: make([]HTTPRoute, 257)}}, "http2.routes: 257 routes is more than the limit of 256"},
		{"too many rules", &Policy{HTTP1: HTTPProtocol{Routes: []HTTPRoute{{Rules: make([]HTTPRule, 257)}}}}, "http1.routes[0].rules: 257 rules is more than the limit of 256"},
		{"too many matches", one(HTTPRule{Matches: make([]HTTPRouteMatch, 65)}), "http1.routes[0].rules[1].matches: 65 matches is more than the limit of 64"},
		{"too many hosts", &Policy{HTTP1: HTTPProtocol{Routes: []HTTPRoute{{Hosts: make([]HostMatch, 65)}}}}, "http1.routes[0].hosts: 65 hosts is more than the limit of 64"},
		{"detect compiles http2 too", &Policy{HTTP2: HTTPProtocol{Routes: []HTTPRoute{{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: regex("(")}}}}}}}}, "http2.routes[0].rules[0].matches[0].path.regex"},
		{"two accrual kinds", &Policy{HTTP1: HTTPProtocol{FailureAccrual: &FailureAccrual{Consecutive: &ConsecutiveFailures{}, Unified: &UnifiedAccrual{}}}}, "http1.failureAccrual: exactly one of consecutive and unified must be set"},
		{"accrual threshold", &Policy{HTTP1: HTTPProtocol{FailureAccrual: &FailureAccrual{Unified: &UnifiedAccrual{SuccessRateThreshold: 1.5}}}}, "http1.failureAccrual.unified.successRateThreshold: 1.5 is outside [0, 1]"},
		{"accrual window", &Policy{HTTP1: HTTPProtocol{FailureAccrual: &FailureAccrual{Unified: &UnifiedAccrual{SuccessRateThreshold: 0.5, Window: time.Millisecond}}}}, "http1.failureAccrual.unified.window: 1ms is shorter than 10ms"},
		{"gRPC redirect", &Policy{Protocol: ProtocolGRPC, GRPC: GRPCProtocol{Routes: []GRPCRoute{{Rules: []GRPCRule{{Filters: []Filter{{Redirect: &Redirect{}}}}}}}}}, "grpc.routes[0].rules[0].filters[0].redirect: not allowed on a gRPC route"},
		{"gRPC status ranges", &Policy{Protocol: ProtocolGRPC, GRPC: GRPCProtocol{Routes: []GRPCRoute{{Rules: []GRPCRule{{Retry: &Retry{StatusRanges: []StatusRange{{500, 599}}}}}}}}}, "grpc.routes[0].rules[0].retry.statusRanges: not allowed on a gRPC route"},
		{"gRPC bad header", &Policy{Protocol: ProtocolGRPC, GRPC: GRPCProtocol{Routes: []GRPCRoute{{Rules: []GRPCRule{{Matches: []GRPCRouteMatch{{Headers: []HeaderMatch{{Name: ""}}}}}}}}}}, `grpc.routes[0].rules[0].matches[0].headers[0].name: "" is not a header name`},
		{"unknown protocol", &Policy{Protocol: 9}, "protocol: unknown protocol 9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(tt.p, Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}

	// Limits are options.
	p := one(HTTPRule{Matches: []HTTPRouteMatch{{Path: regex("/a+")}}})
	_, err := Compile(p, Options{MaxRegexLen: 2})
	assert.ErrorContains(t, err, "regex of 3 bytes is longer than the limit of 2")
	_, err = Compile(p, Options{MaxRoutes: 1, MaxRules: 2})
	assert.NoError(t, err)
	_, err = Compile(p, Options{MaxRules: 1})
	assert.ErrorContains(t, err, "2 rules is more than the limit of 1")
}

func TestRetryDefaults(t *testing.T) {
	var r Retry
	assert.Equal(t, 1, r.Limit())
	assert.Equal(t, int64(65536), r.BodyLimit())
	assert.Equal(t, backoff.Policy{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: 1}, r.BackoffPolicy())
	// Empty ranges retry no status: Linkerd's controller sends none for a
	// route without retry.linkerd.io/http, and its proxy then retries only
	// errors (linkerd2-proxy linkerd/proxy/client-policy/src/http.rs,
	// linkerd/app/outbound/src/http/logical/policy/route/retry.rs).
	for _, code := range []int{200, 499, 500, 503, 599} {
		assert.False(t, r.RetryableStatus(code), "empty ranges retry no status: %d", code)
	}
	r = Retry{MaxRetries: 3, MaxRequestBytes: 10, StatusRanges: []StatusRange{{502, 504}, {429, 429}}}
	assert.Equal(t, 3, r.Limit())
	assert.Equal(t, int64(10), r.BodyLimit())
	for code, want := range map[int]bool{500: false, 502: true, 504: true, 505: false, 429: true} {
		assert.Equal(t, want, r.RetryableStatus(code), "%d", code)
	}
}

func TestHeaderModifierOrder(t *testing.T) {
	m := HeaderModifier{
		Add:    []Header{{"x-a", "added"}, {"x-b", "added"}, {"x-c", "added"}},
		Set:    []Header{{"x-b", "set"}},
		Remove: []string{"x-c", "x-gone"},
	}
	h := http.Header{"X-A": {"old"}, "X-B": {"old"}, "X-Gone": {"old"}}
	m.Apply(h)
	assert.Equal(t, http.Header{"X-A": {"old", "added"}, "X-B": {"set"}}, h, "add, then set, then remove")
}

func TestRedirectStatus(t *testing.T) {
	assert.Equal(t, 301, (&Redirect{}).StatusCode())
	assert.Equal(t, 302, (&Redirect{Status: 302}).StatusCode())
}

func TestDefaultMetadata(t *testing.T) {
	m := DefaultMetadata("http")
	assert.True(t, m.IsDefault())
	assert.Equal(t, "default", m.Kind)
	assert.False(t, Metadata{Group: "core", Kind: "default", Name: "x"}.IsDefault())
	assert.Equal(t, "grpc", ProtocolGRPC.String())
	assert.Equal(t, "random_available", DistributionRandomAvailable.String())
	assert.Equal(t, "regex", PathRegex.String())
}

func TestDefaultHTTPRoute(t *testing.T) {
	b := Backend{Meta: Metadata{Group: "core", Kind: "Service", Name: "s", Namespace: "ns", Port: 80}, Balancer: &Balancer{Authority: "s.ns.svc.cluster.local:80"}}
	r := DefaultHTTPRoute(b, &Retry{MaxRetries: 2}, Timeouts{Request: time.Second})
	table, err := Compile(&Policy{Parent: b.Meta, HTTP1: HTTPProtocol{Routes: []HTTPRoute{r}}}, Options{})
	require.NoError(t, err)
	got, m := table.Select(newReq("PUT", "http://s.ns.svc.cluster.local/any/path?x"))
	require.NotNil(t, got)
	assert.Equal(t, "default", got.Meta.Kind)
	assert.Equal(t, "http", got.Meta.Name)
	assert.Equal(t, "s.ns.svc.cluster.local:80", got.Backends.Backends[0].Backend.Balancer.Authority)
	assert.Equal(t, 2, got.Retry.Limit())
	assert.Equal(t, time.Second, got.Timeouts.Request)
	assert.Equal(t, PathPrefix, m.Path)
	assert.Equal(t, 1, m.PathLen)
}

// A detected protocol whose HTTP/1 and HTTP/2 hold the same decoded routes
// (one slice, as destination decodes Linkerd's default policies) compiles
// one table for both; equal routes in slices of their own, or another
// failure accrual, still compile a table each.
func TestCompileSharesTheSameHTTPRoutes(t *testing.T) {
	routes := []HTTPRoute{{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: &PathMatch{Kind: PathPrefix, Value: "/a"}}}}}}}
	fa := &FailureAccrual{Consecutive: &ConsecutiveFailures{MaxFailures: 3}}
	h1 := &http.Request{ProtoMajor: 1, URL: &url.URL{Path: "/a"}, Header: http.Header{}}
	h2 := &http.Request{ProtoMajor: 2, URL: &url.URL{Path: "/a"}, Header: http.Header{}}
	for _, tc := range []struct {
		name   string
		p      Policy
		shared bool
	}{
		{"one slice", Policy{HTTP1: HTTPProtocol{Routes: routes}, HTTP2: HTTPProtocol{Routes: routes}}, true},
		{"one slice, one accrual", Policy{HTTP1: HTTPProtocol{Routes: routes, FailureAccrual: fa}, HTTP2: HTTPProtocol{Routes: routes, FailureAccrual: fa}}, true},
		{"equal slices", Policy{HTTP1: HTTPProtocol{Routes: routes}, HTTP2: HTTPProtocol{Routes: slices.Clone(routes)}}, false},
		{"another accrual", Policy{HTTP1: HTTPProtocol{Routes: routes, FailureAccrual: fa}, HTTP2: HTTPProtocol{Routes: routes}}, false},
		{"a prefix of the slice", Policy{HTTP1: HTTPProtocol{Routes: append(routes[:1:1], routes[0])}, HTTP2: HTTPProtocol{Routes: routes}}, false},
		{"HTTP/1 only", Policy{Protocol: ProtocolHTTP1, HTTP1: HTTPProtocol{Routes: routes}, HTTP2: HTTPProtocol{Routes: routes}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, err := Compile(&tc.p, Options{})
			require.NoError(t, err)
			assert.Equal(t, tc.shared, table.SharesHTTPTables())
			r1, _ := table.Select(h1)
			require.NotNil(t, r1)
			r2, _ := table.Select(h2)
			require.NotNil(t, r2)
			if tc.shared {
				assert.Same(t, r1, r2)
			} else if tc.p.Protocol == ProtocolDetect {
				assert.NotSame(t, r1, r2)
			}
			assert.Same(t, tc.p.HTTP1.FailureAccrual, table.For(h1).FailureAccrual())
		})
	}
	var empty *Table
	assert.False(t, empty.SharesHTTPTables())
}
