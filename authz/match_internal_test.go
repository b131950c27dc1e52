package authz

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/policy"
)

var everywhere = []Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}, {Net: netip.MustParsePrefix("::/0")}}

func suffix(s string) []string {
	if s == "" {
		return []string{}
	}
	return strings.Split(s, ".")
}

// The identity cases are linkerd2-proxy's tests of is_tls_authorized
// (linkerd/app/inbound/src/policy.rs: is_authorized_for_matching_spiffe_ids
// and the eight cases after it), plus the authentication kinds of
// is_authorized: plaintext clients match only Unauthenticated, TLS without
// an identity also MeshTLS{unauthenticated}.
func TestAdmitsIdentity(t *testing.T) {
	ip := netip.MustParseAddr("10.1.2.3")
	meshed := func(id string) identity.Peer { return identity.Peer{TLS: true, ID: id} }
	for _, tc := range []struct {
		name     string
		peer     identity.Peer
		authn    Authentication
		admitted bool
	}{
		{"matching spiffe id", meshed("spiffe://some-root/some-workload"),
			Authentication{&MeshTLS{Identities: []string{"spiffe://some-root/some-workload"}}}, true},
		{"non-matching spiffe id", meshed("spiffe://some-root/some-workload-1"),
			Authentication{&MeshTLS{Identities: []string{"spiffe://some-root/some-workload-2"}}}, false},
		{"matching dns id", meshed("some.id.local"), Authentication{&MeshTLS{Identities: []string{"some.id.local"}}}, true},
		{"non-matching dns id", meshed("some.id.local.one"), Authentication{&MeshTLS{Identities: []string{"some.id.local.two"}}}, false},
		{"matching dns suffix", meshed("some.id.local"), Authentication{&MeshTLS{Suffixes: [][]string{suffix("id.local")}}}, true},
		{"non-matching dns suffix", meshed("some.id.local"), Authentication{&MeshTLS{Suffixes: [][]string{suffix("another-id.local")}}}, false},
		{"suffix never matches a spiffe id", meshed("spiffe://some-root/some-workload-1"),
			Authentication{&MeshTLS{Suffixes: [][]string{suffix("some-workload-1")}}}, false},
		{"one matching spiffe id of several", meshed("spiffe://some-root/some-workload-1"),
			Authentication{&MeshTLS{Identities: []string{"spiffe://some-root/some-workload-1", "some.workload.one", "some.workload.two"}}}, true},
		{"one matching dns id of several", meshed("some.workload.one"),
			Authentication{&MeshTLS{Identities: []string{"spiffe://some-root/some-workload-1", "some.workload.one", "some.workload.two"}}}, true},
		// A suffix with no parts is any DNS identity ("*"), never a SPIFFE one.
		{"empty suffix admits a dns id", meshed("web.ns.serviceaccount.identity.linkerd.cluster.local"),
			Authentication{&MeshTLS{Suffixes: [][]string{{}}}}, true},
		{"empty suffix refuses a spiffe id", meshed("spiffe://cluster.local/ns/a/sa/b"), Authentication{&MeshTLS{Suffixes: [][]string{{}}}}, false},
		// Any URI is a URI identity (urn: too): exact names only.
		{"matching urn id", meshed("urn:some.id.local"), Authentication{&MeshTLS{Identities: []string{"urn:some.id.local"}}}, true},
		{"suffix never matches a urn id", meshed("urn:some.id.local"), Authentication{&MeshTLS{Suffixes: [][]string{suffix("id.local")}}}, false},
		{"empty suffix refuses a urn id", meshed("urn:some.id.local"), Authentication{&MeshTLS{Suffixes: [][]string{{}}}}, false},
		{"suffix is a whole-label end", meshed("some.xid.local"), Authentication{&MeshTLS{Suffixes: [][]string{suffix("id.local")}}}, false},
		{"suffix alone is not itself", meshed("id.local"), Authentication{&MeshTLS{Suffixes: [][]string{suffix("id.local")}}}, false},
		{"identities need an identity", meshed(""), Authentication{&MeshTLS{Suffixes: [][]string{{}}}}, false},
		{"tls unauthenticated admits tls without identity", meshed(""), Authentication{&MeshTLS{Unauthenticated: true}}, true},
		{"tls unauthenticated admits tls with identity", meshed("a.b"), Authentication{&MeshTLS{Unauthenticated: true}}, true},
		{"tls unauthenticated refuses plaintext", identity.Peer{}, Authentication{&MeshTLS{Unauthenticated: true}}, false},
		{"identities refuse plaintext", identity.Peer{}, Authentication{&MeshTLS{Identities: []string{"a.b"}}}, false},
		{"unauthenticated admits plaintext", identity.Peer{}, Authentication{}, true},
		{"unauthenticated admits meshed", meshed("a.b"), Authentication{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := compileAuthz(&Authz{Meta: DefaultMeta("name"), Networks: everywhere, Authentication: tc.authn}, "authz")
			require.NoError(t, err)
			assert.Equal(t, tc.admitted, a.admits(ip, tc.peer))
		})
	}
}

