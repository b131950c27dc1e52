package authz

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/internal/ratelog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// defaultMaxPorts bounds the ports a Handler keeps a policy for: the
// ports of the server's own listeners, never chosen by clients.
const defaultMaxPorts = 1024

// Handler enforces the inbound policy of each port on every request
// before passing it to the next handler. The port is the one the request's
// connection was accepted on (http.LocalAddrContextKey; 0 when unknown),
// the client's address is r.RemoteAddr, and its mesh TLS and verified
// identity are what the identity layer in front put in the context
// ([identity.PeerFromContext]; none means plaintext, labelled
// tls="disabled"). A port's policy is its [Source]'s Server; a request to
// a port whose first answer is pending waits for it, up to a bound
// ([WithPolicyWait]), and only past the bound, or for a port the Source
// has no Server for, does the default ([WithDefault]) decide. It is safe
// for concurrent use; [Handler.Close] stops its watches, and fails closed
// for the ports whose policy it never learned.
type Handler struct {
	next   http.Handler
	cfg    config
	def    *Policy
	in     *instruments
	log    *ratelog.Logger
	ports  atomic.Pointer[map[uint16]*port]
	mu     sync.Mutex // serializes adding ports and Close
	closed bool
}

var _ http.Handler = (*Handler)(nil)

// port is the state of one port: its current policy, its requests in
// flight and, until the Source's first answer, what its requests wait on.
type port struct {
	h        *Handler
	num      uint16
	cur      atomic.Pointer[active]
	inflight atomic.Int64
	stop     func()

	// pending is true while requests go through wait: while they wait
	// for the first answer, and for good once the port is refused.
	// answered is closed when the wait ends (the first answer, the
	// bound, Close). refused is set (before pending) when the Handler
	// closed before the Source answered for the port: its requests are
	// refused from then on.
	pending  atomic.Bool
	refused  atomic.Bool
	answered chan struct{}
	timer    *time.Timer
	mu       sync.Mutex // orders the first answer, the bound and Close
	late     bool       // the bound passed before the first answer
	got      bool       // the Source answered (a Server or none)
}

// ErrClosed is what [Handler.WaitPolicy] returns for a port whose policy
// the Source never answered before [Handler.Close]: its requests are
// refused (503, as those whose context ends while they wait), not decided
// by the default.
var ErrClosed = errors.New("authz: handler closed before the port's inbound policy was known")

// active is a policy in force on a port, with its series. fallback marks
// the default put in force because the Source did not answer within the
// wait: the requests it decides are counted as such.
type active struct {
	pol      *Policy
	series   *seriesCache
	fallback []metric.AddOption
}

// New returns a Handler enforcing the policies of opts before next. It
// fails only when the default Server does not compile.
func New(next http.Handler, opts ...Option) (*Handler, error) {
	cfg := config{now: time.Now, maxPorts: defaultMaxPorts, wait: DefaultPolicyWait}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.def == nil {
		cfg.def, _ = DefaultServer(AllUnauthenticated, DefaultOptions{})
	}
	def, err := Compile(cfg.def)
	if err != nil {
		return nil, fmt.Errorf("authz: default server: %w", err)
	}
	h := &Handler{
		next: next, cfg: cfg, def: def,
		in:  newInstruments(metrics.Meter(cfg.mp, "github.com/inmesh/inmesh/authz")),
		log: ratelog.New(cfg.logger, 0),
	}
	h.ports.Store(&map[uint16]*port{})
	if cfg.target.IsValid() {
		h.port(cfg.target.Port())
	}
	h.WatchPorts(cfg.ports...)
	return h, nil
}

// WatchPorts starts the watches of ports, those the server serves, if
// they have not started yet, so that their policies are on their way
// before their first requests ([WithPorts] at construction). With
// [WithTarget], whose port is watched from the start, it does nothing.
func (h *Handler) WatchPorts(ports ...uint16) {
	if h.cfg.target.IsValid() {
		return
	}
	for _, p := range ports {
		h.port(p)
	}
}

// WaitPolicy waits until the policy that decides the requests arriving on
// local (its port, or the [WithTarget] port) is known: the Source's first
// answer, or the default once the wait's bound ([WithPolicyWait]) has
// passed. It returns at once when it is known, ctx's error when ctx ends
// first, and [ErrClosed] once the Handler is closed without the Source
// having answered for the port. [Handler.Decide] waits the same way, under the request's
// context; a server whose requests carry no context of their own (such as
// grpc-go's) calls it first.
func (h *Handler) WaitPolicy(ctx context.Context, local netip.AddrPort) error {
	target := h.cfg.target
	if !target.IsValid() {
		target = local
	}
	return h.port(target.Port()).wait(ctx)
}

