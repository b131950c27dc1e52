package profiles

import (
	"context"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/require"
)

func collect(t *testing.T) (func(Update), func(what string, ok func(Update) bool) Update) {
	ch := make(chan Update, 100)
	return func(u Update) { ch <- u }, func(what string, ok func(Update) bool) Update {
		t.Helper()
		deadline := time.After(testutil.Timeout)
		for {
			select {
			case u := <-ch:
				if ok(u) {
					return u
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
}

func routeIs(name string) func(Update) bool {
	return func(u Update) bool {
		return u.Profile != nil && len(u.Profile.Routes) > 0 && u.Profile.Routes[0].Labels["route"] == name
	}
}

func TestStaticSource(t *testing.T) {
	src := NewStaticSource(nil)
	update, wait := collect(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := src.Watch(ctx, "a:80", update)
	require.NoError(t, err)
	wait("no profile yet", func(u Update) bool { return u.Profile == nil })
	src.Set("a:80", &Profile{Routes: []Route{{Condition: MatchAll{}, Labels: map[string]string{"route": "r"}}}})
	wait("set", routeIs("r"))
	src.Set("a:80", nil)
	wait("removed", func(u Update) bool { return u.Profile == nil })
	cancel()
	require.Eventually(t, func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return len(src.watchers["a:80"]) == 0
	}, testutil.Timeout, time.Millisecond, "a cancelled watch is removed")
}
