package profiles

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

func TestCompileErrors(t *testing.T) {
	deep := RequestMatch(Method("GET"))
	for range 40 {
		deep = MatchNot{deep}
	}
	many := make([]Route, 257)
	for i := range many {
		many[i] = Route{Condition: Method("GET")}
	}
	tests := []struct {
		name string
		p    *Profile
		want string
	}{
		{"nil condition", &Profile{Routes: []Route{{Condition: Method("GET")}, {}}}, "routes[1].condition: required"},
		{"bad regex", &Profile{Routes: []Route{{Condition: MatchAll{Method("GET"), PathRegex("/a(")}}}}, "routes[0].condition.all[1].pathRegex: bad regex"},
		{"long regex", &Profile{Routes: []Route{{Condition: PathRegex(strings.Repeat("a", 1025))}}}, "longer than the limit of 1024"},
		{"repeat over 1000", &Profile{Routes: []Route{{Condition: PathRegex("a{1001}")}}}, "bad regex"},
		{"bad method", &Profile{Routes: []Route{{Condition: MatchAny{Method("G T")}}}}, `routes[0].condition.any[0].method: "G T" is not an HTTP method`},
		{"nil inside", &Profile{Routes: []Route{{Condition: MatchNot{}}}}, "routes[0].condition.not: null condition"},
		{"too deep", &Profile{Routes: []Route{{Condition: deep}}}, "nested deeper than 32"},
		{"too many routes", &Profile{Routes: many}, "257 routes is more than the limit of 256"},
		{"negative timeout", &Profile{Routes: []Route{{Condition: Method("GET"), Timeout: -time.Second}}}, "routes[0].timeout: negative"},
		{"class without condition", &Profile{Routes: []Route{{Condition: Method("GET"), ResponseClasses: []ResponseClass{{}}}}}, "routes[0].responseClasses[0].condition: required"},
		{"empty response all", &Profile{Routes: []Route{{Condition: Method("GET"), ResponseClasses: []ResponseClass{{Condition: ResponseAll{}}}}}}, "responseClasses[0].condition.all: empty"},
		{"status zero", &Profile{Routes: []Route{{Condition: Method("GET"), ResponseClasses: []ResponseClass{{Condition: ResponseNot{StatusRange{}}}}}}}, "condition.not.status: min and max are both unset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, err := Compile(tt.p, Options{})
			assert.ErrorContains(t, err, tt.want)
			assert.Nil(t, table)
		})
	}
	table, err := Compile(&Profile{Routes: many}, Options{MaxRoutes: 300})
	require.NoError(t, err, "an option raises the limit")
	assert.Len(t, table.Routes(), 257)
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
			if table != nil {
				t.Fatal("a table with an error")
			}
			return
		}
		got := table.SelectPath(method, path)
		// pattern or not pattern: the route matches exactly when the method does.
		if got.IsDefault() {
			t.Fatalf("method %q pattern %q path %q: no match", method, pattern, path)
		}
		if table.SelectPath(method+"X", path) != DefaultRoute() {
			t.Fatal("matched another method")
		}
	})
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
	_, err := Compile(&Profile{Routes: []Route{{Condition: PathRegex("/books/(["), Labels: map[string]string{"route": "x"}}}}, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "routes[0].condition.pathRegex: bad regex")
	assert.Contains(t, err.Error(), "`[`")
	assert.NotContains(t, err.Error(), "^(?:")
	assert.NotContains(t, err.Error(), ")$")
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
