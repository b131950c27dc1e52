package controlplane

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// lineCounter collects the lines of a text logger, for tests that bound
// what an event may log.
type lineCounter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lineCounter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lineCounter) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *lineCounter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// count returns the lines containing every one of subs (all lines for
// none).
func (l *lineCounter) count(subs ...string) int {
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

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// defaultTestTimeout bounds every wait of these tests.
const defaultTestTimeout = 10 * time.Second
