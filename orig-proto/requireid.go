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

// RequireID returns next behind the Transport's [RequireIDHeader] rule: a
// request with the header goes on to next without it when its endpoint
// proves the identity the header names, and is answered 502 (gRPC
// UNAVAILABLE) unsent otherwise, as the Transport itself answers it. It is
// for a stack that records its endpoint metrics between the two (a
// classify.Transport over t): a refused request is then answered before
// those metrics see it, as Linkerd's proxy refuses it outside its
// endpoint metrics (linkerd/app/outbound/src/http/endpoint.rs, where
// NewRequireIdentity wraps the http_endpoint metrics layer). A request
// without the header costs one map lookup.
func (t *Transport) RequireID(next http.RoundTripper) http.RoundTripper {
	return &requireIDTransport{t: t, next: next}
}

type requireIDTransport struct {
	t    *Transport
	next http.RoundTripper
}

var _ http.RoundTripper = (*requireIDTransport)(nil)

func (rt *requireIDTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r, failed := rt.t.checkRequireID(r)
	if failed != nil {
		return failed, nil
	}
	return rt.next.RoundTrip(r)
}

// checkRequireID returns r to send on, without [RequireIDHeader], or the
// response that refuses it (see requireID), its body closed.
func (t *Transport) checkRequireID(r *http.Request) (*http.Request, *http.Response) {
	vs, ok := r.Header[RequireIDHeader]
	if !ok || len(vs) == 0 {
		return r, nil
	}
	out, failed := t.requireID(r, vs)
	if failed != nil && r.Body != nil {
		r.Body.Close()
	}
	return out, failed
}

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
		found = serverTLSFrom(r.Context()).id
	}
	if requireid.Satisfied(want, found) {
		return out, nil
	}
	return nil, proxyerr.Response(r, http.StatusBadGateway, requireid.Reason(want, found))
}
