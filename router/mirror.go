package router

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/mirror"
	"github.com/inmesh/inmesh/policy"
)

// The defaults of [MirrorLimits].
const (
	// DefaultMirrorInFlight bounds the mirrored requests in flight of one
	// route.
	DefaultMirrorInFlight = 64
	// DefaultMirrorTimeout bounds each mirrored request, response body
	// included.
	DefaultMirrorTimeout = 10 * time.Second
	// DefaultMirrorBodyBytes is the largest request body copied to a
	// mirror, the retry replay limit (64 KiB, as Linkerd's).
	DefaultMirrorBodyBytes = policy.DefaultMaxRequestBytes
)

// MirrorLimits bound the copies a policy route's mirrors send (see
// [policy.Mirror]); zero fields mean the defaults.
type MirrorLimits struct {
	// InFlight is the number of copies of one route in flight at once
	// (all of its mirrors together); past it a copy is dropped and counted
	// with result="dropped". Default [DefaultMirrorInFlight].
	InFlight int
	// Timeout bounds each copy. Default [DefaultMirrorTimeout].
	Timeout time.Duration
	// BodyBytes is the largest request body copied; a request with a
	// larger body is not mirrored (result="body_too_large"). Default
	// [DefaultMirrorBodyBytes].
	BodyBytes int64
}

func (l MirrorLimits) withDefaults() MirrorLimits {
	if l.InFlight <= 0 {
		l.InFlight = DefaultMirrorInFlight
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultMirrorTimeout
	}
	if l.BodyBytes <= 0 {
		l.BodyBytes = DefaultMirrorBodyBytes
	}
	return l
}

// WithMirrorLimits sets the bounds of the request mirrors of policy routes
// (in flight per route, time per copy, body size); zero fields keep the
// defaults.
func WithMirrorLimits(l MirrorLimits) Option {
	return optionFunc(func(c *config) { c.mirror = l })
}

// mirrorer sends the copies of one route's requests.
type mirrorer struct {
	r       *Router
	limits  MirrorLimits
	targets []mirrorTarget // by position in route.Mirrors
	// inFlight counts the copies sent and not yet finished.
	inFlight atomic.Int64
}

// mirrorTarget is one mirror of a route.
type mirrorTarget struct {
	m      *policy.Mirror
	bc     *balancer.BackendConfig
	series *metrics.MirrorTarget
	// down backs off a mirror whose copies get no response.
	down mirror.Backoff
}

// mirrorer returns the mirrorer of a route, nil when it has no mirrors.
func (r *Router) mirrorer(route *policy.Route, rt *routeTarget, fa *balancer.FailureAccrual) *mirrorer {
	if len(route.Mirrors) == 0 {
		return nil
	}
	fam := metrics.NewMirrors(metrics.Meter(r.cfg.mp, ScopeName), route.GRPC)
	mr := &mirrorer{r: r, limits: r.cfg.mirror.withDefaults()}
	for i := range route.Mirrors {
		m := &route.Mirrors[i]
		var bc *balancer.BackendConfig
		if m.Authority != "" {
			bc = backendConfig(policy.Backend{Balancer: &policy.Balancer{Authority: m.Authority}}, fa)
		}
		mr.targets = append(mr.targets, mirrorTarget{m: m, bc: bc, series: fam.Target(rt.metrics().route, metaLabels("backend", m.Meta, true)...)})
	}
	return mr
}

