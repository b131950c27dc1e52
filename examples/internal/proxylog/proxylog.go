// Package proxylog logs the errors of the examples' reverse proxies and
// servers through a rate limit, so that a flood of failing or cancelled
// requests costs a few lines rather than one line each. A request its own
// client cancelled is logged at debug level only: it is not the proxy's
// failure.
package proxylog

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync/atomic"

	"github.com/inmesh/inmesh/classify"
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

// ClientBody is for an httputil.ReverseProxy's Rewrite: it wraps the
// outgoing request's body so that [Logger.ErrorHandler] tells a body its
// client sent malformed (a bad chunk, a body cut short) from a failure of
// the upstream.
func ClientBody(pr *httputil.ProxyRequest) {
	if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
		pr.Out.Body = &clientBody{ReadCloser: pr.Out.Body}
	}
}

// clientBody records the first error of reading a request's body from its
// client.
type clientBody struct {
	io.ReadCloser
	failed atomic.Bool
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.failed.Store(true)
	}
	return n, err
}

// clientBodyFailed reports whether r's body (wrapped by ClientBody) failed
// as its client sent it.
func clientBodyFailed(r *http.Request) bool {
	b, ok := r.Body.(*clientBody)
	return ok && b.failed.Load()
}

// ErrorHandler is an httputil.ReverseProxy ErrorHandler: it answers 502
// (504 for a timeout; gRPC requests with the matching gRPC status), marked
// with l5d-proxy-error, and logs one line per kind of error and interval.
// A request whose client went away (classify.Abandoned) is logged at
// debug level and its response aborted with http.ErrAbortHandler, as
// httputil.ReverseProxy aborts one it cannot finish: the connection (an
// HTTP/2 stream) closes without an answer. Writing none would not do, for
// net/http then sends an empty 200 in the application's name, which a
// client that only half-closed its connection reads; an answer would be
// counted by the inbound metrics as the server's response (Linkerd's proxy
// records none for it). A request that is its client's fault is
// answered 4xx (501 for an HTTP/2 CONNECT, which is not forwarded; 400 for
// a body its client sent malformed, see [ClientBody]) and logged at debug
// level.
func (l *Logger) ErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusBadGateway
	kind := kindOf(err)
	switch {
	case errors.Is(err, origproto.ErrConnectOverHTTP2):
		l.rl.Debug(l.name+"/connect", "HTTP/2 CONNECT refused", "listener", l.name)
		proxyerr.Write(w, r, http.StatusNotImplemented, "CONNECT over HTTP/2 is not forwarded")
		return
	case clientBodyFailed(r):
		l.rl.Debug(l.name+"/body", "malformed request body", "listener", l.name, "error", err)
		proxyerr.Write(w, r, http.StatusBadRequest, "malformed request body")
		return
	case classify.Abandoned(r.Context()):
		l.rl.Debug(l.name+"/cancelled", "request cancelled by its client", "listener", l.name, "error", err)
		panic(http.ErrAbortHandler)
	case r.Context().Err() != nil || errors.Is(err, context.Canceled):
		l.rl.Debug(l.name+"/cancelled", "request cancelled", "listener", l.name, "error", err)
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

// BadRequest answers a request that is its client's mistake with 400 and
// reason in l5d-proxy-error, logged at debug level.
func (l *Logger) BadRequest(w http.ResponseWriter, r *http.Request, reason string) {
	l.rl.Debug(l.name+"/bad-request", "bad request", "listener", l.name, "reason", reason)
	proxyerr.Write(w, r, http.StatusBadRequest, reason)
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
