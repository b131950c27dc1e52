package meshgrpc

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/internal/requireid"
)

// RequireIDMetadata is the metadata key in which a call names the identity
// that its endpoint must prove over mTLS, as Linkerd's outbound proxy reads
// the l5d-require-id header. A channel made with [DialOptions] removes it
// from every call before the call leaves, and sends the call only to an
// endpoint whose connection verified that identity in its handshake;
// otherwise the call fails UNAVAILABLE and nothing is sent.
//
// The channel's interceptors remove it, so an interceptor that adds it
// must run before them: chain it in a dial option given before those of
// [DialOptions]. One chained after them still has its value checked, but
// the metadata then leaves with the call, as grpc-go lets nothing after
// the last interceptor remove metadata without a stats handler, which
// would cost every call of the channel about fifteen allocations.
const RequireIDMetadata = "l5d-require-id"

// canonicalDstMetadata is the metadata key of l5d-dst-canonical, in which
// Linkerd's proxies name the logical destination of a request. A call's
// own value goes to an endpoint without an authority override and not to
// one with an override, as the HTTP balancer removes the header from a
// request to such an endpoint.
const canonicalDstMetadata = "l5d-dst-canonical"

// callMetaKey is the context key of the [callMeta] that
// [withoutMeshMetadata] made of a call's metadata, for the picker.
type callMetaKey struct{}

// callMeta is a call's context carrying the metadata the mesh reads that
// [withoutMeshMetadata] moved out of the call's outgoing metadata: one
// allocation, and Value returns the context itself, so that a lookup boxes
// nothing.
type callMeta struct {
	context.Context
	// id is the identity the call requires, "" for none.
	id string
	// canonical is the call's own l5d-dst-canonical as pick metadata,
	// which the picker gives back to an endpoint without an authority
	// override; nil when the call has none.
	canonical metadata.MD
}

func (c *callMeta) Value(key any) any {
	if _, ok := key.(callMetaKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// withoutMeshMetadata returns the context to send an attempt with: ctx
// itself when its outgoing metadata has neither [RequireIDMetadata] nor
// l5d-dst-canonical, which allocates nothing; otherwise a context whose
// metadata lacks both and that carries them for the picker: the identity
// the first l5d-require-id value names (a value that is no identity
// requires nothing, see [requireid.Want]), checked against the picked
// endpoint, and the l5d-dst-canonical values, sent on only to an endpoint
// without an authority override. It is applied where an attempt leaves
// the interceptors, after routing and the route's filters, as Linkerd's
// proxy reads and removes both headers at the endpoint
// (linkerd/app/outbound/src/http/endpoint.rs, NewRequireIdentity and
// NewOverrideAuthority).
func withoutMeshMetadata(ctx context.Context) context.Context {
	ids := metadata.ValueFromOutgoingContext(ctx, RequireIDMetadata)
	canonical := metadata.ValueFromOutgoingContext(ctx, canonicalDstMetadata)
	if len(ids) == 0 && len(canonical) == 0 {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	delete(md, RequireIDMetadata)
	delete(md, canonicalDstMetadata)
	ctx = metadata.NewOutgoingContext(ctx, md)
	c := &callMeta{Context: ctx}
	if len(ids) > 0 {
		if want, ok := requireid.Want(ids[0]); ok {
			c.id = want
		}
	}
	if len(canonical) > 0 {
		c.canonical = metadata.MD{canonicalDstMetadata: canonical}
	}
	if c.id == "" && c.canonical == nil {
		return ctx
	}
	return c
}

// refuseUnproven returns the status that fails the call of ctx when it
// requires an identity the picked endpoint does not prove; cm is what
// [withoutMeshMetadata] moved out of the call's metadata (nil: nothing),
// and verified the identity the endpoint's connection verified in its mTLS
// handshake ("": plaintext). Any [RequireIDMetadata] still in the call's
// metadata (one an interceptor chained after the channel's own set) is
// checked all the same, though it leaves with the call. A call that
// requires nothing costs a metadata lookup and no allocation.
func refuseUnproven(ctx context.Context, cm *callMeta, verified string) error {
	if cm != nil && cm.id != "" && !requireid.Satisfied(cm.id, verified) {
		return status.Error(codes.Unavailable, requireid.Reason(cm.id, verified))
	}
	if vs := metadata.ValueFromOutgoingContext(ctx, RequireIDMetadata); len(vs) > 0 {
		if want, ok := requireid.Want(vs[0]); ok && !requireid.Satisfied(want, verified) {
			return status.Error(codes.Unavailable, requireid.Reason(want, verified))
		}
	}
	return nil
}
