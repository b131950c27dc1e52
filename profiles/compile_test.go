package profiles

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/hedge"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http/httpguts"
)

func TestRequestMatching(t *testing.T) {
	tests := []struct {
		name   string
		cond   RequestMatch
		method string
		path   string
		want   bool
	}{
		{"path full match", PathRegex("/api"), "GET", "/api", true},
		{"path is anchored at the end", PathRegex("/api"), "GET", "/api/v1", false},
		{"path is anchored at the start", PathRegex("api"), "GET", "/api", false},
		{"wildcard", PathRegex("/api/.*"), "GET", "/api/v1", true},
		{"explicit anchors", PathRegex("^/api/.*$"), "GET", "/api/v1", true},
		// linkerd2-proxy (linkerd/service-profiles/src/proto.rs,
		// convert_req_match) anchors without a group: "/a|/b" is
		// "^/a|/b$", a path that starts with /a or ends with /b.
		{"alternation: either end", PathRegex("/a|/b"), "GET", "/b", true},
		{"alternation: anchored at the start only", PathRegex("/a|/b"), "GET", "/ab", true},
		{"alternation: anchored at the end only", PathRegex("/a|/b"), "GET", "/x/b", true},
		{"alternation: neither end", PathRegex("/a|/b"), "GET", "/x", false},
		{"alternation grouped by the user", PathRegex("(/a|/b)"), "GET", "/ab", false},
		{"leading anchor kept, trailing added", PathRegex("^/api"), "GET", "/api/v1", false},
		{"trailing anchor kept, leading added", PathRegex("/v1$"), "GET", "/api/v1", false},
		{"space trimmed", PathRegex("  /x  "), "GET", "/x", true},
		{"case-insensitive flag", PathRegex("(?i)/API/v1"), "GET", "/api/V1", true},
		{"literal prefix then class", PathRegex("/api/[0-9]+"), "GET", "/api/", false},
		{"escaped path", PathRegex(`/books/[^/]+`), "GET", "/books/a%2Fb", true},
		{"method", Method("GET"), "GET", "/", true},
		{"method is case-sensitive", Method("GET"), "get", "/", false},
		{"unregistered method", Method("PURGE"), "PURGE", "/", true},
		{"empty all matches everything", MatchAll{}, "DELETE", "/x", true},
		{"empty any matches nothing", MatchAny{}, "GET", "/", false},
		{"all", MatchAll{Method("POST"), PathRegex("/x")}, "POST", "/x", true},
		{"all fails on one", MatchAll{Method("POST"), PathRegex("/x")}, "GET", "/x", false},
		{"any", MatchAny{Method("POST"), PathRegex("/x")}, "GET", "/x", true},
		{"not", MatchNot{Method("GET")}, "POST", "/", true},
		{"not not", MatchNot{MatchNot{Method("GET")}}, "GET", "/", true},
		{"nested", MatchAll{MatchAny{Method("GET"), Method("HEAD")}, MatchNot{PathRegex("/admin/.*")}}, "HEAD", "/admin/x", false},
		// As the request is sent, as linkerd2-proxy's RequestMatch::is_match
		// reads it (linkerd/service-profiles/src/http.rs: req.method(),
		// req.uri().path()): net/http sends an empty method as GET and an
		// empty path as "/".
		{"empty method is GET", Method("GET"), "", "/", true},
		{"empty method is not POST", Method("POST"), "", "/", false},
		{"empty path is /", PathRegex("/"), "GET", "", true},
		{"empty path is / for a catch-all", PathRegex("/.*"), "GET", "", true},
		{"empty path and method", MatchAll{Method("GET"), PathRegex("/")}, "", "", true},
		{"empty path is / only once sent", PathRegex(""), "GET", "", false},
		{"CONNECT has no path", PathRegex("/"), "CONNECT", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, err := Compile(&Profile{Routes: []Route{{Condition: tt.cond}}}, Options{})
			require.NoError(t, err)
			got := table.SelectPath(tt.method, tt.path)
			assert.Equal(t, tt.want, !got.IsDefault())
		})
	}
}

