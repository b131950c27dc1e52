package profiles

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Every bad profile file is reported with its file and field, through the
// log and Err, and the last good profile stays in force for watchers; a good
// file afterwards loads.
func TestFileSourceKeepsLastGoodProfile(t *testing.T) {
	good := "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata:\n  name: books.default.svc.cluster.local\nspec:\n  routes:\n  - name: v1\n    condition: {method: get, pathRegex: /books}\n"
	cases := []struct {
		name, content string
		want          []string
	}{
		{"empty (: > books.yaml)", "", []string{"no ServiceProfile in the file"}},
		{"whitespace only", " \n\n", []string{"no ServiceProfile in the file"}},
		{"truncated in the metadata", good[:strings.Index(good, "name: books")+len("name: bo")], []string{"spec: required"}},
		{"truncated in a route", good[:strings.Index(good, "    condition")], []string{"document 1: spec.routes[0].condition: required"}},
		{"truncated in a flow mapping", good[:strings.Index(good, "pathRegex")+len("pathR")], []string{"bad YAML"}},
		{"duplicate key", good + "  - name: v2\n    name: v3\n    condition: {pathRegex: /x}\n", []string{"spec.routes[1].name", "duplicate key"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "books.yaml")
			n := 0
			write := func(content string) {
				n++
				require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
				at := time.Now().Add(time.Duration(n) * time.Minute)
				require.NoError(t, os.Chtimes(path, at, at))
			}
			write(good)
			logs := &syncBuffer{}
			src, err := NewFileSource(dir, WithPollInterval(5*time.Millisecond), WithFileLogger(slog.New(slog.NewTextHandler(logs, nil))))
			require.NoError(t, err)
			defer src.Close()
			update, wait := collect(t)
			stop, err := src.Watch(context.Background(), "books.default.svc.cluster.local:7000", update)
			require.NoError(t, err)
			defer stop()
			u := wait("v1", routeIs("v1"))
			assert.Equal(t, Method("GET"), u.Profile.Routes[0].Condition.(MatchAll)[0], "the method is upper-cased")

			write(tc.content)
			require.Eventually(t, func() bool { return src.Err() != nil }, testutil.Timeout, 5*time.Millisecond)
			for _, want := range append([]string{path}, tc.want...) {
				assert.ErrorContains(t, src.Err(), want)
			}
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "level=WARN") }, testutil.Timeout, 5*time.Millisecond)
			line := logs.String()
			assert.Contains(t, line, "books.yaml")
			assert.Contains(t, line, tc.want[0])
			assert.Equal(t, 1, strings.Count(line, "level=WARN"), "reported once, not at every poll")

			// A new watcher still gets the last good profile.
			update2, wait2 := collect(t)
			stop2, err := src.Watch(context.Background(), "books.default.svc.cluster.local:7000", update2)
			require.NoError(t, err)
			defer stop2()
			wait2("the last good profile", routeIs("v1"))

			write(strings.Replace(good, "name: v1", "name: v2", 1))
			wait("the fix", routeIs("v2"))
			assert.NoError(t, src.Err())
		})
	}
}
