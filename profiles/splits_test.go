package profiles

import (
	"context"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The split of an authority is its profile's dst overrides, and nothing
// while it has no profile or the profile has none.
func TestSplitsFollowDstOverrides(t *testing.T) {
	const books = "books.ns.svc.cluster.local:7000"
	overrides := []endpoint.WeightedDst{{Authority: "books-v2.ns.svc.cluster.local:7000", Weight: endpoint.DefaultWeight}}
	src := NewStaticSource(map[string]*Profile{books: {DstOverrides: overrides}})
	got := make(chan []endpoint.WeightedDst, 10)
	stop, err := Splits(src).WatchSplit(context.Background(), books, func(d []endpoint.WeightedDst) { got <- d })
	require.NoError(t, err)
	defer stop()
	next := func() []endpoint.WeightedDst {
		t.Helper()
		select {
		case d := <-got:
			return d
		case <-time.After(testutil.Timeout):
			t.Fatal("no split")
			return nil
		}
	}
	assert.Equal(t, overrides, next())
	src.Set(books, &Profile{FullyQualifiedName: "books.ns.svc.cluster.local"})
	assert.Nil(t, next(), "a profile without overrides: no split")
	src.Set(books, &Profile{DstOverrides: overrides})
	assert.Equal(t, overrides, next())
	src.Set(books, nil)
	assert.Nil(t, next(), "no profile: no split")

	assert.Nil(t, Splits(nil), "no source, no split source")
}