// start mirrors req, the request of a policy exchange's first attempt as
// the rule's filters left it: each mirror whose share draws it gets a
// copy. It returns the request to send on: req, or a shallow copy whose
// body keeps a copy for the mirrors as the primary reads it. Nothing here
// waits for a mirror.
func (mr *mirrorer) start(x *policyExchange, req *http.Request) *http.Request {
	var fire []*mirrorTarget
	var now time.Time
	for i := range mr.targets {
		t := &mr.targets[i]
		if !x.fires(t.m.Ratio) {
			continue
		}
		if t.down.Down() {
			if now.IsZero() {
				now = time.Now()
			}
			if !t.down.Available(now) {
				t.series.Count(metrics.MirrorUnavailable)
				continue
			}
		}
		fire = append(fire, t)
	}
	if len(fire) == 0 {
		return req
	}
	if mr.inFlight.Load() >= int64(mr.limits.InFlight) {
		// At the bound (a slow mirror): dropped before anything is
		// copied, so that a stalled mirror costs the primary the least.
		for _, t := range fire {
			t.series.Count(metrics.MirrorDropped)
		}
		return req
	}
	head := mirrorHead{ctx: meshtrace.WithTraceOf(mr.r.ctx, x.ctx), base: x.base, method: req.Method, url: *req.URL,
		host: req.Host, header: req.Header.Clone(), proto: req.Proto, major: req.ProtoMajor, minor: req.ProtoMinor, grpc: x.grpc}
	if head.host == "" {
		head.host = req.URL.Host
	}
	if req.Body == nil || req.Body == http.NoBody {
		for _, t := range fire {
			mr.send(t, &head, nil)
		}
		return req
	}
	if req.ContentLength > mr.limits.BodyBytes {
		for _, t := range fire {
			t.series.Count(metrics.MirrorBodyTooLarge)
		}
		return req
	}
	out := req.WithContext(req.Context())
	out.Body = &mirrorBody{src: req.Body, want: req.ContentLength, limit: mr.limits.BodyBytes,
		done: func(body []byte, result string) {
			for _, t := range fire {
				if result != "" {
					t.series.Count(result)
					continue
				}
				mr.send(t, &head, body)
			}
		}}
	return out
}

// mirrorHead is what a copy takes of the request besides its body.
type mirrorHead struct {
	// ctx is the router's, carrying the request's span (not its
	// cancellation: a copy outlives its request) when it is traced.
	ctx          context.Context
	base         http.RoundTripper // the transport the primary goes through
	method       string
	url          url.URL
	host         string // the Host the caller sent, which the copy keeps
	header       http.Header
	proto        string
	major, minor int
	// grpc: the copy is a gRPC call, whose result is its grpc-status.
	grpc bool
}

// send sends one copy on a goroutine of its own, or drops it when the
// route's copies in flight are at their bound.
func (mr *mirrorer) send(t *mirrorTarget, head *mirrorHead, body []byte) {
	if mr.inFlight.Add(1) > int64(mr.limits.InFlight) {
		mr.inFlight.Add(-1)
		t.series.Count(metrics.MirrorDropped)
		return
	}
	go mr.run(t, head, body)
}

// run sends a copy and discards its response.
func (mr *mirrorer) run(t *mirrorTarget, head *mirrorHead, body []byte) {
	defer mr.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(head.ctx, mr.limits.Timeout)
	defer cancel()
	if t.bc != nil {
		ctx = balancer.WithBackendConfig(ctx, t.bc)
	}
	if t.m.Forward != nil {
		ctx = balancer.WithForward(ctx, t.m.Forward)
	} else {
		ctx = balancer.WithConcrete(ctx)
	}
	target := t.m.Target()
	u := head.url
	u.Host = target
	if u.Scheme == "" {
		u.Scheme = "http"
	}
	out := &http.Request{Method: head.method, URL: &u, Host: head.host, Header: head.header.Clone(),
		Proto: head.proto, ProtoMajor: head.major, ProtoMinor: head.minor, Body: http.NoBody}
	if len(body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	out = out.WithContext(ctx)
	// The copy's span, under the request's, is the parent of the
	// mirror's server span.
	resp, err := meshtrace.RoundTripAttempt(head.base, out, meshtrace.AttemptMirror, 0)
	if err != nil {
		t.series.Count(metrics.MirrorFailure)
		if ctx.Err() == nil {
			t.down.Failed(time.Now()) // no response, not a timeout: back off
		}
		return
	}
	t.down.Answered()
	// The response is discarded; a short one is read to its end so that
	// its connection is reused (and a gRPC call's trailers read).
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, mirrorDrainBytes))
	resp.Body.Close()
	if resp.StatusCode >= 500 || balancer.ResponseError(resp) != nil || head.grpc && !grpcOK(resp) {
		t.series.Count(metrics.MirrorFailure)
		return
	}
	t.series.Count(metrics.MirrorSuccess)
}

