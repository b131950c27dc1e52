package filestamp

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestYAMLFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.yaml", "a.yml", "c.txt"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o644))
	}
	paths, stamp, err := YAMLFiles(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, "a.yml"), filepath.Join(dir, "b.yaml")}, paths)
	future := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(paths[0], future, future))
	_, stamp2, err := YAMLFiles(dir)
	require.NoError(t, err)
	assert.NotEqual(t, stamp, stamp2, "a change shows in the stamp")
	_, _, err = YAMLFiles(filepath.Join(dir, "missing"))
	assert.Error(t, err)
}
