// Package proxylog logs the errors of the examples' reverse proxies and
// servers through a rate limit, so that a flood of failing or cancelled
// requests costs a few lines rather than one line each. A request its own
// client cancelled is logged at debug level only: it is not the proxy's
// failure.
package proxylog

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/internal/ratelog"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

// Logger is the rate-limited logger of one proxy or server.
type Logger struct {
	rl   *ratelog.Logger
	name string
}

// New returns a Logger writing to log (nil: slog.Default()) under the
// listener name (outbound, inbound), at most once per kind of error per
// ratelog.DefaultInterval.
func New(log *slog.Logger, name string) *Logger {
	return &Logger{rl: ratelog.New(log, 0), name: name}
}

// ErrorHandler is an httputil.ReverseProxy ErrorHandler: it answers 502
// (504 for a timeout; gRPC requests with the matching gRPC status), marked
// with l5d-proxy-error, and logs one line per kind of error and interval; a
// request whose client went away is answered the same way and logged at
// debug level.
func (l *Logger) ErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusBadGateway
	kind := kindOf(err)
	switch {
	case r.Context().Err() != nil || errors.Is(err, context.Canceled):
		l.rl.Debug(l.name+"/cancelled", "request cancelled by its client", "listener", l.name, "error", err)
	case kind == "timeout":
		code = http.StatusGatewayTimeout
		fallthrough
	default:
		l.rl.Warn(l.name+"/"+kind, "proxy error", "listener", l.name, "kind", kind, "error", err)
	}
	msg := "upstream request failed: " + kind
	if kind == "identity" {
		msg += ": " + err.Error() // which identity could not be verified, and why
	}
	// A gRPC client reads the error as a gRPC status (UNAVAILABLE,
	// DEADLINE_EXCEEDED), as Linkerd's proxy answers it.
	proxyerr.Write(w, r, code, msg)
}

func kindOf(err error) string {
	var upgrade *origproto.UpgradeError
	var op *net.OpError
	var ne net.Error
	var id *identity.IdentityError
	switch {
	case errors.As(err, &id):
		return "identity"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &upgrade):
		return "upgrade"
	case errors.As(err, &op) && op.Op == "dial":
		return "dial"
	default:
		return "other"
	}
}

// ErrorLog returns a *log.Logger for http.Server.ErrorLog and
// httputil.ReverseProxy.ErrorLog. Each message is keyed by its first words,
// up to the first that holds an address or a number (they name the failing
// operation, not the peer), and logged at warning level, or at debug level
// when it reports a client that went away.
func (l *Logger) ErrorLog() *log.Logger { return log.New(writer{l}, "", 0) }

type writer struct{ l *Logger }

func (w writer) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	key := keyOf(msg)
	if clientGone(msg) {
		w.l.rl.Debug(w.l.name+"/log/"+key, msg, "listener", w.l.name)
	} else {
		w.l.rl.Warn(w.l.name+"/log/"+key, msg, "listener", w.l.name)
	}
	return len(p), nil
}

// clientGone reports whether a net/http log line is about a client that
// cancelled its request or closed its connection.
func clientGone(msg string) bool {
	for _, s := range []string{"context canceled", "client disconnected", "connection reset by peer", "broken pipe", "; CANCEL"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// keyOf returns the first words of a net/http log message, which name
// what failed, up to the first word that names a peer or a number.
func keyOf(msg string) string {
	words := strings.Fields(msg)
	n := 0
	for n < len(words) && n < 4 && !strings.ContainsAny(words[n], "0123456789[/") {
		n++
	}
	return strings.Join(words[:n], " ")
}
