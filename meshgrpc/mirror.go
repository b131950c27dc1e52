package meshgrpc

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/mirror"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/router"
)

// mirrorer sends the copies of the unary calls of one GRPCRoute rule with
// RequestMirror filters: each mirror whose share draws a call gets the
// same call (the request message as encoded once, the outgoing metadata
// as the rule's filters left it) on the same channel, balanced over the
// mirror Service's endpoints; its answer is discarded. A copy never
// delays or fails the call: it runs on its own goroutine, bounded as the
// router bounds its copies (router.DefaultMirrorInFlight per rule,
// router.DefaultMirrorTimeout each, messages up to
// router.DefaultMirrorBodyBytes), and a mirror that gives no answer
// (UNAVAILABLE) is backed off.
type mirrorer struct {
	target   string // the channel's authority
	targets  []mirrorTarget
	inFlight atomic.Int64
}

type mirrorTarget struct {
	m      *policy.Mirror
	series *metrics.MirrorTarget
	down   mirror.Backoff
}

// newMirrorer returns the mirrorer of route on the channel to target, nil
// when it has no mirrors.
func (m *mesh) newMirrorer(route *policy.Route, rt *metrics.RouteTarget, target string) *mirrorer {
	if len(route.Mirrors) == 0 {
		return nil
	}
	fam := metrics.NewMirrors(metrics.Meter(m.cfg.mp, clientScope), true)
	mr := &mirrorer{target: target}
	for i := range route.Mirrors {
		mi := &route.Mirrors[i]
		mr.targets = append(mr.targets, mirrorTarget{m: mi, series: fam.Target(rt, router.BackendLabels(mi.Meta)...)})
	}
	return mr
}

// withMirror is rt with the mirrors of its route on the channel to target.
func (m *mesh) withMirror(rt *routeTarget, target string) *routeTarget {
	rt.mirror = m.newMirrorer(rt.route, rt.metrics, target)
	return rt
}

// start sends the copies of a unary call whose first attempt goes with
// ctx (the rule's filters applied), and returns at once.
func (mr *mirrorer) start(ctx context.Context, method string, req any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) {
	var fire []*mirrorTarget
	var now time.Time
	for i := range mr.targets {
		t := &mr.targets[i]
		if p := t.m.Ratio.Probability(); p < 1 && (p <= 0 || rand.Float64() >= p) {
			continue
		}
		if t.m.Authority == "" {
			// A forward mirror (one address, no discovery) has no
			// endpoints on the channel's balancer.
			t.series.Count(metrics.MirrorUnavailable)
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
		return
	}
	if mr.inFlight.Load() >= router.DefaultMirrorInFlight {
		for _, t := range fire {
			t.series.Count(metrics.MirrorDropped)
		}
		return
	}
	body, subtype, ok := encodeCopy(req, opts)
	switch {
	case !ok:
		for _, t := range fire {
			t.series.Count(metrics.MirrorFailure)
		}
		return
	case int64(len(body)) > router.DefaultMirrorBodyBytes:
		for _, t := range fire {
			t.series.Count(metrics.MirrorBodyTooLarge)
		}
		return
	}
	// The copies outlive the call: its values (the metadata, the trace),
	// not its cancellation.
	base := context.WithoutCancel(ctx)
	for _, t := range fire {
		if mr.inFlight.Add(1) > router.DefaultMirrorInFlight {
			mr.inFlight.Add(-1)
			t.series.Count(metrics.MirrorDropped)
			continue
		}
		go mr.run(base, t, method, body, subtype, cc, invoker)
	}
}

// run sends one copy and discards its answer.
func (mr *mirrorer) run(base context.Context, t *mirrorTarget, method string, body []byte, subtype string, cc *grpc.ClientConn, invoker grpc.UnaryInvoker) {
	defer mr.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(base, router.DefaultMirrorTimeout)
	defer cancel()
	ctx = withBackend(ctx, mr.target, t.m.Authority)
	if meshtrace.Enabled(ctx) {
		// The copy's span is an attempt of kind mirror under the call's,
		// counted apart from the call's own attempts (first, retries).
		ctx = context.WithValue(meshtrace.WithAttemptKind(ctx, meshtrace.AttemptMirror), callTraceKey{}, &callTrace{})
	}
	err := invoker(ctx, method, rawMessage(body), &rawMessage{}, cc, grpc.ForceCodecV2(rawCodec{name: subtype}))
	switch status.Code(err) {
	case codes.OK:
		t.down.Answered()
		t.series.Count(metrics.MirrorSuccess)
	case codes.Unavailable:
		t.series.Count(metrics.MirrorFailure)
		if ctx.Err() == nil {
			t.down.Failed(time.Now()) // no answer (no endpoint in rotation within the failfast timeout, refused): back off
		}
	default:
		t.down.Answered()
		t.series.Count(metrics.MirrorFailure)
	}
}

// encodeCopy encodes req once as the call's codec does, so that the copies
// are the call's bytes whatever the caller does with req afterwards; it
// returns the call's content-subtype too ("" for the default).
func encodeCopy(req any, opts []grpc.CallOption) (body []byte, subtype string, ok bool) {
	for _, o := range opts {
		if o, is := o.(grpc.ContentSubtypeCallOption); is {
			subtype = strings.ToLower(o.ContentSubtype)
		}
	}
	switch c := codecOf(opts).codec.(type) {
	case encoding.CodecV2:
		b, err := c.Marshal(req)
		if err != nil {
			return nil, "", false
		}
		body = b.Materialize()
		b.Free()
		return body, subtype, true
	case interface{ Marshal(any) ([]byte, error) }:
		b, err := c.Marshal(req)
		return b, subtype, err == nil
	}
	return nil, "", false
}

// rawMessage is an encoded message: what rawCodec sends, and the answer
// it discards.
type rawMessage []byte

// rawCodec sends a rawMessage as it is and discards what it receives. Its
// name is the call's content-subtype, so that the copy carries the
// call's content-type.
type rawCodec struct{ name string }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, _ := v.(rawMessage)
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (c rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }

func (c rawCodec) Name() string { return c.name }
