package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stampedWriter writes files with a modification time that moves forward on
// every write, so that each change shows in the size+mtime stamp even within
// one clock tick. It writes a copy beside the file and renames it into
// place: an in-place write (truncate, then write) shows an empty file for
// as long as the writer is descheduled, which on a loaded machine can
// outlast the tests' 5 ms poll interval, and the watcher then rightly
// reports the empty file as one more mistake.
type stampedWriter struct {
	t *testing.T
	n int
}

func (w *stampedWriter) write(path, content string) {
	w.t.Helper()
	w.n++
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	require.NoError(w.t, os.WriteFile(tmp, []byte(content), 0o644))
	at := time.Now().Add(time.Duration(w.n) * time.Minute)
	require.NoError(w.t, os.Chtimes(tmp, at, at))
	require.NoError(w.t, os.Rename(tmp, path))
}

const goodEndpoints = "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    labels: {pod: books-0}\n  - addr: 127.0.0.1:4144\n"

func manyLabels(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "l%d: v, ", i)
	}
	return strings.TrimSuffix(b.String(), ", ")
}

// Every bad endpoints file is logged with its file and field, and the store
// keeps the last good endpoints; a good file afterwards loads.
func TestWatchFilesKeepsLastGoodEndpoints(t *testing.T) {
	const authority = "books.default.svc.cluster.local:7000"
	cases := []struct {
		name, content string
		wantLog       []string // in the warning, besides the file name
	}{
		{"empty (: > endpoints.yaml)", "", []string{"is empty"}},
		{"whitespace only", "  \n\t\n", []string{"is empty"}},
		{"comments only", "# nothing yet\n", []string{"is empty"}},
		{"null document", "~\n", []string{"is empty"}},
		{"truncated in a key", goodEndpoints[:len("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - ad")], []string{"[0].endpoints[0]", "must be an object"}},
		{"truncated in a value", "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.", []string{"[0].endpoints[0].addr", "is not an ip:port"}},
		{"truncated in a flow mapping", "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - {addr: 127.0.0.1:4143, lab", []string{"bad YAML"}},
		{"duplicate key", "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    addr: 127.0.0.1:4145\n", []string{"[0].endpoints[0].addr", `duplicate key \"addr\"`}},
		{"too many labels", "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    labels: {" + manyLabels(destination.MaxEndpointLabels+1) + "}\n", []string{"[0].endpoints[0].labels", "33 labels, more than 32"}},
		{"label value too long", "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    labels: {pod: " + strings.Repeat("x", destination.MaxLabelValueLen+1) + "}\n", []string{"[0].endpoints[0].labels", "label pod: value is 254 bytes"}},
		{"label key too long", "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    labels: {" + strings.Repeat("k", destination.MaxLabelKeyLen+1) + ": v}\n", []string{"[0].endpoints[0].labels", "bytes, more than 63"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			eps := filepath.Join(dir, "endpoints.yaml")
			w := &stampedWriter{t: t}
			w.write(eps, goodEndpoints)
			logs := &testutil.LogLines{}
			store := NewStore()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			require.NoError(t, WatchFiles(ctx, store, "", eps, 5*time.Millisecond, WithLogger(logs.Logger())))
			got, exists := store.endpointSet(authority)
			require.True(t, exists)
			require.Len(t, got, 2)

			w.write(eps, tc.content)
			require.Eventually(t, func() bool { return logs.Count("WARN") > 0 }, defaultTestTimeout, 5*time.Millisecond, "the bad file was never reported")
			line := logs.String()
			assert.Contains(t, line, eps, "the warning names the file")
			for _, want := range tc.wantLog {
				assert.Contains(t, line, want)
			}
			got, exists = store.endpointSet(authority)
			assert.True(t, exists, "the last good state stays")
			assert.Len(t, got, 2, "the last good state stays")
			assert.Equal(t, 1, logs.Count("WARN"), "reported once, not at every poll")

			w.write(eps, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4145\n")
			require.Eventually(t, func() bool {
				got, _ := store.endpointSet(authority)
				return len(got) == 1 && got[0].Addr.Port() == 4145
			}, defaultTestTimeout, 5*time.Millisecond, "a good file loads after the bad one")
		})
	}
}

// An explicit empty list is a valid state with no authorities, unlike an
// empty file; a first load of an empty file fails.
func TestEndpointsFileExplicitEmptyList(t *testing.T) {
	got, err := manifest.ParseEndpoints([]byte("[]\n"))
	require.NoError(t, err)
	assert.Empty(t, got)
	_, err = manifest.ParseEndpoints(nil)
	assert.ErrorContains(t, err, "write [] for a state with no authorities")

	eps := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, eps, "")
	err = WatchFiles(context.Background(), NewStore(), "", eps, time.Hour)
	assert.ErrorContains(t, err, "is empty")
}

