package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain runs main when the test binary is started as the program (see
// runMain), so that tests see what a user sees: the exit code and stderr.
func TestMain(m *testing.M) {
	if args := os.Getenv("INMESH_TEST_DESTINATION_ARGS"); args != "" {
		os.Args = append([]string{"destination"}, strings.Split(args, "\n")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runMain runs the program with args until it exits or 10 s have passed
// (then it is killed), and returns its exit code and stderr.
func runMain(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "INMESH_TEST_DESTINATION_ARGS="+strings.Join(args, "\n"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "the program did not exit; stderr:\n%s", stderr.String())
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), stderr.String()
	}
	require.NoError(t, err)
	return 0, stderr.String()
}

// -identity-tokens without -identity-dir serves no Identity API: the
// program refuses to start and says which flag is missing, as it does for
// -identity-dir without -identity-tokens.
func TestIdentityFlagsNeedEachOther(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens.yaml")
	require.NoError(t, os.WriteFile(tokens, []byte("- {token: t1, serviceAccount: books, namespace: default}\n"), 0o600))
	code, stderr := runMain(t, "-listen", "127.0.0.1:0", "-identity-tokens", tokens)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "destination: -identity-tokens "+tokens+" needs -identity-dir (the trust anchors and issuer) to serve the Identity API")

	code, stderr = runMain(t, "-listen", "127.0.0.1:0", "-identity-dir", t.TempDir())
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "destination: -identity-dir")
	assert.Contains(t, stderr, "needs -identity-tokens")
}