// wait waits for the port's first answer or the end of the bound.
func (p *port) wait(ctx context.Context) error {
	if !p.pending.Load() {
		return nil
	}
	if p.refused.Load() {
		return ErrClosed
	}
	select {
	case <-p.answered:
		if p.refused.Load() {
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the Handler's watches; requests after it keep the last
// policies the Source answered. It fails closed for the others: a port
// the Source never answered for, including one first seen after Close,
// refuses its requests (503 "inbound policy not yet known", as a request
// whose context ends while it waits), those waiting at Close included,
// rather than letting them through under the default.
func (h *Handler) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for _, p := range *h.ports.Load() {
		if p.stop != nil {
			p.stop()
		}
		p.close()
	}
}

// ConnLabels returns the labels Linkerd's proxy gives a connection
// accepted on local (tcp_*{direction="inbound",peer="src"}) besides its
// direction, peer and TLS: its target (target_addr, target_ip and
// target_port: local, or the [WithTarget] address) and the srv_* labels
// of the Server in force on the target's port, as the metrics of the
// requests it allows carry them. known is false while the port's first
// answer is pending, its requests waiting for it ([WithPolicyWait]): the
// labels are then the default's, which decides them only if the wait ends
// first. It starts the port's watch if it has not started; the labels are
// made once per policy and target.
func (h *Handler) ConnLabels(local netip.AddrPort) (l *classify.Labels, known bool) {
	target := h.cfg.target
	if !target.IsValid() {
		target = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	}
	p := h.port(target.Port())
	// The policy answered is put in force before the wait ends: read in
	// that order, a known port's labels are the answer's.
	known = !p.pending.Load()
	return p.cur.Load().series.connLabels(target), known
}

// Policy returns the policy in force on port, starting its watch if the
// port has not been seen yet.
func (h *Handler) Policy(portNum uint16) *Policy {
	return h.port(portNum).cur.Load().pol
}

func (h *Handler) port(num uint16) *port {
	if p := (*h.ports.Load())[num]; p != nil {
		return p
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.ports.Load()
	if p := old[num]; p != nil {
		return p
	}
	p := &port{h: h, num: num}
	p.cur.Store(&active{pol: h.def, series: newSeriesCache(h.in, h.def, h.cfg.nextFor)})
	if h.closed && h.cfg.source != nil {
		// No Source will answer for it: refused, not remembered.
		p.refused.Store(true)
		p.pending.Store(true)
		return p
	}
	if len(old) >= h.cfg.maxPorts || h.closed {
		return p // served with the default, not remembered
	}
	if h.cfg.source != nil && h.cfg.wait > 0 {
		// The port's requests wait for the first answer, up to the bound
		// from now. The wait is set before the port is published, so that
		// no request on another goroutine can find the port without it
		// (and be decided by the default), and the timer exists before
		// the Source may answer from Watch itself.
		p.answered = make(chan struct{})
		p.pending.Store(true)
		p.timer = time.AfterFunc(h.cfg.wait, p.expire)
	}
	m := make(map[uint16]*port, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[num] = p
	h.ports.Store(&m)
	if h.cfg.source != nil {
		p.stop = h.cfg.source.Watch(num, p.update)
	}
	return p
}

// update compiles s and puts it in force; a Server that does not compile
// is logged and the last good policy stays (while no answer came, the
// port's requests keep waiting). nil is the Source's answer that it has
// no Server for the port: the policy in force (the default, unless a
// Server came before) stays, and waiting requests go on under it.
func (p *port) update(s *Server) {
	if s == nil {
		p.release(nil)
		return
	}
	pol, err := Compile(s)
	if err != nil {
		// As Linkerd's proxy: the port refuses every request until a
		// Server that compiles arrives (see InvalidServer).
		p.h.log.WarnErr("update", "inbound policy refused; every request to the port is denied until a valid one arrives", err, "port", p.num)
		if pol, err = Compile(InvalidServer()); err != nil {
			panic("authz: the invalid Server does not compile: " + err.Error())
		}
	}
	p.release(&active{pol: pol, series: newSeriesCache(p.h.in, pol, p.h.cfg.nextFor)})
}

// release puts a in force (unless nil) and ends the wait for the first
// answer, if it is pending.
func (p *port) release(a *active) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refused.Load() {
		return // an answer racing Close: the port stays refused
	}
	p.got = true
	if a != nil {
		p.cur.Store(a)
	} else if cur := p.cur.Load(); cur.fallback != nil {
		// The Source says it has none: the default is the answer now,
		// no longer a fallback.
		p.cur.Store(&active{pol: cur.pol, series: cur.series})
	}
	if p.late {
		p.late = false
		p.h.log.Info("policy arrived "+strconv.Itoa(int(p.num)), "inbound policy arrived after the wait; in force now",
			"port", p.num, "server", p.cur.Load().pol.server.Meta.Name)
	}
	p.endWaitLocked()
}

// close fails the port closed unless the Source has answered for it:
// its requests, those waiting included, are refused from now on.
func (p *port) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.got || p.h.cfg.source == nil {
		return
	}
	p.refused.Store(true)
	if p.pending.Load() {
		p.timer.Stop()
		close(p.answered)
		return
	}
	p.pending.Store(true) // its requests go through wait, which refuses
}

func (p *port) endWaitLocked() {
	if !p.pending.Load() {
		return
	}
	p.timer.Stop()
	p.pending.Store(false)
	close(p.answered)
}

// expire ends the wait for the first answer once its bound has passed:
// the default decides, logged (with the Source's [PendingCause], if it
// has one) and counted, until the Source answers.
func (p *port) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.pending.Load() || p.refused.Load() {
		return
	}
	cur := p.cur.Load()
	p.cur.Store(&active{pol: cur.pol, series: cur.series, fallback: metrics.Opts(attribute.Int("target_port", int(p.num)))})
	p.late = true
	args := []any{"port", p.num, "wait", p.h.cfg.wait, "default", cur.pol.server.Meta.Name}
	if pc, ok := p.h.cfg.source.(PendingCause); ok {
		// Why the control plane has not answered, so that the line says
		// more than that time passed.
		if err := pc.Pending(p.num); err != nil {
			args = append(args, "error", err)
		}
	}
	p.h.log.Warn("policy wait "+strconv.Itoa(int(p.num)),
		"no inbound policy from the control plane within the wait; the default policy decides until it answers",
		args...)
	p.pending.Store(false)
	close(p.answered)
}

// The causes that l5d-proxy-error gives, as Linkerd's proxy words them.
const (
	causeUnauthorized = "unauthorized request on route"
	causeNoRoute      = "no route found for request"
	// inmesh's own, for a request whose context ended while it waited
	// for its port's first policy.
	causePolicyPending = "inbound policy not yet known"
	// inmesh's own, for a path the application could read otherwise than
	// the routes matched it.
	causeAmbiguousPath = "request path has dot-segments or an encoded '/' or '.', or is a gRPC method with an escape"
)

// ambiguousPath reports whether a request path could be authorized as one
// path and served as another: a dot-segment ("/public/../orders"), in the
// decoded path (so "%2e%2e" too), or an encoded "/" or "." in the raw one.
// Such requests are refused with 400 rather than normalized (beyond
// Linkerd, which matches the raw path). Under gRPC routes, which match
// the method as sent (grpc-go's own transport dispatches on it), any
// escape is refused as well (Decide): grpc-go's ServeHTTP, as an
// application behind the stack, dispatches on the decoded path, so that
// "/pkg.Svc/%45mptyCall" would be authorized as one method and served as
// EmptyCall. No protobuf service or method name needs an escape.
func ambiguousPath(path, raw string) bool {
	for i := 0; i < len(path); {
		j := strings.IndexByte(path[i:], '/')
		end := len(path)
		if j >= 0 {
			end = i + j
		}
		if seg := path[i:end]; seg == "." || seg == ".." {
			return true
		}
		if j < 0 {
			break
		}
		i = end + 1
	}
	for i := 0; i+2 < len(raw); i++ {
		if raw[i] == '%' && raw[i+1] == '2' {
			switch raw[i+2] {
			case 'e', 'E', 'f', 'F':
				return true
			}
		}
	}
	return false
}

// escapedPath reports whether r's path was sent with a percent-escape:
// its URL keeps a raw path, or its request target, as the server read it,
// has a '%' before the query.
func escapedPath(r *http.Request) bool {
	if r.URL.RawPath != "" {
		return true
	}
	target, _, _ := strings.Cut(r.RequestURI, "?")
	return strings.IndexByte(target, '%') >= 0
}

// ServeHTTP authorizes r under its port's current policy: an ambiguous
// path is 400; no route 404 (gRPC NOT_FOUND); no authorization of the
// route, of the Server or of localhost admitting the client 403
// (PERMISSION_DENIED); then the route's filters; then the rate limits 429
// (RESOURCE_EXHAUSTED) and the in-flight limit 503 (UNAVAILABLE); then the
// next handler. Allowing allocates nothing, header modifiers aside (they
// edit a copy of r).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := Conn{Local: localAddr(r)}
	c.Remote, _ = netip.ParseAddrPort(r.RemoteAddr)
	c.Peer, c.HasPeer = identity.PeerFromContext(r.Context())
	d := h.Decide(r, c)
	if d.Status != 0 {
		h.refuse(w, r, &d)
		return
	}
	cloned := false
	for i := range d.Route.Filters {
		f := &d.Route.Filters[i]
		switch {
		case f.RequestHeaders != nil:
			if !cloned {
				r = r.Clone(r.Context())
				cloned = true
			}
			f.RequestHeaders.Apply(r.Header)
		case f.Redirect != nil:
			loc, same, err := f.Redirect.Location(r, d.Match)
			if err != nil {
				d.Refuse(http.StatusInternalServerError, err.Error())
				h.refuse(w, r, &d)
				return
			}
			if same {
				continue // a redirect to the URL asked for does nothing
			}
			w.Header().Set("Location", loc)
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(f.Redirect.StatusCode())
			return
		case f.GRPCFailureInjector != nil:
			fi := f.GRPCFailureInjector
			if prob := fi.Ratio.Probability(); prob >= 1 || rand.Float64() < prob {
				hdr := w.Header()
				hdr["Content-Type"] = []string{"application/grpc"}
				hdr["Grpc-Status"] = []string{strconv.Itoa(int(fi.Code))}
				if fi.Message != "" {
					hdr["Grpc-Message"] = []string{fi.Message}
				}
				hdr["Content-Length"] = []string{"0"}
				w.WriteHeader(http.StatusOK)
				return
			}
		case f.FailureInjector != nil:
			fi := f.FailureInjector
			if prob := fi.Ratio.Probability(); prob >= 1 || rand.Float64() < prob {
				d.Refuse(fi.Status, fi.Message)
				h.refuse(w, r, &d)
				return
			}
		}
	}
	if !h.Admit(&d) {
		h.refuse(w, r, &d)
		return
	}
	tap.NoteDecision(r.Context(), "allowed", d.routeName())
	defer d.Done()
	switch {
	case d.next != nil:
		// WithLabelledNext: the series' own handler (made anew for a
		// series past those the policy keeps).
		d.next.ServeHTTP(w, r)
		return
	case h.cfg.metricLabels:
		r = r.WithContext(classify.WithLabels(r.Context(), d.labels))
	}
	h.next.ServeHTTP(w, r)
}

