// Package tap is the live view of the requests a mesh stack handles, as
// Linkerd's `linkerd viz tap` shows them: one [Event] per request (method,
// authority, path, route, status, latency, identities, retries; never a
// body, and a header value only when the [Hub] is told to keep it),
// delivered to whoever watches with a [Filter].
//
// A [Hub] costs a request one atomic load while nobody watches: the stack's
// wrappers ([Hub.Handler] inbound, [Hub.Transport] outbound) build no event
// and add no context. A watcher has a bounded buffer; when it is full (a
// slow or stalled viewer) its events are dropped and counted, and the
// request never waits.
//
// [Hub.ServeHTTP] streams events to HTTP clients: Server-Sent Events to a
// browser (Accept: text/event-stream) and one JSON object per line
// otherwise, filtered by the query parameters authority, path (a prefix),
// method, status, route and direction.
package tap

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Event is one request as the mesh saw it.
type Event struct {
	// Time is when the request arrived.
	Time time.Time `json:"time"`
	// Direction is "inbound" (a server's request) or "outbound" (a
	// client's).
	Direction string `json:"direction"`
	Method    string `json:"method"`
	Authority string `json:"authority"`
	Path      string `json:"path"`
	// Route is the route the mesh chose (profile route or policy route
	// name), empty when none was named.
	Route string `json:"route,omitempty"`
	// Status is the HTTP status of the response, 0 when none arrived.
	Status int `json:"status"`
	// GRPCStatus is the grpc-status of a gRPC response, -1 when none.
	GRPCStatus int `json:"grpcStatus"`
	// Error says why the request failed: without a response, or with
	// its response broken off (a body that failed, a handler that
	// aborted).
	Error string `json:"error,omitempty"`
	// LatencyMillis is the time to the response head, in milliseconds.
	LatencyMillis float64 `json:"latencyMillis"`
	// ClientID is the client's TLS-verified identity (inbound), ServerID
	// the identity the server proved in the mesh's mTLS handshake
	// (outbound; empty over plaintext).
	ClientID string `json:"clientId,omitempty"`
	ServerID string `json:"serverId,omitempty"`
	// Retries is the number of retries the mesh made, Hedges the number
	// of hedged attempts it sent to another endpoint.
	Retries int `json:"retries"`
	Hedges  int `json:"hedges"`
	// Decision is the inbound policy's answer: allowed, denied,
	// rate-limited, overloaded, not-found; empty without a policy.
	Decision string `json:"decision,omitempty"`
	// Headers holds the request headers the hub keeps ([WithHeaders]).
	Headers map[string]string `json:"headers,omitempty"`
}

// Filter selects events; an empty field matches all.
type Filter struct {
	Direction  string
	Authority  string
	PathPrefix string
	Method     string
	Route      string
	// Status matches an exact status (404), or a class given as its first
	// digit (5 for every 5xx); 0 matches all.
	Status int
}

// Match reports whether e passes f.
func (f Filter) Match(e *Event) bool {
	switch {
	case f.Direction != "" && f.Direction != e.Direction,
		f.Authority != "" && !strings.EqualFold(f.Authority, e.Authority),
		f.PathPrefix != "" && !strings.HasPrefix(e.Path, f.PathPrefix),
		f.Method != "" && !strings.EqualFold(f.Method, e.Method),
		f.Route != "" && f.Route != e.Route:
		return false
	case f.Status == 0:
		return true
	case f.Status < 10:
		return e.Status/100 == f.Status
	}
	return e.Status == f.Status
}

// ParseFilter reads a Filter from query parameters (direction, authority,
// path, method, route, status).
func ParseFilter(q map[string][]string) (Filter, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	f := Filter{Direction: get("direction"), Authority: get("authority"), PathPrefix: get("path"), Method: get("method"), Route: get("route")}
	if f.Direction != "" && f.Direction != "inbound" && f.Direction != "outbound" {
		return Filter{}, &filterError{"direction", f.Direction, `"inbound" or "outbound"`}
	}
	if s := get("status"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || !(n >= 1 && n <= 5 || n >= 100 && n <= 599) {
			return Filter{}, &filterError{"status", s, "a status (100-599) or a class (1-5)"}
		}
		f.Status = n
	}
	return f, nil
}

