package controlplane

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An empty identity directory gets a new anchor and issuer, which load
// again as they were written and sign certificates that chain to the
// anchor; a directory with only some of the files is an error naming the
// missing ones.
func TestLoadIdentityDir(t *testing.T) {
	dir := t.TempDir()
	d, created, err := LoadIdentityDir(dir)
	require.NoError(t, err)
	assert.True(t, created)
	again, created, err := LoadIdentityDir(dir)
	require.NoError(t, err)
	assert.False(t, created, "loaded, not made again")
	assert.Equal(t, d.Chain, again.Chain)
	info, err := os.Stat(filepath.Join(dir, IssuerKeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the key is private")

	issuer, err := NewIssuer(again.Anchors, again.Chain, again.Key, StaticTokens{}, WithIssuerLogger(quiet))
	require.NoError(t, err)
	svc, err := identity.NewLocal(IdentityServiceName("linkerd", "cluster.local"), again.Anchors)
	require.NoError(t, err)
	require.NoError(t, issuer.CertifyLocal(svc))
	assert.Equal(t, "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local", svc.Name())

	require.NoError(t, os.Remove(filepath.Join(dir, IssuerKeyFile)))
	_, _, err = LoadIdentityDir(dir)
	assert.ErrorContains(t, err, IssuerKeyFile)
}

// Replicas started at the same moment on one empty identity directory
// share one trust root: one of them makes it, and the others load it
// (before, each made its own and some replicas' issuers then chained to
// no anchor the others' clients trusted).
func TestIdentityDirMadeOnceByReplicasStartedTogether(t *testing.T) {
	dir := t.TempDir()
	const replicas = 8
	type loaded struct {
		d       *IdentityDir
		created bool
		err     error
	}
	start := make(chan struct{})
	results := make(chan loaded, replicas)
	for range replicas {
		go func() {
			<-start
			d, created, err := LoadIdentityDir(dir)
			results <- loaded{d, created, err}
		}()
	}
	close(start)
	made := 0
	var anchors []byte
	for range replicas {
		r := <-results
		require.NoError(t, r.err)
		if r.created {
			made++
		}
		if anchors == nil {
			anchors = r.d.AnchorsPEM
		}
		assert.Equal(t, string(anchors), string(r.d.AnchorsPEM), "one trust root")
	}
	assert.Equal(t, 1, made, "made once")
	onDisk, err := os.ReadFile(filepath.Join(dir, TrustAnchorsFile))
	require.NoError(t, err)
	assert.Equal(t, string(anchors), string(onDisk))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 3, "nothing left aside")
}

// The tokens file is reloaded once a change settles; a bad edit is refused
// and the last good tokens stay in force.
func TestWatchTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	require.NoError(t, os.WriteFile(path, []byte("- {token: t1, serviceAccount: books, namespace: default}\n"), 0o600))
	tokens := NewTokens("linkerd", "cluster.local")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs testutil.LogLines
	require.NoError(t, WatchTokens(ctx, tokens, path, 10*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil))))
	id, err := tokens.Validate(ctx, []byte("t1"))
	require.NoError(t, err)
	assert.Equal(t, books, id)

	require.NoError(t, os.WriteFile(path, []byte("- {token: t2, serviceAccount: authors, namespace: default}\n"), 0o600))
	require.Eventually(t, func() bool { id, err := tokens.Validate(ctx, []byte("t2")); return err == nil && id == authors },
		30*time.Second, 5*time.Millisecond)
	require.NoError(t, os.WriteFile(path, []byte("- {token: t3}\n"), 0o600))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "[0].serviceAccount: required") },
		30*time.Second, 5*time.Millisecond, "the bad edit is refused, naming the field")
	_, err = tokens.Validate(ctx, []byte("t2"))
	assert.NoError(t, err, "the last good tokens stay in force")
	_, err = tokens.Validate(ctx, []byte("t3"))
	assert.ErrorIs(t, err, ErrNotAuthenticated)

	_, err = os.Stat(filepath.Join(t.TempDir(), "none"))
	require.Error(t, err)
	assert.Error(t, WatchTokens(ctx, tokens, filepath.Join(t.TempDir(), "none"), time.Second, quiet), "a missing file fails the first load")
}

// A mistake in the tokens file that follows a load is named even when the
// same mistake was named within the log interval: the last line tells
// whether the file in place is in force.
func TestWatchTokensNamesAMistakeAfterALoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	w := &stampedWriter{t: t}
	const good, bad = "- {token: t1, serviceAccount: books, namespace: default}\n", "- {token: t3}\n"
	w.write(path, good)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &testutil.LogLines{}
	require.NoError(t, WatchTokens(ctx, NewTokens("linkerd", "cluster.local"), path, 5*time.Millisecond, logs.Logger()))
	for i := 1; i <= 2; i++ {
		w.write(path, bad)
		require.Eventually(t, func() bool { return logs.Count("rejected the tokens file") == i }, defaultTestTimeout, 5*time.Millisecond,
			"rejection %d; log:\n%s", i, logs.String())
		w.write(path, good+"\n")
		require.Eventually(t, func() bool { return logs.Count("loaded tokens") == i }, defaultTestTimeout, 5*time.Millisecond)
	}
}

// A replica that looks at the identity directory while another is linking
// its new files in (the trust anchors there, the issuer's not yet) waits
// for them instead of refusing the directory as incomplete. The second
// replica starts the moment the first one's trust anchors appear.
func TestIdentityDirReplicaStartedDuringLinking(t *testing.T) {
	for i := range 100 {
		dir := t.TempDir()
		first := make(chan error, 1)
		go func() { _, _, err := LoadIdentityDir(dir); first <- err }()
		for { // the first replica's trust anchors, as soon as they appear
			if _, err := os.Stat(filepath.Join(dir, TrustAnchorsFile)); err == nil {
				break
			}
		}
		_, _, err := LoadIdentityDir(dir)
		require.NoError(t, <-first)
		require.NoError(t, err, "a replica started as the first one's trust anchors appeared (round %d)", i)
	}
}
