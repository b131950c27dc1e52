package filestamp

import (
	"errors"
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

func TestRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.yaml")
	require.NoError(t, os.WriteFile(path, []byte("a: 1\n"), 0o644))
	data, err := Read(path)
	require.NoError(t, err)
	assert.Equal(t, "a: 1\n", string(data))
	_, err = Read(path + ".missing")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// A writer appending while the file is read: some read sees the change
// and reports ErrChanged rather than returning content that was torn.
func TestReadNoticesAConcurrentWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.yaml")
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer f.Close()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		line := []byte("- addr: 127.0.0.1:4143\n")
		for range 200000 { // at most 4.6 MB
			select {
			case <-stop:
				return
			default:
			}
			_, _ = f.Write(line)
		}
	}()
	changed := false
	for !changed {
		_, err := Read(path)
		if errors.Is(err, ErrChanged) {
			changed = true
			break
		}
		require.NoError(t, err)
		select {
		case <-done:
			t.Fatal("no read noticed the writer")
		default:
		}
	}
	close(stop)
	<-done
}

func TestSettle(t *testing.T) {
	var s Settle
	s.Loaded("v1")
	assert.False(t, s.Ready("v1"), "nothing changed")
	assert.False(t, s.Ready("half"), "just changed: wait one poll")
	assert.False(t, s.Ready("v2"), "changed again: wait one more")
	assert.True(t, s.Ready("v2"), "stable for one poll: load")
	s.Loaded("v2")
	assert.False(t, s.Ready("v2"))
	assert.False(t, s.Ready("v1"))
	assert.True(t, s.Ready("v1"), "going back to an earlier version loads it too")
}