// grpcOK reports whether a gRPC answer read to its end carries the status
// OK: in its headers (trailers-only) or its trailers. An answer whose end
// was not read (past mirrorDrainBytes) has no trailers yet and counts as
// OK when its HTTP status is.
func grpcOK(resp *http.Response) bool {
	st := resp.Header.Get("Grpc-Status")
	if st == "" {
		st = resp.Trailer.Get("Grpc-Status")
	}
	return st == "" || st == "0"
}

// mirrorDrainBytes is how much of a mirror's response is read before it is
// closed.
const mirrorDrainBytes = 64 << 10

// mirrorBody is the body of a mirrored request's primary: it keeps a copy
// of up to limit bytes as the primary reads it, and calls done once: with
// the copy when the body was read whole within the limit, else with the
// result that says why no copy is sent.
type mirrorBody struct {
	src   io.ReadCloser
	want  int64 // the declared length; <= 0 when unknown
	limit int64
	done  func(body []byte, result string)

	mu       sync.Mutex
	buf      []byte
	finished bool
}

func (b *mirrorBody) Read(p []byte) (int, error) {
	n, err := b.src.Read(p)
	var body []byte
	result := ""
	b.mu.Lock()
	if b.finished {
		b.mu.Unlock()
		return n, err
	}
	switch {
	case int64(len(b.buf)+n) > b.limit:
		result = metrics.MirrorBodyTooLarge
	default:
		b.buf = append(b.buf, p[:n]...)
		switch {
		case err == io.EOF, err == nil && b.want > 0 && int64(len(b.buf)) == b.want:
			body = b.buf
		case err != nil:
			result = metrics.MirrorBodyIncomplete
		default:
			b.mu.Unlock()
			return n, err
		}
	}
	b.finished, b.buf = true, nil
	b.mu.Unlock()
	if body == nil && result == "" {
		body = []byte{}
	}
	b.done(body, result)
	return n, err
}

func (b *mirrorBody) Close() error {
	b.mu.Lock()
	finished := b.finished
	b.finished, b.buf = true, nil
	b.mu.Unlock()
	if !finished {
		b.done(nil, metrics.MirrorBodyIncomplete)
	}
	return b.src.Close()
}

// MirrorsInfo is the request mirroring of a route, for [Router.Explain].
type MirrorsInfo struct {
	// Mirrors are the route's mirror backends.
	Mirrors []MirrorInfo `json:"mirrors"`
	// InFlight is the number of copies in flight now, MaxInFlight their
	// bound; MaxBodyBytes is the largest body copied and Timeout the bound
	// of each copy.
	InFlight     int64  `json:"inFlight"`
	MaxInFlight  int    `json:"maxInFlight"`
	MaxBodyBytes int64  `json:"maxBodyBytes"`
	Timeout      string `json:"timeout"`
}

// MirrorInfo is one mirror backend of a route.
type MirrorInfo struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Target is the authority or the forward address copies go to.
	Target string `json:"target"`
	// Share is the share of the route's requests mirrored, in [0, 1].
	Share float64 `json:"share"`
}

func (mr *mirrorer) explain() *MirrorsInfo {
	info := &MirrorsInfo{InFlight: mr.inFlight.Load(), MaxInFlight: mr.limits.InFlight,
		MaxBodyBytes: mr.limits.BodyBytes, Timeout: mr.limits.Timeout.String()}
	for i := range mr.targets {
		t := &mr.targets[i]
		info.Mirrors = append(info.Mirrors, MirrorInfo{Name: t.m.Meta.Name, Kind: t.m.Meta.Kind, Target: t.m.Target(), Share: t.m.Ratio.Probability()})
	}
	return info
}
