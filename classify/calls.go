package classify

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/internal/metrics"
)

// Recorder records the request metrics of exchanges that pass through no
// http.Handler or RoundTripper, such as the calls grpc-go makes and
// serves: request_total when one starts, response_total (with its
// classification) and response_latency_ms when it ends, with the labels
// [NewHandler] (inbound) or [NewTransport] (outbound) gives its requests.
// It is safe for concurrent use.
type Recorder struct {
	rec        *recorder
	classifier *Classifier
}

// NewInboundRecorder returns a Recorder of inbound exchanges
// (direction="inbound"), configured as [NewHandler] is.
func NewInboundRecorder(opts ...Option) *Recorder {
	cfg := newConfig(opts)
	return &Recorder{rec: newRecorder(cfg, "inbound"), classifier: cfg.classifier}
}

// NewOutboundRecorder returns a Recorder of outbound exchanges
// (direction="outbound"), configured as [NewTransport] is.
func NewOutboundRecorder(opts ...Option) *Recorder {
	cfg := newConfig(opts)
	return &Recorder{rec: newRecorder(cfg, "outbound"), classifier: cfg.classifier}
}

// Exchange is one exchange a [Recorder] counted the request of; its zero
// value records nothing.
type Exchange struct {
	t          *metrics.Target
	classifier *Classifier
	start      time.Time
}

// Start counts the request of an exchange for authority, started now, with
// the labels l, or the labels ctx carries ([WithLabels]) when l is nil.
func (r *Recorder) Start(ctx context.Context, authority string, l *Labels) Exchange {
	if l == nil {
		l = labelsFromContext(ctx)
	}
	t := r.rec.target(authority, l)
	t.Request(ctx)
	return Exchange{t: t, classifier: r.classifier, start: time.Now()}
}

// EndGRPC counts the response of a gRPC call that ended with status code,
// sent as gRPC sends every response, with HTTP status 200: classified by
// the classifier of ctx ([FromContext]), else the Recorder's, as
// [NewHandler] classifies a gRPC response whose grpc-status came in its
// trailers.
func (e Exchange) EndGRPC(ctx context.Context, code int32) {
	if e.t == nil {
		return
	}
	c := FromContext(ctx)
	if c == nil {
		c = e.classifier
	}
	e.t.Response(ctx, response(http.StatusOK, c.GRPCCall(int64(code))), e.start)
}

// EndError counts an exchange that failed without an answer: err's class
// (a timeout, a reset, unclassified), as a [Transport] classifies a failed
// round trip.
func (e Exchange) EndError(ctx context.Context, err error) {
	if e.t == nil {
		return
	}
	e.t.Response(ctx, response(0, ErrorClass(ctx, err)), e.start)
}

// TLSLabels are the tls labels of Linkerd's inbound metrics, per client:
// tls="true" with the client's verified client_id (empty when it showed
// no certificate) for meshed TLS; tls="no_identity" with
// no_tls_reason="no_tls_from_remote" for a plaintext client of a server
// with an identity; tls="disabled" for a server without one. A label set
// is made once per client identity, up to a bound (past it, per call). It
// is safe for concurrent use.
type TLSLabels struct {
	plain *Labels
	sets  sync.Map // client id -> *Labels
	n     atomic.Int32

	mu      sync.RWMutex
	targets map[targetKey]*Labels // ForTarget
}

// targetKey is a label set of ForTarget.
type targetKey struct {
	tls    bool
	id     string
	target netip.AddrPort
}

// maxTLSLabelSets bounds the label sets a TLSLabels keeps: one per
// verified client identity, which only the trust anchors' issuers make.
const maxTLSLabelSets = 1024

// maxTargetLabelSets bounds the label sets with a target a TLSLabels
// keeps: one per client identity and address of the server's own.
const maxTargetLabelSets = 4096

// NewTLSLabels returns the tls labels of a server that terminates mesh TLS
// (meshTLS) or not.
func NewTLSLabels(meshTLS bool) *TLSLabels {
	t := &TLSLabels{plain: NewLabels("", map[string]string{"tls": "disabled"})}
	if meshTLS {
		t.plain = NewLabels("", map[string]string{"tls": "no_identity", "no_tls_reason": "no_tls_from_remote"})
	}
	return t
}

// For returns the labels of a client whose connection is mesh TLS
// terminated here (tls) with the verified identity id (empty: none), or
// plaintext.
func (t *TLSLabels) For(tls bool, id string) *Labels {
	if !tls {
		return t.plain
	}
	if v, ok := t.sets.Load(id); ok {
		return v.(*Labels)
	}
	l := NewLabels("", map[string]string{"tls": "true", "client_id": id})
	if t.n.Add(1) <= maxTLSLabelSets {
		t.sets.Store(id, l)
	}
	return l
}

// ForTarget returns the labels of [TLSLabels.For] and the target_addr,
// target_ip and target_port of target, the address the client's
// connection was accepted on (an IPv4-mapped one as IPv4), as Linkerd's
// proxy labels inbound requests; For's alone when target is invalid. A
// label set is made once per client identity and target, up to a bound
// (past it, per call).
func (t *TLSLabels) ForTarget(tls bool, id string, target netip.AddrPort) *Labels {
	if !target.IsValid() {
		return t.For(tls, id)
	}
	if !tls {
		id = ""
	}
	k := targetKey{tls: tls, id: id, target: netip.AddrPortFrom(target.Addr().Unmap(), target.Port())}
	t.mu.RLock()
	l := t.targets[k]
	t.mu.RUnlock()
	if l != nil {
		return l
	}
	l = LabelsOf(append(slices.Clone(t.For(tls, id).kvs), metrics.TargetLabels(k.target)...)...)
	t.mu.Lock()
	if t.targets == nil {
		t.targets = make(map[targetKey]*Labels, 1)
	}
	if len(t.targets) < maxTargetLabelSets {
		t.targets[k] = l
	}
	t.mu.Unlock()
	return l
}
