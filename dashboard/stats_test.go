package dashboard

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/tap"
)

// The route table under Hosts a client makes up: a Host that is no
// authority is counted under other, so no key is longer than a DNS name;
// a full table keeps counting made-up authorities under other while its
// rows are fresh, and once the oldest has been idle for rowIdle it folds
// it into other to make room, so a service's own row comes back.
func TestRouteTableUnderMadeUpHosts(t *testing.T) {
	var now atomic.Int64
	now.Store(1_000_000)
	tb := newTable(func() time.Time { return time.Unix(now.Load(), 0) })
	pad := strings.Repeat("a", 60<<10)
	for i := range maxRoutes {
		tb.observe(&tap.Event{Direction: "inbound", Authority: fmt.Sprintf("h%d%s", i, pad), Status: 200})
	}
	for i := range maxRoutes {
		tb.observe(&tap.Event{Direction: "inbound", Authority: fmt.Sprintf("h%d.attacker.example:80", i), Status: 200})
	}
	const own = "books.default.svc.cluster.local:7000"
	tb.observe(&tap.Event{Direction: "inbound", Authority: own, Status: 200})
	routes, _ := tb.snapshot()
	held := 0
	for _, r := range routes {
		held += len(r.Authority)
		assert.NotEqual(t, own, r.Authority, "no room while every row is fresh")
	}
	assert.Less(t, held, 64<<10, "bytes of authorities held")
	require.LessOrEqual(t, len(routes), maxRoutes+1)

	now.Add(rowIdle)
	tb.observe(&tap.Event{Direction: "inbound", Authority: own, Status: 200})
	routes, _ = tb.snapshot()
	var total uint64
	found := false
	for _, r := range routes {
		total += r.Requests
		found = found || r.Authority == own
	}
	assert.True(t, found, "the service's own row, once a made-up one was idle")
	assert.Equal(t, uint64(2*maxRoutes+2), total, "folding a row keeps its requests in the totals")
}

// An event of a row the table holds, or of a spelling it saw, costs no
// allocation: the page's table is on every request's path.
func TestObserveKnownRowAllocatesNothing(t *testing.T) {
	tb := newTable(time.Now)
	for _, a := range []string{"books.default.svc.cluster.local:7000", "books:7000", "10.1.2.3:7000", "Books.Default.svc.cluster.local", "not a host"} {
		e := &tap.Event{Direction: "inbound", Authority: a, Route: "default", Status: 200}
		tb.observe(e)
		assert.Zero(t, testing.AllocsPerRun(1000, func() { tb.observe(e) }), a)
	}
}