func TestFirstMatchWins(t *testing.T) {
	table, err := Compile(&Profile{Routes: []Route{
		{Condition: PathRegex("/books/[^/]+"), Labels: map[string]string{"route": "one"}},
		{Condition: PathRegex("/books/.*"), Labels: map[string]string{"route": "two"}},
		{Condition: MatchAll{}, Labels: map[string]string{"route": "rest"}},
	}}, Options{})
	require.NoError(t, err)
	assert.Equal(t, "one", table.SelectPath("GET", "/books/1").Labels["route"])
	assert.Equal(t, "two", table.SelectPath("GET", "/books/1/reviews").Labels["route"])
	assert.Equal(t, "rest", table.SelectPath("GET", "/").Labels["route"])
	assert.Equal(t, 2, table.SelectPath("GET", "/").Index)
	var nilTable *Table
	assert.Same(t, DefaultRoute(), nilTable.SelectPath("GET", "/"))
}

// A profile of more routes than the bound is the one thing Compile
// refuses whole.
func TestCompileRefusesTooManyRoutes(t *testing.T) {
	many := make([]Route, 257)
	for i := range many {
		many[i] = Route{Condition: Method("GET")}
	}
	table, err := Compile(&Profile{Routes: many}, Options{})
	assert.ErrorContains(t, err, "257 routes is more than the limit of 256")
	assert.Nil(t, table)
	table, err = Compile(&Profile{Routes: many}, Options{MaxRoutes: 300})
	require.NoError(t, err, "an option raises the limit")
	assert.Len(t, table.Routes(), 257)
}