// Bad profile files, through WatchFiles: the last good profiles stay.
func TestWatchFilesKeepsLastGoodProfiles(t *testing.T) {
	cases := []struct {
		name, content string
		wantLog       []string
	}{
		{"empty", "", []string{"empty file (no documents)"}},
		{"whitespace", "\n   \n", []string{"empty file (no documents)"}},
		{"truncated", testutil.FullProfile[:strings.Index(testutil.FullProfile, "spec:")], []string{"spec: required"}},
		{"duplicate key", "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local}\nspec:\n  routes:\n  - name: a\n    condition: {pathRegex: /a}\n    condition: {pathRegex: /b}\n", []string{"spec.routes[0].condition", "duplicate key"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sp := filepath.Join(dir, "books.yaml")
			w := &stampedWriter{t: t}
			w.write(sp, testutil.FullProfile)
			logs := &testutil.LogLines{}
			store := NewStore()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			require.NoError(t, WatchFiles(ctx, store, dir, "", 5*time.Millisecond, WithLogger(logs.Logger())))
			p := storedProfile(store, "books.default.svc.cluster.local", 7000)
			require.Len(t, p.Routes, 3)

			w.write(sp, tc.content)
			require.Eventually(t, func() bool { return logs.Count("WARN") > 0 }, defaultTestTimeout, 5*time.Millisecond)
			line := logs.String()
			assert.Contains(t, line, sp)
			for _, want := range tc.wantLog {
				assert.Contains(t, line, want)
			}
			p = storedProfile(store, "books.default.svc.cluster.local", 7000)
			assert.Len(t, p.Routes, 3, "the last good profiles stay")
		})
	}
}

// One running control plane, one bad endpoints file after another, each a
// different mistake: every one is named in the log (file and field), even
// within one rate-limit interval; the same mistake again is not repeated.
func TestEveryDistinctMistakeIsLogged(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.yaml")
	w := &stampedWriter{t: t}
	w.write(eps, goodEndpoints)
	logs := &testutil.LogLines{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, WatchFiles(ctx, NewStore(), "", eps, 5*time.Millisecond, WithLogger(logs.Logger()), WithLogInterval(time.Hour)))
	mistakes := []struct{ content, want string }{
		{"- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.\n", "[0].endpoints[0].addr"},
		{"- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    weight: -1\n", "[0].endpoints[0].weight"},
		{"- authority: books\n  endpoints: []\n", "[0].authority"},
		{"- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n    h2: maybe\n", "[0].endpoints[0].h2"},
		{"- endpoints: []\n", "[0].authority: required"},
	}
	for i, m := range mistakes {
		w.write(eps, m.content)
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), m.want) }, defaultTestTimeout, 5*time.Millisecond,
			"mistake %d (%s) was never named; log:\n%s", i, m.want, logs.String())
	}
	assert.Equal(t, len(mistakes), logs.Count("WARN", eps), "one line per mistake")
	w.write(eps, mistakes[0].content) // the first mistake again
	w.write(eps, mistakes[0].content+"\n")
	assert.Never(t, func() bool { return logs.Count("WARN", eps) > len(mistakes)+1 }, 100*time.Millisecond, 5*time.Millisecond)
}

// A ServiceProfile named "stock" loads, and the control plane says it will
// never apply.
func TestShortProfileNameIsReported(t *testing.T) {
	dir := t.TempDir()
	logs := &testutil.LogLines{}
	writeFile(t, filepath.Join(dir, "stock.yaml"), "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: stock}\nspec:\n  routes: []\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, WatchFiles(ctx, NewStore(), dir, "", 5*time.Millisecond, WithLogger(logs.Logger())))
	assert.Equal(t, 1, logs.Count("WARN", `metadata.name \"stock\" is not a fully qualified service name (such as stock.default.svc.cluster.local)`), logs.String())
}

// infoWarnLines returns the log's lines at INFO and WARN, in order.
func infoWarnLines(logs *testutil.LogLines) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "level=INFO") || strings.Contains(l, "level=WARN") {
			out = append(out, l)
		}
	}
	return out
}

