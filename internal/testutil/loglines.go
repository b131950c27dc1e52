package testutil

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// LogLines collects what a text logger writes, for tests that bound what
// an event may log. Its zero value is ready to use.
type LogLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p; it is safe for concurrent use.
func (l *LogLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Logger returns a text logger at debug level that writes to l.
func (l *LogLines) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// String returns everything written so far.
func (l *LogLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Bytes returns how many bytes were written.
func (l *LogLines) Bytes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// Count returns how many lines contain every one of subs (every line for
// none).
func (l *LogLines) Count(subs ...string) int {
	n := 0
lines:
	for _, line := range strings.Split(l.String(), "\n") {
		if line == "" {
			continue
		}
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue lines
			}
		}
		n++
	}
	return n
}
