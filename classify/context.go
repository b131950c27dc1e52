package classify

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"unique"

	"go.opentelemetry.io/otel/attribute"
)

// Provider is a context value that supplies the classifier of a request,
// such as the route a profile router chose for it.
type Provider interface {
	ResponseClassifier() *Classifier
}

type providerKey struct{}

// WithProvider returns a context in which [FromContext] returns p's
// classifier. p should be long-lived (built once, not per request), so
// that the context costs one allocation.
func WithProvider(ctx context.Context, p Provider) context.Context {
	return context.WithValue(ctx, providerKey{}, p)
}

// ProviderContext is a context in which [FromContext] returns Provider's
// classifier, as in one [WithProvider] returns, with Context as its parent.
// It is for a per-request object that is allocated anyway: a field of it
// set and used by address is that context at no allocation of its own.
// Set it before first use and leave it unchanged after.
type ProviderContext struct {
	context.Context
	Provider Provider
}

// Value returns Provider for the key of [WithProvider], and the parent's
// value for any other key.
func (c *ProviderContext) Value(key any) any {
	if key == (providerKey{}) {
		return c.Provider
	}
	return c.Context.Value(key)
}

// String names the context as context.WithValue's does.
func (c *ProviderContext) String() string {
	return fmt.Sprintf("%v.WithValue(classify.providerKey, %v)", c.Context, c.Provider)
}

// ProviderFromContext returns the Provider of ctx, or nil.
func ProviderFromContext(ctx context.Context) Provider {
	p, _ := ctx.Value(providerKey{}).(Provider)
	return p
}

// FromContext returns the classifier for a request with context ctx: the
// Provider's, or nil (the default rules) when there is none.
func FromContext(ctx context.Context) *Classifier {
	if p := ProviderFromContext(ctx); p != nil {
		return p.ResponseClassifier()
	}
	return nil
}

// Labels are extra metric labels of a request's target, such as the dst_*
// labels of the endpoint a balancer picked. Build them once per target with
// [NewLabels]; they are immutable.
type Labels struct {
	kvs       []attribute.KeyValue
	authority string // see ForAuthority
	// unnamed: the requests carry no authority label (WithoutAuthority).
	unnamed bool
	// key is the labels as text (see Key), made on first use: the
	// recorders compare the labels themselves, and a proxy holds labels
	// for each endpoint of each of thousands of authorities.
	key atomic.Pointer[string]
}

// NewLabels returns the labels prefix+key=value for each entry of m, sorted
// by key.
func NewLabels(prefix string, m map[string]string) *Labels {
	// The labels are kept for as long as their target, one set for each
	// endpoint of each of thousands of authorities: no room to spare, and
	// one copy of each key (dst_namespace, target_addr, ...) for all.
	l := &Labels{}
	if len(m) > 0 {
		l.kvs = make([]attribute.KeyValue, 0, len(m))
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		l.kvs = append(l.kvs, attribute.String(unique.Make(prefix+k).Value(), m[k]))
	}
	return l
}

// LabelsOf returns the labels kvs, as [NewLabels] would make them from their
// keys and string values.
func LabelsOf(kvs ...attribute.KeyValue) *Labels {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsString()
	}
	return NewLabels("", m)
}

// Key returns the labels as one string, the same for equal labels; empty
// for nil labels.
func (l *Labels) Key() string {
	if l == nil {
		return ""
	}
	if k := l.key.Load(); k != nil {
		return *k
	}
	var b strings.Builder
	for _, kv := range l.kvs {
		fmt.Fprintf(&b, "%q=%q,", kv.Key, kv.Value.AsString())
	}
	k := b.String()
	l.key.Store(&k)
	return k
}

// Equal reports whether l and o are the same labels (nil and none are),
// both with or both without an authority label ([Labels.WithoutAuthority]).
// It allocates nothing.
func (l *Labels) Equal(o *Labels) bool {
	return l == o || (l.Unnamed() == o.Unnamed() && slices.Equal(l.KeyValues(), o.KeyValues()))
}

// KeyValues returns the labels, sorted by key; nil for nil labels. The
// slice must not be changed.
func (l *Labels) KeyValues() []attribute.KeyValue {
	if l == nil {
		return nil
	}
	return l.kvs
}

// ForAuthority returns labels with l's labels (nil: none) and the logical
// authority a balancer chose the request's endpoint for (host:port, a
// Service's name and port), which the connections dialled for the request
// carry as their authority label, as Linkerd's proxy labels its
// connections to endpoints: what `linkerd viz stat` selects a Service's
// TCP columns by. The outbound request metrics ([Transport]) take their
// authority label from it too, whatever Host the request carries. Build it
// once per endpoint, as l.
func (l *Labels) ForAuthority(authority string) *Labels {
	c := &Labels{authority: authority}
	if l != nil {
		c.kvs = l.kvs
		c.key.Store(l.key.Load())
	}
	return c
}

// WithoutAuthority returns labels with l's labels (nil: none) whose
// requests are recorded with no authority label at all, whatever Host they
// carry, as Linkerd's proxy labels the requests to the endpoint of a
// forward backend, which has no logical authority
// (linkerd/app/outbound/src/http/logical/policy/router.rs and
// logical.rs give a forward's concrete target none). Build it once per
// endpoint, as l.
func (l *Labels) WithoutAuthority() *Labels {
	c := &Labels{unnamed: true}
	if l != nil {
		c.kvs = l.kvs
		c.key.Store(l.key.Load())
	}
	return c
}

// Unnamed reports whether l's requests are recorded without an authority
// label ([Labels.WithoutAuthority]); false for nil labels.
func (l *Labels) Unnamed() bool { return l != nil && l.unnamed }

// Authority returns the authority of [Labels.ForAuthority]; "" for labels
// without one, and for nil labels.
func (l *Labels) Authority() string {
	if l == nil {
		return ""
	}
	return l.authority
}

type labelsKey struct{}

// WithLabels returns a context whose requests are recorded with l's labels
// too.
func WithLabels(ctx context.Context, l *Labels) context.Context {
	return context.WithValue(ctx, labelsKey{}, l)
}

// LabelsContext is a context whose requests are recorded with Labels too,
// as in one [WithLabels] returns, with Context as its parent; nil Labels
// add nothing. It is for a per-request object that is allocated anyway: a
// field of it set and used by address is that context at no allocation of
// its own. Set it before first use and leave it unchanged after.
type LabelsContext struct {
	context.Context
	Labels *Labels
}

// Value returns Labels for the key of [WithLabels] when they are not nil,
// and the parent's value for any other key.
func (c *LabelsContext) Value(key any) any {
	if key == (labelsKey{}) && c.Labels != nil {
		return c.Labels
	}
	return c.Context.Value(key)
}

// String names the context as context.WithValue's does.
func (c *LabelsContext) String() string {
	return fmt.Sprintf("%v.WithValue(classify.labelsKey, %p)", c.Context, c.Labels)
}

// LabelsFromContext returns the labels of ctx ([WithLabels]), or nil.
func LabelsFromContext(ctx context.Context) *Labels { return labelsFromContext(ctx) }

func labelsFromContext(ctx context.Context) *Labels {
	l, _ := ctx.Value(labelsKey{}).(*Labels)
	return l
}
