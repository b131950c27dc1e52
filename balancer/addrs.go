package balancer

import (
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	authorityname "github.com/inmesh/inmesh/internal/authority"
)

// addrs counts, for each endpoint address, the authorities whose endpoint
// set holds it and the requests in flight to it, so that the Balancer can
// say when an address it dropped from its last set carries no request any
// more ([WithEndpointRemoved]). Several authorities can share an address;
// an address is dropped when the last of them drops it.
//
// A member of a snapshot points to its address's ref, so that a request
// counts itself with two atomic operations and no lookup. A ref in no set
// is loose: a request that begins or ends on it takes the lock, so that the
// check "in no set and nothing in flight" and the removal's callback are
// never raced by a request that the callback would cut.
type addrs struct {
	removed []func(netip.AddrPort)

	mu sync.Mutex
	m  map[netip.AddrPort]*addrRef
}

// addrRef is one address's count. It stays in addrs.m while a set holds
// it or a request is in flight to it; a snapshot may keep it after that
// (an orphan), and a request that picks it then puts it back.
type addrRef struct {
	addr     netip.AddrPort
	inflight atomic.Int64
	loose    atomic.Bool // in no set: the end of the last request checks
	sets     int         // under addrs.mu
	dropped  bool        // under addrs.mu: left its last set, not yet reported
}

// newAddrs returns the counts of a Balancer that reports removals to fs,
// or nil when there is no one to tell: then nothing is counted.
func newAddrs(fs []func(netip.AddrPort)) *addrs {
	if len(fs) == 0 {
		return nil
	}
	return &addrs{removed: fs, m: make(map[netip.AddrPort]*addrRef)}
}

