package policy

import (
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// linkerdWhole is the reference: the leftmost-first match must span the
// whole value.
func linkerdWhole(re *regexp.Regexp, s string) bool {
	loc := re.FindStringIndex(s)
	return loc != nil && loc[0] == 0 && loc[1] == len(s)
}

func TestWholeRegexAgreesWithReference(t *testing.T) {
	patterns := []struct {
		pattern string
		exact   bool // compiled without the allocating confirmation
	}{
		{`/foo/.*`, true},
		{`/users/[0-9]+`, true},
		{`/api/v[0-9]+/users/[^/]+`, true},
		{`/[a-z]+/[0-9]{1,3}`, true},
		{`(?i)/Books`, true},
		{`/x?`, true},
		{`^/a$`, true},
		{`(/a)(/b)`, true},
		{`a|ab`, false},
		{`/a.*?`, false},
		{`(a*)(ab)?`, false},
		{`[a-z]+a`, false},
		{`/x?/`, false},
		{`(ab)+`, false},
		{`[0-9]*[0-9]`, false},
		{`/(foo|foobar)`, false},
		{`.*`, true},
		{``, true},
	}
	inputs := []string{"", "/", "a", "ab", "aab", "aaab", "/foo/", "/foo/bar", "/users/12", "/users/", "/api/v2/users/x", "/api/v2/users/x/y",
		"/ab/12", "/ab/1234", "/books", "/BOOKS", "/x", "/x/", "//", "/a", "/a/b", "/abc", "abab", "123", "/foobar", "/foo"}
	for _, p := range patterns {
		w, err := compileWholeRegex(p.pattern)
		require.NoError(t, err, p.pattern)
		assert.Equal(t, p.exact, w.exact, "%q unambiguous", p.pattern)
		ref := regexp.MustCompile(p.pattern)
		for _, in := range inputs {
			want := linkerdWhole(ref, in)
			assert.Equal(t, want, w.matchString(in), "%q on %q", p.pattern, in)
			assert.Equal(t, want, w.matchBytes([]byte(in)), "%q on %q (bytes)", p.pattern, in)
		}
		assert.Equal(t, p.pattern, w.String())
	}
	_, err := compileWholeRegex(`a)|(b`)
	assert.Error(t, err, "a pattern that only parses inside the group is refused")
}

func FuzzWholeRegex(f *testing.F) {
	for _, s := range [][2]string{{`a|ab`, "ab"}, {`[0-9]+/[a-z]+`, "12/ab"}, {`(a*)(ab)?`, "aab"}, {`/foo/.*`, "/foo/x"}, {`x{2,3}y?`, "xxxy"}, {`(?i)k`, "\u212a"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, in string) {
		if len(pattern) > 64 {
			return
		}
		ref, err := regexp.Compile(pattern)
		if err != nil {
			return
		}
		w, err := compileWholeRegex(pattern)
		if err != nil {
			t.Fatalf("%q compiles alone but not whole: %v", pattern, err)
		}
		if got, want := w.matchString(in), linkerdWhole(ref, in); got != want {
			t.Fatalf("%q on %q: got %v, want %v (unambiguous %v)", pattern, in, got, want, w.exact)
		}
	})
}

// FuzzCompileSelect compiles small route tables from fuzzed patterns and
// checks selection against one-route tables: the winner's match is the best
// of all routes' own matches, ties go to the earliest, regexes agree with
// the reference, and nothing panics.
func FuzzCompileSelect(f *testing.F) {
	f.Add(uint8(0), "/foo", uint8(1), "/foo/bar", "*.example.com", "/foo/bar", "a.example.com:80", "q=1")
	f.Add(uint8(2), "/foo/.*", uint8(0), "/foo/", "", "/foo/x", "", "")
	f.Add(uint8(2), "a|ab", uint8(2), "/(x|xy)", "example.com.", "/xy", "EXAMPLE.com", "a=%41")
	f.Add(uint8(0), "/", uint8(0), "//", "*.", "/", "x.", "+")
	f.Fuzz(func(t *testing.T, k1 uint8, p1 string, k2 uint8, p2 string, host, path, reqHost, query string) {
		routes := []HTTPRoute{
			{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: &PathMatch{Kind: PathKind(k1 % 3), Value: p1}}}}}},
			{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: &PathMatch{Kind: PathKind(k2 % 3), Value: p2}, Method: "GET"}}}}},
			{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{QueryParams: []QueryParamMatch{{Name: "q", Value: query}}}}}, {}}},
		}
		if host != "" {
			routes[0].Hosts = []HostMatch{ParseHostMatch(host)}
		}
		opts := Options{MaxRegexLen: 64}
		table, err := CompileHTTP(Metadata{}, HTTPProtocol{Routes: routes}, opts, "http1")
		if err != nil {
			return
		}
		if !utf8.ValidString(path) {
			return
		}
		req := &http.Request{Method: "GET", Host: reqHost, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
		got, m := table.Select(req)
		require.NotNil(t, got, "route 2 rule 1 matches everything")
		again, m2 := table.Select(req)
		require.Same(t, got, again)
		require.Equal(t, m, m2)

		escaped := req.URL.EscapedPath()
		if escaped == "" {
			escaped = "/"
		}
		best := -1
		var bestMatch Match
		for i := range routes {
			one, err := CompileHTTP(Metadata{}, HTTPProtocol{Routes: routes[i : i+1]}, opts, "http1")
			require.NoError(t, err)
			r, om := one.Select(req)
			if rm := routes[i].Rules[0].Matches; len(rm) > 0 && rm[0].Path != nil && rm[0].Path.Kind == PathRegex && (len(routes[i].Hosts) == 0 || om.Host != HostAny) {
				want := linkerdWhole(regexp.MustCompile(rm[0].Path.Value), escaped)
				require.Equal(t, want, r != nil, "regex %q on %q", rm[0].Path.Value, escaped)
			}
			if r == nil {
				continue
			}
			om.Route = i
			if best < 0 || om.Compare(bestMatch) > 0 {
				best, bestMatch = i, om
			}
		}
		require.Equal(t, best, m.Route, "winner %v, best single %v", m, bestMatch)
		require.Equal(t, 0, m.Compare(bestMatch))
	})
}

// A policy update that repeats a pattern reuses its compiled form, and a
// bad pattern is refused every time.
func TestWholeRegexKeptPerPattern(t *testing.T) {
	a, err := compileWholeRegex(`/books/[0-9]+`)
	require.NoError(t, err)
	b, err := compileWholeRegex(`/books/[0-9]+`)
	require.NoError(t, err)
	assert.Same(t, a.full, b.full)
	assert.True(t, b.matchString("/books/12"))
	for range 2 {
		_, err := compileWholeRegex(`/books/(`)
		assert.Error(t, err)
	}
}

// A bad path regex is reported by what the user wrote, not by the anchored
// pattern built from it.
func TestBadRegexNamesTheUsersPattern(t *testing.T) {
	_, err := Compile(&Policy{HTTP1: HTTPProtocol{Routes: []HTTPRoute{{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{
		{Path: &PathMatch{Kind: PathRegex, Value: "a(b"}}}}}}}}}, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "http1.routes[0].rules[0].matches[0].path.regex: bad regex")
	assert.NotContains(t, err.Error(), "^(?:")
}