// A part of a profile that does not compile is left out and the rest
// applies, as linkerd2-proxy converts a profile
// (linkerd/service-profiles/src/proto.rs, named in each row): the route,
// the condition of an all or an any, the response class, the condition of
// its all or any, the timeout or the hedge that holds it. Each row's
// profile ends with the catch-all route "rest".
func TestCompileLeavesOutWhatDoesNotCompile(t *testing.T) {
	deep := RequestMatch(Method("GET"))
	for range 40 {
		deep = MatchNot{deep}
	}
	named := func(name string, cond RequestMatch) Route {
		return Route{Condition: cond, Labels: map[string]string{"route": name}}
	}
	classes := func(cs ...ResponseClass) Route {
		r := named("r", Method("GET"))
		r.ResponseClasses = cs
		return r
	}
	failing := func(m ResponseMatch) ResponseClass { return ResponseClass{Condition: m, IsFailure: true} }
	fiveXX := failing(StatusRange{Min: 500, Max: 599})
	type probe struct{ method, path, route string }
	tests := []struct {
		name    string
		route   Route
		dropped []string // fields, in order
		why     string   // in the first one's error
		probes  []probe  // the route a request takes
		classes int      // response classes kept, of the first route when it stays
	}{
		{
			name:  "convert_route: a route whose condition does not compile",
			route: named("typo", PathRegex("/books/(")), dropped: []string{"routes[0]"}, why: "routes[0].condition.pathRegex: bad regex",
			probes: []probe{{"GET", "/books/(", "rest"}},
		},
		{
			name:  "convert_route: a route without a condition",
			route: Route{Labels: map[string]string{"route": "none"}}, dropped: []string{"routes[0]"}, why: "routes[0].condition: required",
		},
		{
			name:  "convert_req_match All: a condition is dropped, the all matches by the others",
			route: named("typo", MatchAll{Method("GET"), PathRegex("/books/(")}), dropped: []string{"routes[0].condition.all[1]"}, why: "routes[0].condition.all[1].pathRegex: bad regex",
			probes: []probe{{"GET", "/anything", "typo"}, {"POST", "/books/1", "rest"}},
		},
		{
			name:  "convert_req_match All: every condition dropped matches everything",
			route: named("all", MatchAll{Method("G T")}), dropped: []string{"routes[0].condition.all[0]"}, why: `routes[0].condition.all[0].method: "G T" is not an HTTP method`,
			probes: []probe{{"DELETE", "/x", "all"}},
		},
		{
			name:  "convert_req_match Any: a condition is dropped, the any matches by the others",
			route: named("any", MatchAny{PathRegex("(/a"), PathRegex("/b")}), dropped: []string{"routes[0].condition.any[0]"}, why: "bad regex",
			probes: []probe{{"GET", "/b", "any"}, {"GET", "/a", "rest"}},
		},
		{
			name:  "convert_req_match Any: every condition dropped matches nothing",
			route: named("any", MatchAny{Method("G T")}), dropped: []string{"routes[0].condition.any[0]"}, why: "is not an HTTP method",
			probes: []probe{{"GET", "/", "rest"}},
		},
		{
			name:  "convert_req_match Not: a not of a condition that does not compile does not compile",
			route: named("not", MatchAll{Method("GET"), MatchNot{PathRegex("(")}}), dropped: []string{"routes[0].condition.all[1]"}, why: "routes[0].condition.all[1].not.pathRegex: bad regex",
			probes: []probe{{"GET", "/x", "not"}, {"POST", "/x", "rest"}},
		},
		{
			name:  "convert_req_match Not: at the top it drops the route",
			route: named("not", MatchNot{PathRegex("(")}), dropped: []string{"routes[0]"}, why: "routes[0].condition.not.pathRegex: bad regex",
			probes: []probe{{"GET", "/x", "rest"}},
		},
		{
			name:  "a match with no variant",
			route: named("nil", MatchNot{}), dropped: []string{"routes[0]"}, why: "routes[0].condition.not: null condition",
		},
		{
			name:  "a regex longer than the bound",
			route: named("long", PathRegex(strings.Repeat("a", 1025))), dropped: []string{"routes[0]"}, why: "longer than the limit of 1024",
		},
		{
			name:  "a repeat over 1000",
			route: named("repeat", PathRegex("a{1001}")), dropped: []string{"routes[0]"}, why: "bad regex",
		},
		{
			name:  "a condition nested deeper than the bound",
			route: named("deep", deep), dropped: []string{"routes[0]"}, why: "nested deeper than 32",
		},
		{
			name: "set_route_timeout: a negative timeout is only warned about",
			route: func() Route {
				r := named("t", Method("GET"))
				r.Timeout = -time.Second
				return r
			}(),
			dropped: []string{"routes[0].timeout"}, why: "routes[0].timeout: negative duration -1s",
			probes: []probe{{"GET", "/", "t"}},
		},
		{
			name: "an invalid hedge: the route does not hedge",
			route: func() Route {
				r := named("h", Method("GET"))
				r.Hedge = &hedge.Policy{Percentile: 100}
				return r
			}(),
			dropped: []string{"routes[0].hedge"}, why: "routes[0].hedge.percentile",
			probes: []probe{{"GET", "/", "h"}},
		},
		{
			name:  "convert_rsp_class: a class without a condition",
			route: classes(ResponseClass{}, fiveXX), dropped: []string{"routes[0].responseClasses[0]"}, why: "routes[0].responseClasses[0].condition: required",
			classes: 1,
		},
		{
			name:  "convert_rsp_match Status: status {}",
			route: classes(failing(StatusRange{}), fiveXX), dropped: []string{"routes[0].responseClasses[0]"}, why: "min and max are both unset",
			classes: 1,
		},
		{
			name:  "convert_rsp_match Status: a bound that is not a status code",
			route: classes(failing(StatusRange{Min: 500, Max: 1000}), fiveXX), dropped: []string{"routes[0].responseClasses[0]"}, why: "outside the status codes 100-999",
			classes: 1,
		},
		{
			name:  "convert_rsp_match All: all: []",
			route: classes(failing(ResponseAll{}), fiveXX), dropped: []string{"routes[0].responseClasses[0]"}, why: "routes[0].responseClasses[0].condition.all: empty",
			classes: 1,
		},
		{
			name:  "convert_rsp_match All: left empty by a dropped condition",
			route: classes(failing(ResponseAll{StatusRange{}}), fiveXX), dropped: []string{"routes[0].responseClasses[0].condition.all[0]", "routes[0].responseClasses[0]"}, why: "both unset",
			classes: 1,
		},
		{
			name:  "convert_rsp_match Any: a condition is dropped, the any matches by the others",
			route: classes(failing(ResponseAny{StatusRange{}, StatusRange{Min: 500, Max: 599}})), dropped: []string{"routes[0].responseClasses[0].condition.any[0]"}, why: "both unset",
			classes: 1,
		},
		{
			name:  "convert_rsp_match Not: a not of status {}",
			route: classes(failing(ResponseNot{StatusRange{}}), fiveXX), dropped: []string{"routes[0].responseClasses[0]"}, why: "routes[0].responseClasses[0].condition.not.status: min and max are both unset",
			classes: 1,
		},
		{
			name:  "convert_rsp_match Status: a reversed range converts",
			route: classes(failing(StatusRange{Min: 599, Max: 500})), classes: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Profile{Routes: []Route{tt.route, {Condition: MatchAll{}, Labels: map[string]string{"route": "rest"}}}}
			table, err := Compile(p, Options{})
			require.NoError(t, err)
			var fields []string
			for _, d := range table.Dropped() {
				fields = append(fields, d.Field)
				assert.Equal(t, tt.route.Labels["route"], d.Route, "the route is named")
			}
			assert.Equal(t, tt.dropped, fields)
			if tt.why != "" {
				require.NotEmpty(t, table.Dropped())
				assert.ErrorContains(t, table.Dropped()[0].Err, tt.why)
			}
			assert.Equal(t, "rest", table.Routes()[len(table.Routes())-1].Labels["route"], "the rest of the profile applies")
			if len(tt.dropped) > 0 && tt.dropped[0] == "routes[0]" {
				assert.Len(t, table.Routes(), 1, "the route is dropped")
			} else {
				require.Len(t, table.Routes(), 2, "the route stays")
				first := table.Routes()[0]
				assert.Equal(t, 0, first.Index)
				assert.GreaterOrEqual(t, first.Timeout, time.Duration(0))
				if first.Hedge != nil {
					assert.NoError(t, first.Hedge.Validate())
				}
				assert.Len(t, first.ResponseClassifier().Classes, tt.classes)
			}
			for _, pr := range tt.probes {
				assert.Equal(t, pr.route, table.SelectPath(pr.method, pr.path).Labels["route"], "%s %s", pr.method, pr.path)
			}
		})
	}
}