func lastLine(logs *testutil.LogLines) string {
	lines := infoWarnLines(logs)
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

// A change of state is always logged, however soon it follows the last
// line of its kind: a fix after a rejection says "loaded", a mistake after
// a load says "rejected" (even one already named), so the last line tells
// what is served. Repeats of the same state stay limited.
func TestStateChangesAreAlwaysLogged(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.yaml")
	w := &stampedWriter{t: t}
	w.write(eps, goodEndpoints)
	logs := &testutil.LogLines{}
	store := NewStore()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, WatchFiles(ctx, store, "", eps, 5*time.Millisecond, WithLogger(logs.Logger()), WithLogInterval(time.Hour)))
	good := func(port int) string {
		return fmt.Sprintf("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:%d\n", port)
	}
	serves := func(port uint16) func() bool {
		return func() bool {
			got, _ := store.endpointSet("books.default.svc.cluster.local:7000")
			return len(got) == 1 && got[0].Addr.Port() == port
		}
	}
	const bad = "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.\n"
	wait := func(cond func() bool, what string) {
		t.Helper()
		require.Eventually(t, cond, defaultTestTimeout, 5*time.Millisecond, "%s; log:\n%s", what, logs.String())
	}

	w.write(eps, good(4145))
	wait(serves(4145), "the first change loads")
	wait(func() bool { return logs.Count(`msg="loaded endpoints"`) == 1 }, "the first change is confirmed")

	w.write(eps, bad)
	wait(func() bool { return strings.Contains(lastLine(logs), "rejected a control-plane file") }, "the mistake is named")

	w.write(eps, good(4146))
	wait(serves(4146), "the fix loads")
	wait(func() bool { return strings.Contains(lastLine(logs), `msg="loaded endpoints"`) }, "the fix is confirmed within the log interval")

	w.write(eps, bad) // the same mistake again, within the interval
	wait(func() bool { return strings.Contains(lastLine(logs), "rejected a control-plane file") }, "the same mistake after a load is named again")

	w.write(eps, bad+"\n") // still the same mistake: no new line
	w.write(eps, good(4147))
	wait(serves(4147), "the second fix loads")
	wait(func() bool { return strings.Contains(lastLine(logs), `msg="loaded endpoints"`) }, "the second fix is confirmed")
	assert.Equal(t, 2, logs.Count("WARN", eps), "one line per rejection after a load")
	assert.Equal(t, 3, logs.Count(`msg="loaded endpoints"`), "one line per load after a rejection (and the first change)")

	w.write(eps, good(4148)) // loaded after loaded, within the interval: limited
	wait(serves(4148), "a further change loads")
	assert.Never(t, func() bool { return logs.Count(`msg="loaded endpoints"`) > 3 }, 100*time.Millisecond, 5*time.Millisecond)
}

// A ServiceProfile of another apiVersion is refused with its file and the
// apiVersion field named; the last good profiles stay.
func TestWrongProfileAPIVersionIsNamed(t *testing.T) {
	dir := t.TempDir()
	sp := filepath.Join(dir, "books.yaml")
	w := &stampedWriter{t: t}
	w.write(sp, testutil.FullProfile)
	logs := &testutil.LogLines{}
	store := NewStore()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, WatchFiles(ctx, store, dir, "", 5*time.Millisecond, WithLogger(logs.Logger())))

	w.write(sp, strings.Replace(testutil.FullProfile, "linkerd.io/v1alpha2", "linkerd.io/v1alpha1", 1))
	require.Eventually(t, func() bool { return logs.Count("WARN") > 0 }, defaultTestTimeout, 5*time.Millisecond)
	assert.Equal(t, 1, logs.Count("WARN", sp+": document 1", `apiVersion: \"linkerd.io/v1alpha1\" is not an API version of ServiceProfile read here (want linkerd.io/v1alpha2)`), logs.String())
	store.mu.Lock()
	got := store.profiles[profileID{"default", "books.default.svc.cluster.local"}]
	store.mu.Unlock()
	require.NotNil(t, got, "the last good profile stays")
	assert.Len(t, got.Routes, 3, "the last good profile stays")
}

