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
const RequireIDMetadata = "l5d-require-id"

// requireIDKey is the context key of the identity a call requires, which
// [withoutRequireID] moved out of the call's metadata for the picker.
type requireIDKey struct{}

// requireIDCtx is a call's context carrying the identity it requires: one
// allocation, and Value returns the context itself, so that a lookup boxes
// nothing.
type requireIDCtx struct {
	context.Context
	id string
}

func (c *requireIDCtx) Value(key any) any {
	if _, ok := key.(requireIDKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// withoutRequireID returns the context to send an attempt with: ctx itself
// when its outgoing metadata has no [RequireIDMetadata], which allocates
// nothing; otherwise a context whose metadata lacks it and that carries the
// identity its first value names (a value that is no identity requires
// nothing, see [requireid.Want]), for the picker to check against the picked endpoint. It is
// applied where an attempt leaves the interceptors, after routing and the
// route's filters, as Linkerd's proxy reads and removes the header at the
// endpoint.
func withoutRequireID(ctx context.Context) context.Context {
	vs := metadata.ValueFromOutgoingContext(ctx, RequireIDMetadata)
	if len(vs) == 0 {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	delete(md, RequireIDMetadata)
	ctx = metadata.NewOutgoingContext(ctx, md)
	if want, ok := requireid.Want(vs[0]); ok {
		return &requireIDCtx{Context: ctx, id: want}
	}
	return ctx
}

// refuseUnproven returns the status that fails the call of ctx when it
// requires an identity the picked endpoint does not prove; verified is the
// identity that endpoint's connection verified in its mTLS handshake ("":
// plaintext). The requirement is the one [withoutRequireID] moved into the
// context, and also any [RequireIDMetadata] still in the call's metadata
// (one an interceptor chained after the channel's own set): that is
// checked all the same, though it leaves with the call. A call that
// requires nothing costs two context lookups and no allocation.
func refuseUnproven(ctx context.Context, verified string) error {
	if r, ok := ctx.Value(requireIDKey{}).(*requireIDCtx); ok && !requireid.Satisfied(r.id, verified) {
		return status.Error(codes.Unavailable, requireid.Reason(r.id, verified))
	}
	if vs := metadata.ValueFromOutgoingContext(ctx, RequireIDMetadata); len(vs) > 0 {
		if want, ok := requireid.Want(vs[0]); ok && !requireid.Satisfied(want, verified) {
			return status.Error(codes.Unavailable, requireid.Reason(want, verified))
		}
	}
	return nil
}