type filterError struct{ field, value, want string }

func (e *filterError) Error() string {
	return "tap: filter " + e.field + "=" + strconv.Quote(e.value) + ": want " + e.want
}

// DefaultBuffer is the events a watcher may fall behind by before its
// events are dropped.
const DefaultBuffer = 256

// Option configures a [Hub].
type Option func(*Hub)

// WithHeaders makes events carry the values of the named request headers
// (as they arrived); no header value is kept otherwise.
func WithHeaders(names ...string) Option {
	return func(h *Hub) {
		for _, n := range names {
			h.headers = append(h.headers, http.CanonicalHeaderKey(n))
		}
	}
}

// WithMaxWatchers bounds the watchers at once (default 64); past it
// [Hub.Watch] fails with [ErrTooManyWatchers].
func WithMaxWatchers(n int) Option { return func(h *Hub) { h.maxWatchers = n } }

// WithAccess replaces the rule of which clients [Hub.ServeHTTP] serves
// (default: loopback clients only; events carry paths and headers of the
// requests, so a remote reader must be admitted on purpose).
func WithAccess(allow func(*http.Request) bool) Option { return func(h *Hub) { h.access = allow } }

// DefaultWriteTimeout is how long a write to a viewer's stream may take
// before [Hub.Stream] gives the stream up.
const DefaultWriteTimeout = 10 * time.Second

// WithWriteTimeout sets how long a write to a viewer's stream may take
// (default [DefaultWriteTimeout]): a viewer that stops reading is dropped
// then, and its watcher slot freed, rather than holding it for as long as
// its connection lasts. A value <= 0 keeps the default.
func WithWriteTimeout(d time.Duration) Option {
	return func(h *Hub) {
		if d > 0 {
			h.writeTimeout = d
		}
	}
}

// Hub delivers the events of the stacks it is given to to its watchers.
// The zero value is not usable; call [NewHub].
type Hub struct {
	headers      []string
	maxWatchers  int
	access       func(*http.Request) bool
	writeTimeout time.Duration

	// active counts watchers and observers: while it is zero, requests
	// build no event.
	active atomic.Int32

	mu        sync.Mutex
	watchers  []*Watcher
	observers []*observer
	dropped   atomic.Uint64
	published atomic.Uint64
}

// NewHub returns a Hub with no watchers.
func NewHub(opts ...Option) *Hub {
	h := &Hub{maxWatchers: 64, writeTimeout: DefaultWriteTimeout}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Active reports whether anyone watches or observes, so that a caller
// builds an event only then.
func (h *Hub) Active() bool { return h != nil && h.active.Load() > 0 }

// Stats are a hub's counters.
type Stats struct {
	Watchers  int    `json:"watchers"`
	Published uint64 `json:"published"`
	// Dropped counts events a watcher's full buffer lost.
	Dropped uint64 `json:"dropped"`
}

// Stats returns the hub's counters.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	n := len(h.watchers)
	h.mu.Unlock()
	return Stats{Watchers: n, Published: h.published.Load(), Dropped: h.dropped.Load()}
}

// Observe calls f with every event as it is published, when its response
// ends (on the goroutine that served the request or read the end of its
// response); f must be quick and must not keep e. It is for in-process
// aggregates (a dashboard's route table); watchers that may be slow use
// [Hub.Watch]. The returned function stops it.
func (h *Hub) Observe(f func(e *Event)) (stop func()) {
	o := &observer{f: f}
	h.mu.Lock()
	h.observers = append(slices.Clone(h.observers), o)
	h.mu.Unlock()
	h.activate(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			if i := slices.Index(h.observers, o); i >= 0 {
				h.observers = slices.Delete(slices.Clone(h.observers), i, i+1)
			}
			h.mu.Unlock()
			h.activate(-1)
		})
	}
}

type observer struct{ f func(*Event) }

func (h *Hub) activate(n int32) {
	h.active.Add(n)
	tapped.Add(n)
}

// ErrTooManyWatchers is the error of [Hub.Watch] past [WithMaxWatchers].
var ErrTooManyWatchers = errorString("tap: too many watchers")

type errorString string

func (e errorString) Error() string { return string(e) }