// Policy manifests that load but cannot work as written are named once
// each, with file, document and field: an AuthorizationPolicy requiring a
// MeshTLSAuthentication that no file defines, and a Server whose port is
// no port of the Pods it selects.
func TestManifestMistakesAreNamedOnce(t *testing.T) {
	dir := t.TempDir()
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: books-0, namespace: default, labels: {app: books}}\nspec:\n  containers:\n  - name: app\n    ports: [{name: http, containerPort: 7000}]\n"
	srv := "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: books, namespace: default}\nspec: {podSelector: {matchLabels: {app: books}}, port: 8080}\n"
	ap := "apiVersion: policy.linkerd.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: books-authors, namespace: default}\n" +
		"spec:\n  targetRef: {group: policy.linkerd.io, kind: Server, name: books}\n  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: authors}]\n"
	w := &stampedWriter{t: t}
	podFile, policyFile := filepath.Join(dir, "pods.yaml"), filepath.Join(dir, "policy.yaml")
	w.write(podFile, pod)
	w.write(policyFile, srv+"---\n"+ap)
	logs := &testutil.LogLines{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, WatchManifestFiles(ctx, NewStore(), dir, 5*time.Millisecond, WithLogger(logs.Logger())))
	wantServer := policyFile + `: document 1 (Server default/books): spec.port: 8080 is no TCP container port of the Pods it selects (default/books-0, which declare 7000)`
	wantAuthz := policyFile + `: document 2 (AuthorizationPolicy default/books-authors): spec.requiredAuthenticationRefs[0]: MeshTLSAuthentication default/authors is not defined in any file`
	require.Eventually(t, func() bool { return logs.Count(wantServer) == 1 && logs.Count(wantAuthz) == 1 }, defaultTestTimeout, 5*time.Millisecond, logs.String())
	assert.Never(t, func() bool { return logs.Count("WARN") > 2 }, 100*time.Millisecond, 5*time.Millisecond, "named once, not at every poll")

	// Fixed: the Server names the declared port, the authentication exists.
	w.write(policyFile, strings.Replace(srv, "port: 8080", "port: http", 1)+"---\n"+ap+
		"---\napiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: authors, namespace: default}\nspec: {identities: ['*']}\n")
	require.Eventually(t, func() bool { return logs.Count(`msg="loaded policy manifests"`) == 1 }, defaultTestTimeout, 5*time.Millisecond)
	assert.Equal(t, 2, logs.Count("WARN"), "nothing more to name: %s", logs.String())
}

// A fix of manifests that loaded with a problem is confirmed in the log
// however soon it follows the line before, as a fix after a rejection is:
// the last line tells what is served.
func TestFixOfAProblemIsLogged(t *testing.T) {
	dir := t.TempDir()
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: books-0, namespace: default, labels: {app: books}}\nspec:\n  containers:\n  - name: app\n    ports: [{name: http, containerPort: 7000}]\n"
	srv := func(port string) string {
		return "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: books, namespace: default}\nspec: {podSelector: {matchLabels: {app: books}}, port: " + port + "}\n"
	}
	w := &stampedWriter{t: t}
	policyFile := filepath.Join(dir, "policy.yaml")
	w.write(policyFile, pod+"---\n"+srv("http"))
	logs := &testutil.LogLines{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, WatchManifestFiles(ctx, NewStore(), dir, 5*time.Millisecond, WithLogger(logs.Logger()), WithLogInterval(time.Hour)))
	wait := func(cond func() bool, what string) {
		t.Helper()
		require.Eventually(t, cond, defaultTestTimeout, 5*time.Millisecond, "%s; log:\n%s", what, logs.String())
	}

	w.write(policyFile, pod+"---\n"+srv("htp"))
	wait(func() bool { return strings.Contains(lastLine(logs), "cannot work as written") }, "the problem is named")
	w.write(policyFile, pod+"---\n"+srv("http"))
	wait(func() bool { return strings.Contains(lastLine(logs), `msg="loaded policy manifests"`) }, "the fix is confirmed within the log interval")
}
