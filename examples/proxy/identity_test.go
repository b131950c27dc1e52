package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A trust anchors file that holds no certificate is named in the error
// the proxy stops with, beside what is wrong with it.
func TestGarbageAnchorsFileIsNamed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(p, []byte("garbage\n"), 0o600))
	f := identityFlags{name: "books.default.serviceaccount.identity.linkerd.cluster.local", tokenFile: p, anchorsFile: p, addr: "127.0.0.1:1"}
	_, _, err := startIdentity(context.Background(), f, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	assert.ErrorContains(t, err, "no trust anchors in the bundle")
	assert.ErrorContains(t, err, "-identity-trust-anchors "+p)
}