// Watcher receives the events that pass its filter.
type Watcher struct {
	h       *Hub
	filter  Filter
	events  chan Event
	dropped atomic.Uint64
	once    sync.Once
}

// Watch starts a watcher of the events that pass f, with a buffer of
// buffer events (DefaultBuffer when 0 or less). Close it when done.
func (h *Hub) Watch(f Filter, buffer int) (*Watcher, error) {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	w := &Watcher{h: h, filter: f, events: make(chan Event, buffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.watchers) >= h.maxWatchers {
		return nil, ErrTooManyWatchers
	}
	h.watchers = append(slices.Clone(h.watchers), w)
	h.activate(1)
	return w, nil
}

// Events is the watcher's stream; it is never closed.
func (w *Watcher) Events() <-chan Event { return w.events }

// Dropped counts the events this watcher lost to a full buffer.
func (w *Watcher) Dropped() uint64 { return w.dropped.Load() }

// Close stops the watcher.
func (w *Watcher) Close() {
	w.once.Do(func() {
		h := w.h
		h.mu.Lock()
		defer h.mu.Unlock()
		if i := slices.Index(h.watchers, w); i >= 0 {
			h.watchers = slices.Delete(slices.Clone(h.watchers), i, i+1)
		}
		h.activate(-1)
	})
}

// Publish delivers e to the observers and to each watcher whose filter it
// passes, never blocking: a full watcher loses it, counted.
func (h *Hub) Publish(e *Event) {
	h.published.Add(1)
	h.mu.Lock()
	obs, ws := h.observers, h.watchers
	h.mu.Unlock()
	for _, o := range obs {
		o.f(e)
	}
	for _, w := range ws {
		if !w.filter.Match(e) {
			continue
		}
		select {
		case w.events <- *e:
		default:
			w.dropped.Add(1)
			h.dropped.Add(1)
		}
	}
}

// slot is what the layers inside a tapped request tell the tap: the route,
// the retries, the policy's decision, the server's identity. It rides the
// request's context only while the hub is active.
type slot struct {
	route    string
	retries  int
	hedges   int
	decision string

	// mu guards serverID, which the attempts of a hedged request note
	// from their own goroutines.
	mu       sync.Mutex
	serverID string
}

func (s *slot) server() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serverID
}

type slotKey struct{}

// tapped counts the active hubs of the process, so that a layer inside the
// stack skips the context lookup of [NoteRoute] while nobody taps.
var tapped atomic.Int32

// NoteRoute tells a tapped request's event the route it took; the router
// calls it as it selects the route. Without a tap it costs an atomic load.
func NoteRoute(ctx context.Context, route string) {
	if tapped.Load() == 0 {
		return
	}
	if s, ok := ctx.Value(slotKey{}).(*slot); ok {
		s.route = route
	}
}

// NoteRetry counts a retry in a tapped request's event; the exchange
// calls it as it sends one.
func NoteRetry(ctx context.Context) {
	if tapped.Load() == 0 {
		return
	}
	if s, ok := ctx.Value(slotKey{}).(*slot); ok {
		s.retries++
	}
}

// NoteHedge counts a hedged attempt in a tapped request's event; the
// router calls it as it sends one.
func NoteHedge(ctx context.Context) {
	if tapped.Load() == 0 {
		return
	}
	if s, ok := ctx.Value(slotKey{}).(*slot); ok {
		s.hedges++
	}
}

// NoteDecision tells a tapped inbound request's event the policy's
// decision and the route it chose.
func NoteDecision(ctx context.Context, decision, route string) {
	if tapped.Load() == 0 {
		return
	}
	if s, ok := ctx.Value(slotKey{}).(*slot); ok {
		s.decision = decision
		if route != "" && s.route == "" {
			s.route = route
		}
	}
}

// NoteServer tells a tapped outbound request's event the identity that its
// server proved: the transport that verified it in the mTLS handshake
// calls it as the response arrives. Of the attempts of a retried or hedged
// request, the last to note its server names it. Without a tap it costs an
// atomic load.
func NoteServer(ctx context.Context, id string) {
	if tapped.Load() == 0 {
		return
	}
	if s, ok := ctx.Value(slotKey{}).(*slot); ok {
		s.mu.Lock()
		s.serverID = id
		s.mu.Unlock()
	}
}
