package manifest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every bad profile file is reported with its file and field, through the
// log and Err, and the last good profile stays in force for watchers; a good
// file afterwards loads.
func TestProfileSourceKeepsLastGoodProfile(t *testing.T) {
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
				// A finished copy renamed into place: an in-place write
				// can show the 5 ms poll an empty file on a loaded machine.
				n++
				tmp := filepath.Join(dir, ".books.yaml.tmp")
				require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
				at := time.Now().Add(time.Duration(n) * time.Minute)
				require.NoError(t, os.Chtimes(tmp, at, at))
				require.NoError(t, os.Rename(tmp, path))
			}
			write(good)
			logs := &testutil.LogLines{}
			src, err := NewProfileSource(dir, WithPollInterval(5*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			require.NoError(t, err)
			defer src.Close()
			update, wait := collect(t)
			stop, err := src.Watch(context.Background(), "books.default.svc.cluster.local:7000", update)
			require.NoError(t, err)
			defer stop()
			u := wait("v1", routeIs("v1"))
			assert.Equal(t, profiles.Method("GET"), u.Profile.Routes[0].Condition.(profiles.MatchAll)[0], "the method is upper-cased")

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
			require.Eventually(t, func() bool {
				lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
				return strings.Contains(lines[len(lines)-1], "profile files loaded after a rejection")
			}, testutil.Timeout, 5*time.Millisecond, "the last line says the fix is in force: %s", logs.String())
		})
	}
}
func writeProfile(t *testing.T, path, route string) {
	t.Helper()
	data := "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata:\n  name: books.default.svc.cluster.local\nspec:\n  routes:\n  - name: " +
		route + "\n    condition: {pathRegex: /books}\n"
	require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
	// Make the change visible to the size+mtime check even within one
	// clock tick.
	future := time.Now().Add(time.Duration(len(route)) * time.Second)
	require.NoError(t, os.Chtimes(path, future, future))
}

func TestProfileSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "books.yaml")
	writeProfile(t, path, "v1")
	src, err := NewProfileSource(dir, WithPollInterval(10*time.Millisecond), WithLogger(quietLogger))
	require.NoError(t, err)
	defer src.Close()

	update, wait := collect(t)
	stop, err := src.Watch(context.Background(), "books.default.svc.cluster.local:7000", update)
	require.NoError(t, err)
	defer stop()
	wait("v1", routeIs("v1"))

	writeProfile(t, path, "v2-edited")
	wait("the edit", routeIs("v2-edited"))

	// A broken file: reported, and the last good profile stays.
	require.NoError(t, os.WriteFile(path, []byte("apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local}\nspec:\n  routes:\n  - name: x\n    condition: {pathRegex: '/a('}\n"), 0o644))
	require.Eventually(t, func() bool { return src.Err() != nil }, testutil.Timeout, 5*time.Millisecond)
	assert.ErrorContains(t, src.Err(), "books.yaml: document 1: spec.routes[0].condition.pathRegex: bad regex")

	writeProfile(t, path, "v3-fixed-again")
	wait("the fix", routeIs("v3-fixed-again"))
	assert.NoError(t, src.Err())

	// An unknown name has no profile.
	u2, wait2 := collect(t)
	stop2, err := src.Watch(context.Background(), "web.default.svc.cluster.local:80", u2)
	require.NoError(t, err)
	defer stop2()
	wait2("no profile", func(u profiles.Update) bool { return u.Profile == nil })

	_, err = src.Watch(context.Background(), "not an authority", func(profiles.Update) {})
	assert.Error(t, err)
	_, err = NewProfileSource(filepath.Join(dir, "missing"), WithPollInterval(0), nil)
	assert.Error(t, err)
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

func collect(t *testing.T) (func(profiles.Update), func(what string, ok func(profiles.Update) bool) profiles.Update) {
	ch := make(chan profiles.Update, 100)
	return func(u profiles.Update) { ch <- u }, func(what string, ok func(profiles.Update) bool) profiles.Update {
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

func routeIs(name string) func(profiles.Update) bool {
	return func(u profiles.Update) bool {
		return u.Profile != nil && len(u.Profile.Routes) > 0 && u.Profile.Routes[0].Labels["route"] == name
	}
}
