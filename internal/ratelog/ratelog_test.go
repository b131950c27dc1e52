package ratelog

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTest(interval time.Duration) (*Logger, *bytes.Buffer, *time.Time) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), interval)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	return l, &buf, &now
}

func TestOneLinePerKeyPerInterval(t *testing.T) {
	l, buf, now := newTest(time.Second)
	for range 1000 {
		l.Warn("a", "stream failed", "authority", "a:80")
	}
	l.Warn("b", "stream failed", "authority", "b:80")
	assert.Equal(t, 2, strings.Count(buf.String(), "\n"))

	*now = now.Add(time.Second)
	l.Warn("a", "stream failed", "authority", "a:80")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	assert.Len(t, lines, 3)
	assert.Contains(t, lines[2], "suppressed=999")
}

func TestDistinctKeysAreBounded(t *testing.T) {
	l, buf, _ := newTest(time.Minute)
	for i := range 100_000 {
		l.Warn(fmt.Sprint(i), "rejected")
	}
	assert.LessOrEqual(t, len(l.keys), maxKeys)
	// Every key is new, so each logs once: the bound is on memory, and the
	// caller picks keys from a bounded set (authorities under their cap).
	assert.Equal(t, 100_000, strings.Count(buf.String(), "\n"))
}

func TestLevelsAndNil(t *testing.T) {
	var nilLogger *Logger
	nilLogger.Warn("k", "nothing") // must not panic
	nilLogger.Slog().Info("nothing")

	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})), 0)
	assert.Equal(t, DefaultInterval, l.interval)
	l.Debug("k", "hidden")
	l.Info("k", "hidden")
	l.Warn("k", "shown")
	assert.Equal(t, 1, strings.Count(buf.String(), "\n"))
}

// Five different mistakes from one source are five lines; the same mistake
// repeated stays one line; a flood of distinct mistakes is bounded per
// interval, the rest counted.
func TestWarnErrKeysOnTheReason(t *testing.T) {
	l, buf, now := newTest(time.Minute)
	for i := range 5 {
		for range 100 {
			l.WarnErr("rejected file", "rejected a control-plane file", fmt.Errorf("books.yaml: routes[%d].condition: bad regex", i))
		}
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 5, buf.String())
	for i, line := range lines {
		assert.Contains(t, line, fmt.Sprintf("routes[%d].condition", i))
	}

	buf.Reset()
	for i := range 1000 {
		l.WarnErr("flood", "rejected", fmt.Errorf("mistake %d", i))
	}
	assert.Equal(t, MaxReasons, strings.Count(buf.String(), "\n"))
	*now = now.Add(time.Minute)
	buf.Reset()
	l.WarnErr("flood", "rejected", fmt.Errorf("mistake %d", 5000))
	assert.Contains(t, buf.String(), "other_reasons_suppressed=936")
}

// After Forget, a key and its reasons are written again at once: a change
// of state is never suppressed.
func TestForgetWritesTheNextLineAtOnce(t *testing.T) {
	l, buf, _ := newTest(time.Hour)
	l.Info("loaded", "loaded endpoints")
	l.WarnErr("rejected", "rejected a file", fmt.Errorf("endpoints.yaml: [0].addr: bad"))
	l.Info("loaded", "loaded endpoints")
	l.WarnErr("rejected", "rejected a file", fmt.Errorf("endpoints.yaml: [0].addr: bad"))
	require.Equal(t, 2, strings.Count(buf.String(), "\n"), "within the interval, repeats are suppressed")

	l.Forget("loaded")
	l.Info("loaded", "loaded endpoints")
	l.Forget("rejected")
	l.WarnErr("rejected", "rejected a file", fmt.Errorf("endpoints.yaml: [0].addr: bad"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 4)
	assert.Contains(t, lines[2], "loaded endpoints")
	assert.Contains(t, lines[3], "rejected a file")
	l.WarnErr("rejected", "rejected a file", fmt.Errorf("endpoints.yaml: [0].addr: bad"))
	assert.Equal(t, 4, strings.Count(buf.String(), "\n"), "the same reason again is suppressed again")

	var nilLogger *Logger
	nilLogger.Forget("k") // must not panic
}