// Networks: the client IP is in a net and in none of its excepts
// (linkerd2-proxy linkerd/app/inbound/src/policy.rs is_authorized;
// linkerd/proxy/server-policy/src/authz/network.rs).
func TestAdmitsNetwork(t *testing.T) {
	nets := []Network{
		{Net: netip.MustParsePrefix("10.0.0.0/8"), Except: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.3.4/32")}},
		{Net: netip.MustParsePrefix("fd00::/8")},
	}
	a, err := compileAuthz(&Authz{Networks: nets}, "authz")
	require.NoError(t, err)
	for ip, want := range map[string]bool{
		"10.0.0.1":    true,
		"10.1.2.3":    false, // except
		"10.2.3.4":    false, // except /32
		"10.2.3.5":    true,
		"11.0.0.1":    false,
		"192.168.0.1": false,
		"fd00::1":     true,
		"fe80::1":     false,
	} {
		assert.Equal(t, want, a.admits(netip.MustParseAddr(ip), identity.Peer{}), ip)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Server
		want string
	}{
		{"no networks", Server{Authorizations: []Authz{{}}}, "authorizations[0].networks: at least one network is required"},
		{"invalid net", Server{Authorizations: []Authz{{Networks: []Network{{}}}}}, "authorizations[0].networks[0].net: not a valid network"},
		{"except outside", Server{Authorizations: []Authz{{Networks: []Network{{Net: netip.MustParsePrefix("10.0.0.0/8"),
			Except: []netip.Prefix{netip.MustParsePrefix("11.0.0.0/16")}}}}}}, "authorizations[0].networks[0].except[0]: 11.0.0.0/16 is not inside 10.0.0.0/8"},
		{"except all", Server{Authorizations: []Authz{{Networks: []Network{{Net: netip.MustParsePrefix("10.0.0.0/8"),
			Except: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}}}}, "excludes all of"},
		{"meshTLS admits none", Server{Routes: []Route{{Authorizations: []Authz{{Networks: everywhere, Authentication: Authentication{&MeshTLS{}}}}}}},
			"routes[0].authorizations[0].authentication.meshTLS: admits no client"},
		{"bad suffix part", Server{Authorizations: []Authz{{Networks: everywhere, Authentication: Authentication{&MeshTLS{Suffixes: [][]string{{"a.b"}}}}}}},
			"authorizations[0].authentication.meshTLS.suffixes[0][0]"},
		{"bad regex", Server{Routes: []Route{{Rules: []Rule{{Matches: []policyMatch{regexMatch("(")}}}}}}, "routes[0].rules[0].matches[0].path"},
		{"override without rate", Server{RateLimit: &RateLimit{Overrides: []Override{{Identities: []string{"a"}}}}}, "rateLimit.overrides[0].rps: must be positive"},
		{"grpc rate limit", Server{Protocol: ProtocolGRPC, RateLimit: &RateLimit{Total: 1}}, "rateLimit: a grpc Server takes no rate limit"},
		{"negative concurrency", Server{MaxConcurrentRequests: -1}, "maxConcurrentRequests"},
		{"unknown protocol", Server{Protocol: 42}, "protocol: unknown protocol 42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(&tc.s)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The cases of linkerd2-proxy's check_rate_limits
// (linkerd/proxy/server-policy/src/local_rate_limit/tests.rs): total 35,
// per identity 5, overrides client-3 at 10 and client-4 at 15; tokens taken
// before a refusal are not returned; a second later every bucket is full
// again.
func TestCheckRateLimits(t *testing.T) {
	l, err := newLimiter(&RateLimit{Total: 35, Identity: 5, Overrides: []Override{
		{RPS: 10, Identities: []string{"client-3"}}, {RPS: 15, Identities: []string{"client-4"}}}})
	require.NoError(t, err)
	now := time.Unix(1000, 0)
	ok := func(id string) {
		t.Helper()
		s, _ := l.check(now, id)
		require.Equal(t, limitNone, s, "%s at %v", id, now)
	}
	refused := func(id string, scope limitScope, rps uint32) {
		t.Helper()
		s, r := l.check(now, id)
		require.Equal(t, scope, s, id)
		require.Equal(t, rps, r, id)
	}
	for range 5 {
		for range 5 {
			ok("client-1")
			ok("client-3")
			ok("client-4")
		}
		refused("client-1", limitIdentity, 5)
		for range 5 {
			ok("client-3")
			ok("client-4")
		}
		refused("client-3", limitOverride, 10)
		for range 5 {
			ok("client-4")
		}
		refused("client-4", limitOverride, 15)
		for range 2 {
			ok("client-2")
		}
		refused("client-2", limitTotal, 35)
		now = now.Add(time.Second)
	}
}

// linkerd2-proxy's from_proto (local_rate_limit/tests.rs): the identities
// of one override share its rate; and the clients without an identity
// share one per-identity bucket.
func TestRateLimitSharedBuckets(t *testing.T) {
	l, err := newLimiter(&RateLimit{Meta: DefaultMeta("ratelimit-1"), Total: 100, Identity: 20, Overrides: []Override{
		{RPS: 50, Identities: []string{"client-1", "client-2"}}, {RPS: 75, Identities: []string{"client-3", "client-4"}}}})
	require.NoError(t, err)
	assert.Equal(t, uint32(50), l.overrides["client-1"].rps)
	assert.Same(t, l.overrides["client-1"], l.overrides["client-2"])
	assert.Equal(t, uint32(75), l.overrides["client-4"].rps)
	assert.Same(t, l.overrides["client-3"], l.overrides["client-4"])

	now := time.Unix(1000, 0)
	for range 25 {
		s, _ := l.check(now, "client-1")
		require.Equal(t, limitNone, s)
		s, _ = l.check(now, "client-2")
		require.Equal(t, limitNone, s)
	}
	s, _ := l.check(now, "client-2")
	assert.Equal(t, limitOverride, s, "client-1 and client-2 share 50 rps")

	for range 20 {
		s, _ := l.check(now, "")
		require.Equal(t, limitNone, s)
	}
	s, _ = l.check(now, "")
	assert.Equal(t, limitIdentity, s, "identity-less clients share one bucket")
	s, _ = l.check(now, "client-9")
	assert.Equal(t, limitNone, s, "an identity has a bucket of its own")
}

type policyMatch = policy.HTTPRouteMatch

func regexMatch(re string) policy.HTTPRouteMatch {
	return policy.HTTPRouteMatch{Path: &policy.PathMatch{Kind: policy.PathRegex, Value: re}}
}

func TestMaxConcurrentRequestsFrom(t *testing.T) {
	for _, tc := range []struct {
		v       *string
		want    int
		wantErr bool
	}{
		{nil, 0, false},
		{ptr("100"), 100, false},
		{ptr(" 7 "), 7, false},
		{ptr("0"), 0, true},
		{ptr("-3"), 0, true},
		{ptr("many"), 0, true},
	} {
		ann := map[string]string{}
		if tc.v != nil {
			ann[AnnotationMaxConcurrentRequests] = *tc.v
		}
		n, err := MaxConcurrentRequestsFrom(ann)
		if tc.wantErr {
			assert.ErrorContains(t, err, `annotations["inmesh.io/max-concurrent-requests"]`)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.want, n)
	}
}

func ptr(s string) *string { return &s }

// The identity buckets are bounded: past the bound they start again, so a
// stream of distinct identities cannot grow the map without end.
func TestIdentityBucketsBounded(t *testing.T) {
	l, err := newLimiter(&RateLimit{Identity: 1})
	require.NoError(t, err)
	now := time.Unix(1000, 0)
	for i := range maxLimitedIdentities + 10 {
		s, _ := l.check(now, "id-"+strconv.Itoa(i))
		require.Equal(t, limitNone, s)
	}
	assert.LessOrEqual(t, len(l.byID), maxLimitedIdentities)
}
