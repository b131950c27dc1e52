package origproto

import (
	"net/http"

	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/internal/requireid"
)

// RequireIDHeader is the request header in which an application names the
// identity that the endpoint of its request must prove over mTLS, as
// Linkerd's outbound proxy reads it. [Transport] removes it from every
// request it sends.
const RequireIDHeader = "L5d-Require-Id"

// requireID handles a request that carries [RequireIDHeader] (values vs):
// it returns r without the header to send on, or, when the endpoint does
// not prove the identity the header names, the response to answer with
// instead (502, gRPC UNAVAILABLE), as Linkerd's outbound proxy fails the
// request. A value that is no identity requires nothing ([requireid.Want]). The identity an endpoint
// proves is the one every connection of its pool verified in its
// handshake: only with a client identity ([WithClientIdentity]) and an
// endpoint identity ([WithServerIdentity]); a plaintext endpoint proves
// none.
func (t *Transport) requireID(r *http.Request, vs []string) (*http.Request, *http.Response) {
	out := new(http.Request)
	*out = *r
	out.Header = r.Header.Clone()
	delete(out.Header, RequireIDHeader)
	want, ok := requireid.Want(vs[0])
	if !ok {
		return out, nil
	}
	found := ""
	if t.tls != nil {
		s, _ := r.Context().Value(serverIdentityKey{}).(serverTLS)
		found = s.id
	}
	if requireid.Satisfied(want, found) {
		return out, nil
	}
	return nil, proxyerr.Response(r, http.StatusBadGateway, requireid.Reason(want, found))
}
