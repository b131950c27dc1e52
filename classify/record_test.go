package classify

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
)

// A flood of distinct Hosts, far past the bound, keeps the authority label
// within the bound plus other, and the cached targets bounded, although the
// registry keeps evicting.
func TestAuthorityLabelsBoundedUnderAFlood(t *testing.T) {
	m := testutil.NewMetrics(t)
	h := NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		WithMeterProvider(m.Provider), WithMaxAuthorities(10))
	serve := func(host string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	for i := range 20000 {
		serve(fmt.Sprintf("10.%d.%d.%d:%d", i>>16&255, i>>8&255, i&255, 1+i%7))
	}
	serve("10.0.0.0:1") // the first authority keeps its label after eviction
	lines := m.Lines(t, "request_total")
	assert.Len(t, lines, 11, "ten authorities and other")
	assert.Equal(t, "19990", m.Value(t, "request_total", `authority="other"`))
	assert.Equal(t, "2", m.Value(t, "request_total", `authority="10.0.0.0:1"`))
	rec := h.(*handler).rec
	assert.LessOrEqual(t, rec.reg.Len(), 10)
	for _, l := range lines {
		assert.False(t, strings.Contains(l, "10.0.0.99"), l)
	}
}

// Past the bound of authorities, the labels of the requests counted under
// other are bounded too: a client sending to ever new names, each with its
// own endpoint labels (dst_service is the name), gets at most the kept
// label sets of other and other without labels, and every request counted.
// Before, each name past the bound got series of its own under other.
func TestOtherLabelsBounded(t *testing.T) {
	m := testutil.NewMetrics(t)
	rec := newRecorder(newConfig([]Option{WithMeterProvider(m.Provider), WithMaxAuthorities(2)}), "outbound")
	const names = 200
	for i := range names {
		name := fmt.Sprintf("svc-%d.ns.svc.cluster.local", i)
		l := NewLabels("dst_", map[string]string{"service": fmt.Sprintf("svc-%d", i), "namespace": "ns"})
		rec.target(name+":80", l).Request(t.Context())
	}
	lines := m.Lines(t, "request_total", `authority="other"`)
	assert.Len(t, lines, maxTargetsPerAuthority, "the kept label sets of other, its set without labels among them")
	assert.Len(t, m.Lines(t, "request_total"), len(lines)+2, "two authorities labelled")
	assert.Equal(t, fmt.Sprint(names-2-(maxTargetsPerAuthority-1)), m.Value(t, "request_total", `authority="other"`, `direction="outbound"}`))
	assert.Empty(t, m.Lines(t, "request_total", `dst_service="svc-199"`))
}

func TestAuthorityNormalised(t *testing.T) {
	m := testutil.NewMetrics(t)
	h := NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), WithMeterProvider(m.Provider))
	for _, host := range []string{"Books.Default", "books.default:80", "BOOKS.default.:80"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	assert.Equal(t, "3", m.Value(t, "request_total", `authority="books.default:80"`))
}

func TestIdleTargetsAreReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder(newConfig([]Option{WithIdleTimeout(time.Minute)}), "inbound")
		first := rec.target("a:1", nil)
		assert.Same(t, first, rec.target("a:1", nil))
		// Misses sweep: the first sees a used since the last sweep, the
		// next one, an idle timeout later, releases it.
		time.Sleep(time.Minute)
		rec.target("b:1", nil)
		assert.Equal(t, 2, rec.reg.Len())
		time.Sleep(30 * time.Second)
		rec.target("b:1", nil)
		time.Sleep(30 * time.Second)
		rec.target("c:1", nil)
		assert.Nil(t, rec.reg.Cached("a:1"), "a is released")
		assert.NotNil(t, rec.reg.Cached("b:1"), "b was used within the idle timeout")
		assert.NotSame(t, first, rec.target("a:1", nil), "rebuilt after release")
	})
}

func TestTransportRecordAllocatesNothing(t *testing.T) {
	rec := newRecorder(newConfig(nil), "outbound")
	labels := NewLabels("dst_", map[string]string{"pod": "books-0"})
	rec.target("books:7000", labels)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { rec.target("books:7000", labels) }))
	rec.target("", nil)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { rec.target("", nil) }))
}

// With WithAuthorities, only the named authorities (in any spelling that
// normalises to one of them) are label values; the Hosts clients choose
// otherwise are counted under other and take none of the bound, so the
// server's own authority keeps its series however many Hosts came first.
func TestOnlyNamedAuthoritiesLabelled(t *testing.T) {
	m := testutil.NewMetrics(t)
	const local = "books.default.svc.cluster.local:7000"
	h := NewHandler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		WithMeterProvider(m.Provider), WithMaxAuthorities(4), WithAuthorities(local))
	for i := range 10 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = fmt.Sprintf("junk%d.attacker.example:80", i)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	for _, host := range []string{local, "Books.Default.svc.cluster.local.:7000"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = host
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	assert.Equal(t, "10", m.Value(t, "request_total", `authority="other"`))
	assert.Equal(t, "2", m.Value(t, "request_total", `authority="`+local+`"`))
	assert.Len(t, m.Lines(t, "request_total"), 2, "no other label values: %v", m.Lines(t, "request_total"))
}

// Recording under WithAuthorities allocates nothing, for a named
// authority however it is spelt or for any other Host.
func TestOnlyAuthoritiesRecordAllocatesNothing(t *testing.T) {
	rec := newRecorder(newConfig([]Option{WithAuthorities("books.default.svc.cluster.local:7000", "[::1]:7000")}), "inbound")
	for _, host := range []string{"books.default.svc.cluster.local:7000", "Books.Default.svc.cluster.local.:7000",
		"10.1.2.3:7000", "books:7000", "books.default.svc.cluster.local", "[::1]:7000", "[::2]:7000", ""} {
		rec.target(host, nil)
		assert.Zero(t, testing.AllocsPerRun(1000, func() { rec.target(host, nil) }), host)
	}
}
