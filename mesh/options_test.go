package mesh

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOptionsOfOneStackDoNotCompileForTheOther: an option of the outbound
// stack given to NewServer, or one of the inbound stack given to
// NewClient, is a compile error rather than an option silently ignored;
// shared options compile for both. Each case is built with go build and
// an overlay that adds one file to this package.
func TestOptionsOfOneStackDoNotCompileForTheOther(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	dir, err := os.Getwd()
	require.NoError(t, err)
	for _, tc := range []struct {
		name, code string
		compiles   bool
	}{
		{"a client option to NewServer", "var _ = NewServer(nil, WithDiscoveryWait(0))", false},
		{"a server option to NewClient", "var _ = NewClient(WithLocalAuthorities(\"a:80\"))", false},
		{"WithTrust to NewClient", "var _ = NewClient(WithTrust(nil))", false},
		{"WithEndpoints to NewServer", "var _ = NewServer(nil, WithEndpoints(nil))", false},
		{"shared options to both", "var _, _ = NewClient(WithLogger(nil), WithIdentity(nil)), NewServer(nil, WithLogger(nil), WithIdentity(nil))", true},
		{"a slice of shared options to both", "var o = []Option{WithLogger(nil)}\nvar _, _ = NewClient(ClientOptions(o...)...), NewServer(nil, ServerOptions(o...)...)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			src := filepath.Join(tmp, "check.go")
			require.NoError(t, os.WriteFile(src, []byte("package mesh\n\n"+tc.code+"\n"), 0o644))
			overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(dir, "zz_option_check.go"): src}})
			require.NoError(t, err)
			ov := filepath.Join(tmp, "overlay.json")
			require.NoError(t, os.WriteFile(ov, overlay, 0o644))
			cmd := exec.Command("go", "build", "-overlay", ov, "-o", os.DevNull, ".")
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if tc.compiles {
				assert.NoError(t, err, "%s", out)
			} else {
				require.Error(t, err)
				assert.Contains(t, string(out), "check.go:3", "the error is in the added line: %s", out)
				assert.Contains(t, string(out), "does not implement", "%s", out)
			}
		})
	}
}