// What the classes kept of a partly dropped profile classify, and what a
// reversed range does: as linkerd2-proxy's ResponseMatch::is_match, min <=
// status <= max, so it matches nothing and its not everything.
func TestResponseClassesLeftAfterDrops(t *testing.T) {
	table, err := Compile(&Profile{Routes: []Route{{Condition: MatchAll{}, ResponseClasses: []ResponseClass{
		{Condition: StatusRange{}, IsFailure: false},                                    // dropped: 500 is not a success by it
		{Condition: ResponseAny{ResponseAll{}, StatusRange{Min: 418}}, IsFailure: true}, // the any keeps 418
		{Condition: StatusRange{Min: 599, Max: 500}, IsFailure: true},                   // matches nothing
		{Condition: ResponseNot{StatusRange{Min: 299, Max: 200}}, IsFailure: false},     // matches everything
	}}}}, Options{})
	require.NoError(t, err)
	cl := table.Routes()[0].ResponseClassifier()
	for status, want := range map[int]bool{418: true, 500: false, 550: false, 200: false} {
		c, final := cl.Head(false, status, nil)
		assert.True(t, final, "%d", status)
		assert.Equal(t, want, c.Failure, "%d", status)
	}
	var fields []string
	for _, d := range table.Dropped() {
		fields = append(fields, d.Field)
	}
	assert.Equal(t, []string{"routes[0].responseClasses[0]", "routes[0].responseClasses[1].condition.any[0]"}, fields)
}

