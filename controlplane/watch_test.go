package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWatchFiles(t *testing.T) {
	dir := t.TempDir()
	profilesDir := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profilesDir, 0o755))
	sp := filepath.Join(profilesDir, "books.yaml")
	writeFile(t, sp, testutil.FullProfile)
	eps := filepath.Join(dir, "endpoints.yaml")
	writeFile(t, eps, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := NewStore()
	require.NoError(t, WatchFiles(ctx, store, profilesDir, eps, 10*time.Millisecond, WithLogger(quietLogger)))
	p := storedProfile(store, "books.default.svc.cluster.local", 7000)
	assert.Len(t, p.Routes, 3)

	touch := func(path, content string, n int) {
		writeFile(t, path, content)
		future := time.Now().Add(time.Duration(n) * time.Hour)
		require.NoError(t, os.Chtimes(path, future, future))
	}
	touch(eps, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n  - addr: 127.0.0.1:4144\n", 1)
	require.Eventually(t, func() bool {
		e, _ := store.endpointSet("books.default.svc.cluster.local:7000")
		return len(e) == 2
	}, defaultTestTimeout, 5*time.Millisecond)

	touch(sp, "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local}\nspec:\n  routes: [{name: x}]\n", 2)
	touch(eps, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4145\n", 3)
	require.Eventually(t, func() bool {
		e, _ := store.endpointSet("books.default.svc.cluster.local:7000")
		return len(e) == 1 && e[0].Addr.Port() == 4145
	}, defaultTestTimeout, 5*time.Millisecond, "a good file loads even while another is broken")
	p = storedProfile(store, "books.default.svc.cluster.local", 7000)
	assert.Len(t, p.Routes, 3, "the broken profile file left the last good profiles")

	assert.Error(t, WatchFiles(ctx, NewStore(), filepath.Join(dir, "missing"), "", 0), "the first load must succeed")
}
