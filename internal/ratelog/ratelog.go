// Package ratelog bounds the log lines that requests and control-plane
// updates can trigger: at most one line per key per interval, with the
// number of lines suppressed since the last one attached to the next.
package ratelog

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// DefaultInterval is the interval of a [Logger] made with interval <= 0.
const DefaultInterval = 10 * time.Second

// maxKeys bounds the keys a Logger remembers; past it the oldest interval's
// keys are forgotten together, so a flood of distinct keys costs at most
// maxKeys entries and still logs at most maxKeys lines per interval.
const maxKeys = 1024

// Logger writes through an slog.Logger at most once per key per interval.
// The zero value is not usable; a nil *Logger logs nothing. A Logger is
// safe for concurrent use.
type Logger struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	keys    map[string]*entry
	reasons map[string]*budget // by key: distinct reasons logged this interval
}

type entry struct {
	last       time.Time
	suppressed int
}

// New returns a Logger writing to log (nil: slog.Default()) at most once per
// key per interval (<= 0: [DefaultInterval]).
func New(log *slog.Logger, interval time.Duration) *Logger {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Logger{log: log, interval: interval, now: time.Now, keys: make(map[string]*entry), reasons: make(map[string]*budget)}
}

// Slog returns the logger underneath, for lines that no request or update
// can repeat (start-up, shutdown).
func (l *Logger) Slog() *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.log
}

// Warn logs msg at warning level unless key was logged within the interval.
func (l *Logger) Warn(key, msg string, args ...any) { l.logAt(slog.LevelWarn, key, msg, args) }

// Info logs msg at info level unless key was logged within the interval.
func (l *Logger) Info(key, msg string, args ...any) { l.logAt(slog.LevelInfo, key, msg, args) }

// WarnErr logs msg at warning level with err, at most once per key and
// reason (err's text) per interval: a mistake that differs from the last
// one is named at once, while the same one repeated stays one line. At
// most [MaxReasons] distinct reasons are logged for a key per interval;
// the others are counted as suppressed on the key's next line.
func (l *Logger) WarnErr(key, msg string, err error, args ...any) {
	if l == nil || !l.log.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	args = append(args[:len(args):len(args)], "error", err)
	reason := err.Error()
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	rkey := key + "\x00" + reason
	now := l.now()
	l.mu.Lock()
	if _, known := l.keys[rkey]; !known {
		b := l.reasons[key]
		if b == nil || now.Sub(b.since) >= l.interval {
			if b == nil {
				if len(l.reasons) >= maxKeys {
					clear(l.reasons)
				}
				b = &budget{}
				l.reasons[key] = b
			}
			b.since, b.n = now, 0
		}
		if b.n >= MaxReasons {
			b.suppressed++
			l.mu.Unlock()
			return
		}
		b.n++
		if b.suppressed > 0 {
			args = append(args, "other_reasons_suppressed", b.suppressed)
			b.suppressed = 0
		}
	}
	l.mu.Unlock()
	l.logAt(slog.LevelWarn, rkey, msg, args)
}

// MaxReasons bounds the distinct reasons [Logger.WarnErr] logs for one key
// per interval.
const MaxReasons = 64

// maxReasonLen bounds the bytes of a reason kept as part of a key.
const maxReasonLen = 256

type budget struct {
	since         time.Time
	n, suppressed int
}

// Error logs msg at error level unless key was logged within the interval.
func (l *Logger) Error(key, msg string, args ...any) { l.logAt(slog.LevelError, key, msg, args) }

// Debug logs msg at debug level unless key was logged within the interval.
func (l *Logger) Debug(key, msg string, args ...any) { l.logAt(slog.LevelDebug, key, msg, args) }

func (l *Logger) logAt(level slog.Level, key, msg string, args []any) {
	if l == nil || !l.log.Enabled(context.Background(), level) {
		return
	}
	now := l.now()
	l.mu.Lock()
	e := l.keys[key]
	if e != nil && now.Sub(e.last) < l.interval {
		e.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := 0
	if e == nil {
		if len(l.keys) >= maxKeys {
			l.forgetLocked(now)
		}
		e = &entry{}
		l.keys[key] = e
	} else {
		suppressed = e.suppressed
	}
	e.last, e.suppressed = now, 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args[:len(args):len(args)], "suppressed", suppressed)
	}
	l.log.Log(context.Background(), level, msg, args...)
}

// Forget drops what l remembers of key and of the reasons logged under it
// by [Logger.WarnErr], so that the next line for key is written at once.
// A caller calls it on a change of state (a file rejected, then loaded
// again): the line that says so is never suppressed, so the last line a
// reader sees tells the current state. Lines suppressed since key's last
// line are dropped from the count.
func (l *Logger) Forget(key string) {
	if l == nil {
		return
	}
	prefix := key + "\x00"
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.keys, key)
	delete(l.reasons, key)
	for k := range l.keys {
		if strings.HasPrefix(k, prefix) {
			delete(l.keys, k)
		}
	}
}

// forgetLocked drops the keys whose interval has passed, or all of them
// when none has.
func (l *Logger) forgetLocked(now time.Time) {
	for k, e := range l.keys {
		if now.Sub(e.last) >= l.interval {
			delete(l.keys, k)
		}
	}
	if len(l.keys) >= maxKeys {
		clear(l.keys)
	}
}