func TestResponseClassesCompile(t *testing.T) {
	table, err := Compile(&Profile{Routes: []Route{{Condition: MatchAll{}, ResponseClasses: []ResponseClass{
		{Condition: StatusRange{Min: 0, Max: 404}, IsFailure: true}, // a zero bound is the other value
		{Condition: ResponseAll{StatusRange{Min: 500, Max: 599}, ResponseNot{StatusRange{Min: 503}}}, IsFailure: true},
		{Condition: ResponseAny{StatusRange{Min: 200, Max: 299}, StatusRange{Min: 302}}, IsFailure: false},
	}}}}, Options{})
	require.NoError(t, err)
	cl := table.Routes()[0].ResponseClassifier()
	for status, want := range map[int]bool{404: true, 403: false, 500: true, 503: false, 302: false, 204: false} {
		c, final := cl.Head(false, status, nil)
		if status == 503 || status == 403 {
			// No class matched: the default rules decide (5xx fails).
			assert.False(t, final, "%d", status)
			assert.Equal(t, status >= 500, c.Failure, "%d", status)
			continue
		}
		assert.True(t, final, "%d", status)
		assert.Equal(t, want, c.Failure, "%d", status)
	}
}

func TestInvalidBudgetDisablesRetries(t *testing.T) {
	table, err := Compile(&Profile{RetryBudget: &RetryBudget{RetryRatio: 0.1, TTL: 1000 * time.Second}}, Options{})
	require.NoError(t, err)
	assert.Nil(t, table.RetryBudget())
	assert.ErrorContains(t, table.BudgetErr(), "ttl")
}

func BenchmarkSelect(b *testing.B) {
	for _, n := range []int{1, 20, 200} {
		var routes []Route
		for i := range n {
			var cond RequestMatch
			switch i % 3 {
			case 0:
				cond = MatchAll{Method("GET"), PathRegex("/api/v1/r" + strconv.Itoa(i) + "/[^/]+")}
			case 1:
				cond = MatchAll{Method("POST"), PathRegex("/api/v1/r" + strconv.Itoa(i))}
			default:
				cond = MatchAny{Method("DELETE"), PathRegex("/admin/r" + strconv.Itoa(i) + "/.*")}
			}
			routes = append(routes, Route{Condition: cond, Labels: map[string]string{"route": strconv.Itoa(i)}})
		}
		table, err := Compile(&Profile{Routes: routes}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		// The last route matches: every route is tried.
		last := n - 1
		method, path := "GET", "/api/v1/r"+strconv.Itoa(last)+"/42"
		switch last % 3 {
		case 1:
			method, path = "POST", "/api/v1/r"+strconv.Itoa(last)
		case 2:
			method, path = "DELETE", "/x"
		}
		b.Run(strconv.Itoa(n)+"routes", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if table.SelectPath(method, path).Index != last {
					b.Fatal("wrong route")
				}
			}
		})
	}
}

func TestSelectAllocatesNothing(t *testing.T) {
	table, err := Compile(&Profile{Routes: []Route{
		{Condition: MatchAll{Method("GET"), PathRegex("/books/[^/]+")}},
		{Condition: MatchAny{Method("POST"), PathRegex("/x/.*")}},
	}}, Options{})
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, func() { table.SelectPath("GET", "/books/123") })
	assert.Zero(t, allocs)
}