// swap moves one authority's hold from the addresses of prev to those of
// next, giving each member of next its address's ref. Called under the
// authority's lock, before next is published.
func (as *addrs) swap(prev, next *snapshot) {
	if as == nil {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	held := refsOf(prev)
	kept := make(map[netip.AddrPort]*addrRef, len(next.eps))
	for _, e := range next.eps {
		r := kept[e.Addr]
		if r == nil {
			if r = held[e.Addr]; r == nil {
				r = as.holdLocked(e.Addr)
			}
			kept[e.Addr] = r
		}
		e.ref = r
	}
	for addr, r := range held {
		if kept[addr] == nil {
			as.dropLocked(r)
		}
	}
}

// release drops the hold of a released authority on the addresses of its
// last snapshot.
func (as *addrs) release(last *snapshot) {
	if as == nil || len(last.eps) == 0 {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, r := range refsOf(last) {
		as.dropLocked(r)
	}
}

// refsOf returns the refs of s's addresses, once each.
func refsOf(s *snapshot) map[netip.AddrPort]*addrRef {
	m := make(map[netip.AddrPort]*addrRef, len(s.eps))
	for _, e := range s.eps {
		if e.ref != nil {
			m[e.Addr] = e.ref
		}
	}
	return m
}

func (as *addrs) holdLocked(addr netip.AddrPort) *addrRef {
	r := as.m[addr]
	if r == nil {
		r = &addrRef{addr: addr}
		as.m[addr] = r
	}
	if r.sets++; r.sets == 1 {
		r.dropped = false
		r.loose.Store(false)
	}
	return r
}

func (as *addrs) dropLocked(r *addrRef) {
	if r.sets--; r.sets > 0 {
		return
	}
	r.dropped = true
	r.loose.Store(true) // before the load of inflight: see begin
	as.idleLocked(r)
}

// idleLocked forgets r, and reports its address removed if it was dropped,
// once it is in no set and has nothing in flight.
func (as *addrs) idleLocked(r *addrRef) {
	if as.m[r.addr] != r || r.sets > 0 || r.inflight.Load() != 0 {
		return
	}
	delete(as.m, r.addr)
	if r.dropped {
		r.dropped = false
		for _, f := range as.removed {
			f(r.addr)
		}
	}
}

// begin counts a request to e in flight until [addrs.end] with the ref it
// returns (nil when nothing is counted).
func (as *addrs) begin(e *member) *addrRef {
	if as == nil {
		return nil
	}
	r := e.ref
	if r == nil {
		// A member of an authority updated after its release.
		return as.beginAddr(e.Addr)
	}
	r.inflight.Add(1)
	if !r.loose.Load() {
		return r
	}
	return as.beginLoose(r)
}

// beginLoose is begin on a ref in no set (a snapshot picked just before
// its address was dropped): it makes sure the ref counted is the one in
// the map, so that the end of the request is seen, and that the end
// reports the address removed again, as the request may have dialled it.
func (as *addrs) beginLoose(r *addrRef) *addrRef {
	as.mu.Lock()
	defer as.mu.Unlock()
	switch cur := as.m[r.addr]; cur {
	case r:
	case nil: // forgotten once reported
		as.m[r.addr] = r
	default: // forgotten, then counted again
		r.inflight.Add(-1)
		cur.inflight.Add(1)
		r = cur
	}
	if r.sets == 0 {
		r.dropped = true
	}
	return r
}

// beginAddr counts a request to addr that no member stands for (a
// forward backend's).
func (as *addrs) beginAddr(addr netip.AddrPort) *addrRef {
	as.mu.Lock()
	defer as.mu.Unlock()
	r := as.m[addr]
	if r == nil {
		r = &addrRef{addr: addr}
		r.loose.Store(true)
		as.m[addr] = r
	}
	r.inflight.Add(1)
	return r
}

// end ends a request [addrs.begin] counted.
func (as *addrs) end(r *addrRef) {
	if r == nil || r.inflight.Add(-1) != 0 || !r.loose.Load() {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	as.idleLocked(r)
}

// endOnClose ends r's request when resp's body ends, or now when it has
// none. The body of a 101 response stays writable.
func (as *addrs) endOnClose(resp *http.Response, r *addrRef) {
	switch body := resp.Body; {
	case r == nil:
	case body == nil || body == http.NoBody:
		as.end(r)
	case resp.StatusCode == http.StatusSwitchingProtocols:
		if rwc, ok := body.(io.ReadWriteCloser); ok {
			resp.Body = &addrTunnel{ReadWriteCloser: rwc, as: as, r: r}
		} else {
			resp.Body = &addrBody{ReadCloser: body, as: as, r: r}
		}
	default:
		resp.Body = &addrBody{ReadCloser: body, as: as, r: r}
	}
}

// addrBody ends its request's count when it ends, fails or is closed.
type addrBody struct {
	io.ReadCloser
	as   *addrs
	r    *addrRef
	done atomic.Bool
}

func (b *addrBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done.Swap(true) {
		b.as.end(b.r)
	}
	return n, err
}

func (b *addrBody) Close() error {
	err := b.ReadCloser.Close()
	if !b.done.Swap(true) {
		b.as.end(b.r)
	}
	return err
}

// addrTunnel is the body of a switched protocol: the connection is the
// caller's until it closes it.
type addrTunnel struct {
	io.ReadWriteCloser
	as   *addrs
	r    *addrRef
	done atomic.Bool
}

func (b *addrTunnel) Close() error {
	err := b.ReadWriteCloser.Close()
	if !b.done.Swap(true) {
		b.as.end(b.r)
	}
	return err
}

// forward sends a [WithForward] request to its endpoint, labelled with
// the endpoint's labels as a picked endpoint's request is, with its
// authority override applied as to a picked endpoint, and counted on the
// endpoint's address.
func (t *transport) forward(req *http.Request, ep *endpoint.Endpoint) (*http.Response, error) {
	req = req.WithContext(classify.WithLabels(req.Context(), t.b.fwd.of(ep, t.b.cfg.meshTLS)))
	overrideAuthority(req, ep.AuthorityOverride)
	as := t.b.table.addrs
	if as == nil {
		return t.base.RoundTrip(req)
	}
	return as.roundTrip(t.base, req, ep.Addr)
}

// fallback sends a request to its own address; one to an IP address is
// counted on it, as it may share the connections of an endpoint.
func (t *transport) fallback(req *http.Request) (*http.Response, error) {
	as := t.b.table.addrs
	if as == nil {
		return t.base.RoundTrip(req)
	}
	addr, ok := ipAddrPort(req.URL)
	if !ok {
		return t.base.RoundTrip(req)
	}
	return as.roundTrip(t.base, req, addr)
}

func (as *addrs) roundTrip(rt http.RoundTripper, req *http.Request, addr netip.AddrPort) (*http.Response, error) {
	r := as.beginAddr(addr)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		as.end(r)
		return nil, err
	}
	as.endOnClose(resp, r)
	return resp, nil
}

// ipAddrPort returns the address u's connections are dialled to, when its
// host is an IP address.
func ipAddrPort(u *url.URL) (netip.AddrPort, bool) {
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	n, err := authorityname.NormalizeDefaultPort(u.Host, port)
	if err != nil {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(n)
	return ap, err == nil
}