func limitCause(s limitScope, rps uint32) string {
	n := strconv.FormatUint(uint64(rps), 10)
	switch s {
	case limitTotal:
		return "total rate limit exceeded: " + n + "rps"
	case limitOverride:
		return "override rate limit exceeded: " + n + "rps"
	}
	return "per-identity rate limit exceeded: " + n + "rps"
}

func tlsOf(peer identity.Peer, hasPeer bool, ip netip.Addr) tlsState {
	switch {
	case peer.TLS:
		return tlsTrue
	case !hasPeer:
		return tlsDisabled
	case ip.IsLoopback():
		return tlsLoopback
	}
	return tlsNoIdentity
}

// localAddr is the address the request's connection was accepted on.
func localAddr(r *http.Request) netip.AddrPort {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// refuse answers r as the mesh: an empty response with d's status, as a
// gRPC status to gRPC requests; the reason in l5d-proxy-error (and
// grpc-message) only to meshed clients, as Linkerd's proxy.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, d *Decision) {
	code := d.Status
	tap.NoteDecision(r.Context(), refusal(code), d.routeName())
	resp := proxyerr.Response(r, code, d.Message())
	hdr := w.Header()
	for k, v := range resp.Header {
		if !d.meshed && (k == proxyerr.Header || k == "Grpc-Message") {
			continue
		}
		if k == "Content-Type" && resp.StatusCode == code {
			continue // an HTTP answer is empty: no content type
		}
		hdr[k] = v
	}
	hdr["Content-Length"] = []string{"0"}
	w.WriteHeader(resp.StatusCode)
}

// refusal names a refused request's decision for tap.
func refusal(status int) string {
	switch status {
	case http.StatusForbidden:
		return "denied"
	case http.StatusTooManyRequests:
		return "rate-limited"
	case http.StatusServiceUnavailable:
		return "overloaded"
	case http.StatusNotFound:
		return "no-route"
	case http.StatusBadRequest:
		return "bad-request"
	}
	return "refused"
}

func (d *Decision) routeName() string {
	if d.Route == nil {
		return ""
	}
	return d.Route.Meta.Name
}