func FuzzCompileMatch(f *testing.F) {
	for _, s := range [][3]string{{"/books/[^/]+", "GET", "/books/1"}, {"a|b", "POST", "b"}, {"(", "GET", "/"}, {"x{1001}", "", ""}, {"^$", "G T", ""}, {`\p{L}+`, "PURGE", "/é"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, pattern, method, path string) {
		p := &Profile{Routes: []Route{{Condition: MatchAll{Method(method), MatchAny{PathRegex(pattern), MatchNot{PathRegex(pattern)}}}}}}
		table, err := Compile(p, Options{})
		if err != nil {
			t.Fatalf("one route: %v", err)
		}
		// A method that does not compile is dropped from the all; a
		// pattern that does not is dropped from the any and its not,
		// which leaves the any empty: it matches nothing.
		methodOK := method != "" && httpguts.ValidHeaderFieldName(method)
		patternOK := true
		for _, d := range table.Dropped() {
			if strings.HasSuffix(d.Field, ".any[0]") || strings.HasSuffix(d.Field, ".any[1]") {
				patternOK = false
			}
		}
		if len(table.Dropped()) != b2i(!methodOK)+2*b2i(!patternOK) {
			t.Fatalf("method %q pattern %q: dropped %v", method, pattern, table.Dropped())
		}
		got := table.SelectPath(method, path)
		if got.IsDefault() == patternOK {
			// pattern or not pattern: the route matches exactly when the method does.
			t.Fatalf("method %q pattern %q path %q: matched %v", method, pattern, path, !got.IsDefault())
		}
		if patternOK && methodOK && table.SelectPath(method+"X", path) != DefaultRoute() {
			t.Fatal("matched another method")
		}
	})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Compiling a profile again, as every update does, reuses the compiled
// path matchers of the patterns it repeats; the tables stay apart.
func TestCompileReusesPathMatchers(t *testing.T) {
	p := booksProfile(20)
	first, err := Compile(p, Options{})
	require.NoError(t, err)
	second, err := Compile(p, Options{})
	require.NoError(t, err)
	require.NotSame(t, first, second)
	for i, r := range first.Routes() {
		a := r.match.(allMatcher)[1].(pathMatcher)
		b := second.Routes()[i].match.(allMatcher)[1].(pathMatcher)
		assert.Same(t, a.re, b.re, "route %d compiled its regex again", i)
	}
	assert.Equal(t, 19, second.SelectPath("GET", "/books/7").Index)
}

// A bad path regex is reported by what the user wrote, not by the anchored
// pattern built from it.
func TestBadRegexNamesTheUsersPattern(t *testing.T) {
	table, err := Compile(&Profile{Routes: []Route{{Condition: PathRegex("/books/(["), Labels: map[string]string{"route": "x"}}}}, Options{})
	require.NoError(t, err)
	require.Len(t, table.Dropped(), 1)
	d := table.Dropped()[0]
	assert.Equal(t, Dropped{Route: "x", Field: "routes[0]", Err: d.Err}, d)
	msg := d.String()
	assert.Contains(t, msg, `routes[0] (route "x"): routes[0].condition.pathRegex: bad regex`)
	assert.Contains(t, msg, "`[`")
	assert.NotContains(t, msg, "^(?:")
	assert.NotContains(t, msg, ")$")
}

// booksProfile is a profile of n routes; /books/{id} is the last of them.
func booksProfile(n int) *Profile {
	budget := DefaultRetryBudget()
	p := &Profile{RetryBudget: &budget}
	for i := range n - 1 {
		p.Routes = append(p.Routes, Route{
			Condition: MatchAll{Method("POST"), PathRegex(fmt.Sprintf("/other/r%d/[^/]+", i))},
			Labels:    map[string]string{"route": fmt.Sprintf("POST /other/r%d/{id}", i)},
		})
	}
	p.Routes = append(p.Routes, Route{
		Condition:       MatchAll{Method("GET"), PathRegex("/books/[^/]+")},
		Labels:          map[string]string{"route": "GET /books/{id}"},
		ResponseClasses: []ResponseClass{{Condition: StatusRange{Min: 500, Max: 599}, IsFailure: true}},
	})
	return p
}
