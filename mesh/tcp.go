package mesh

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/registry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterScope is the instrumentation scope of the families mesh records
// itself: those of its connections.
const meterScope = "github.com/inmesh/inmesh/mesh"

// connMetrics counts a stack's connections in Linkerd's tcp_* families,
// one label set per direction, peer, TLS state and address (and, as
// Linkerd's proxy writes them, the endpoint's logical authority outbound,
// the port's Server inbound): the labels `linkerd viz edges` and the TCP
// columns of `linkerd viz stat` select.
type connMetrics struct {
	tcp  *metrics.TCP
	base []attribute.KeyValue // direction and peer
	// authorities bounds the authority label values for the life of the
	// stack, as classify bounds its own: past it, "other". nil where
	// connections have no authority.
	authorities *registry.Names

	mu    sync.Mutex
	cache map[connKey]*metrics.Conns // bounded by maxConnSeries
}

// connLabels are the labels of a connection besides its direction and
// peer.
type connLabels struct {
	// labels are the endpoint's (outbound: dst_*, tls) or the client's
	// tls labels; target_* among them are the address's, below.
	labels *classify.Labels
	// server are the target_* and srv_* labels of the port's Server
	// (inbound policy), nil without a policy: the target is then addr.
	server *classify.Labels
	// authority is the logical authority an outbound connection was
	// dialled for, "" for none.
	authority string
	addr      string
}

// connKey is a label set of connections: equal labels (an endpoint's
// made again after a change) share their key.
type connKey struct {
	labels, server, authority, addr string
}

// maxConnSeries bounds the label sets a stack caches for its connections;
// past it each connection builds its own (the families bound their
// series as every family does).
const maxConnSeries = 4096

// otherAuthority is the authority label of the connections dialled for
// authorities past the bound, as classify labels their requests.
const otherAuthority = "other"

func newConnMetrics(mp metric.MeterProvider, direction, peer string) *connMetrics {
	return &connMetrics{tcp: metrics.NewTCP(metrics.Meter(mp, meterScope)),
		base:  []attribute.KeyValue{attribute.String("direction", direction), attribute.String("peer", peer)},
		cache: make(map[connKey]*metrics.Conns)}
}

// withAuthorities makes m label its connections with their authority,
// the first maxAuthorities distinct values (<= 0: classify's default
// bound) as they are, any later one "other".
func (m *connMetrics) withAuthorities(maxAuthorities int) *connMetrics {
	if maxAuthorities <= 0 {
		maxAuthorities = classify.DefaultMaxAuthorities
	}
	m.authorities = registry.NewNames(maxAuthorities)
	return m
}

// conns returns the series of connections with labels l.
func (m *connMetrics) conns(l connLabels) *metrics.Conns {
	switch {
	case m.authorities == nil:
		l.authority = "" // connections of this kind carry none
	case l.authority != "" && !m.authorities.Admit(l.authority):
		l.authority = otherAuthority
	}
	k := connKey{l.labels.Key(), l.server.Key(), l.authority, l.addr}
	m.mu.Lock()
	c := m.cache[k]
	m.mu.Unlock()
	if c != nil {
		return c
	}
	kvs := make([]attribute.KeyValue, 0, len(m.base)+len(l.labels.KeyValues())+len(l.server.KeyValues())+4)
	kvs = append(kvs, m.base...)
	for _, kv := range l.labels.KeyValues() {
		if !strings.HasPrefix(string(kv.Key), "target_") {
			kvs = append(kvs, kv)
		}
	}
	if l.server != nil {
		kvs = append(kvs, l.server.KeyValues()...)
	} else {
		kvs = append(kvs, targetLabels(l.addr)...)
	}
	if l.authority != "" {
		kvs = append(kvs, attribute.String("authority", l.authority))
	}
	c = m.tcp.Conns(kvs...)
	m.mu.Lock()
	if len(m.cache) < maxConnSeries {
		m.cache[k] = c
	}
	m.mu.Unlock()
	return c
}

// targetLabels are the target_addr, target_ip and target_port of addr, a
// host:port in one spelling (targetAddr); target_ip is empty for a
// connection dialled to a name, which has no IP address of its own.
func targetLabels(addr string) []attribute.KeyValue {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return metrics.TargetLabels(ap)
	}
	_, port, _ := net.SplitHostPort(addr)
	return []attribute.KeyValue{attribute.String("target_addr", addr), attribute.String("target_ip", ""),
		attribute.String("target_port", port)}
}

// dial wraps an outbound dial function: each connection is counted under
// the labels of the endpoint it was dialled for (the balancer's, in the
// dial's context: dst_*, tls and the logical authority it balanced) and
// its address, and kept in set by its address. A connection is labelled
// by the request it was dialled for; another authority's requests to the
// same endpoint may share it afterwards.
func (m *connMetrics) dial(next func(ctx context.Context, network, addr string) (net.Conn, error), set *dialled) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		l := classify.LabelsFromContext(ctx)
		s := m.conns(connLabels{labels: l, authority: l.Authority(), addr: targetAddr(addr)})
		s.Opened()
		cc := &countedConn{Conn: c, s: s}
		set.add(addr, cc)
		return cc, nil
	}
}

// countedConn counts its bytes and its close in its series. An outbound
// one is in the set of the connections dialled to its address until it
// closes.
type countedConn struct {
	net.Conn
	s      *metrics.Conns
	closed atomic.Bool
	set    *dialled // nil when not kept
	addr   netip.AddrPort
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.s.Read(n)
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.s.Wrote(n)
	return n, err
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.s.Closed()
		c.set.forget(c)
	}
	return c.Conn.Close()
}

// dialled keeps a stack's outbound connections by the IP address and port
// they were dialled to, so that those to an endpoint the balancer is done
// with are closed (balancer.WithEndpointRemoved) rather than kept idle
// until their idle timeout. A connection dialled to a name is not kept.
type dialled struct {
	mu sync.Mutex
	by map[netip.AddrPort]map[*countedConn]struct{}
}

func newDialled() *dialled { return &dialled{by: make(map[netip.AddrPort]map[*countedConn]struct{})} }

func (d *dialled) add(addr string, c *countedConn) {
	if d == nil {
		return
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return
	}
	c.set, c.addr = d, ap
	d.mu.Lock()
	defer d.mu.Unlock()
	cs := d.by[ap]
	if cs == nil {
		cs = make(map[*countedConn]struct{})
		d.by[ap] = cs
	}
	cs[c] = struct{}{}
}

func (d *dialled) forget(c *countedConn) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cs := d.by[c.addr]; cs != nil {
		delete(cs, c)
		if len(cs) == 0 {
			delete(d.by, c.addr)
		}
	}
}

// closeTo closes the connections dialled to addr. The balancer calls it
// once no request to addr is in flight, so none of them carries one: an
// HTTP/1 connection is in its transport's idle pool, an HTTP/2 one has no
// stream, and the transport drops each as it sees it closed.
func (d *dialled) closeTo(addr netip.AddrPort) {
	d.mu.Lock()
	cs := d.by[addr]
	delete(d.by, addr)
	d.mu.Unlock()
	for c := range cs {
		c.Close()
	}
}

// wire wraps an inbound listener's raw connections, so that their bytes
// are counted as they cross the network (TLS records included, as the
// outbound side counts them); labelled wraps the listener above it (with
// the meshed TLS, if any), whose connections are labelled once their
// labels are known: the client's verified identity, known once the
// meshed TLS is detected on the first read, the local address the
// connection came to and, with an inbound policy, the port's Server.
func (m *connMetrics) wire(ln net.Listener) net.Listener { return &wireListener{ln} }

func (m *connMetrics) labelled(ln net.Listener, tls *classify.TLSLabels, policy *authz.Handler) net.Listener {
	return &labelListener{Listener: ln, m: m, tls: tls, policy: policy}
}

type wireListener struct{ net.Listener }

func (l *wireListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &wireConn{Conn: c}, nil
}

// wireConn counts the bytes of an accepted connection: into its series
// once its labels are known, and until then aside.
type wireConn struct {
	net.Conn
	s                  atomic.Pointer[metrics.Conns]
	pendingR, pendingW atomic.Int64
}

func (c *wireConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if s := c.s.Load(); s != nil {
		s.Read(n)
	} else if n > 0 {
		c.pendingR.Add(int64(n))
		c.flush() // the series may have come meanwhile
	}
	return n, err
}

func (c *wireConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if s := c.s.Load(); s != nil {
		s.Wrote(n)
	} else if n > 0 {
		c.pendingW.Add(int64(n))
		c.flush()
	}
	return n, err
}

// attach makes s the connection's series, with what was counted aside.
func (c *wireConn) attach(s *metrics.Conns) {
	c.s.Store(s)
	c.flush()
}

func (c *wireConn) flush() {
	if s := c.s.Load(); s != nil {
		s.Read(int(c.pendingR.Swap(0)))
		s.Wrote(int(c.pendingW.Swap(0)))
	}
}

type labelListener struct {
	net.Listener
	m      *connMetrics
	tls    *classify.TLSLabels
	policy *authz.Handler // nil without an inbound policy
}

func (l *labelListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ic := &inboundConn{Conn: c, m: l.m, tls: l.tls}
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		ic.local = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		ic.addr = ic.local.String()
		ic.policy = l.policy
	} else {
		ic.addr = c.LocalAddr().String()
	}
	// The wire connection is the accepted one, or the one a meshed TLS
	// connection was made over.
	inner := c
	if u, ok := c.(interface{ NetConn() net.Conn }); ok {
		inner = u.NetConn()
	}
	ic.wire, _ = inner.(*wireConn)
	if _, ok := c.(peerConn); !ok {
		ic.resolve() // plaintext only: its TLS state is known now
	}
	return ic, nil
}

// peerConn is a connection that knows its client's identity, as
// origproto's meshed TLS connections do.
type peerConn interface{ Peer() identity.Peer }

// inboundConn is counted from its first read or write once its TLS state
// and, with an inbound policy, its port's Server are known; a connection
// closed before its TLS state was known is not counted.
//
// As in Linkerd's proxy, a connection keeps the Server that was in force
// when it was accepted, whatever policy its later requests meet. A
// connection accepted while its port's first policy is pending (the
// requests on it wait for it, see authz.WithPolicyWait) is labelled once
// the policy is known, so that it carries the Server that decides its
// first requests: its bytes are counted aside until then, and a
// connection that closes first is counted under the policy in force then.
type inboundConn struct {
	net.Conn
	wire   *wireConn // nil when not found: bytes are then not counted
	m      *connMetrics
	tls    *classify.TLSLabels
	policy *authz.Handler // nil without an inbound policy
	local  netip.AddrPort // the address accepted on, invalid when not TCP
	addr   string         // local in one spelling

	detect   sync.Once
	detected atomic.Bool      // its TLS state is known (set once detect succeeded)
	labels   *classify.Labels // its tls labels, set before detected
	done     atomic.Bool      // labelled, or never to be (its detection failed)

	mu                sync.Mutex
	s                 *metrics.Conns
	counted, isClosed bool
}

// resolve labels the connection and counts it opened, unless it was
// closed meanwhile, once its labels are known; it reads the first bytes
// of a meshed connection (its TLS handshake).
func (c *inboundConn) resolve() {
	if c.done.Load() {
		return
	}
	c.detect.Do(c.detectTLS)
	if !c.detected.Load() {
		c.done.Store(true)
		return
	}
	c.label(false)
}

// detectTLS finds the connection's tls labels. A connection whose protocol
// could not be detected (its meshed TLS handshake failed, or it closed
// first) carried nothing and is not counted, as Linkerd's proxy counts
// connections after their detection; nor is it taken for plaintext.
func (c *inboundConn) detectTLS() {
	p := c.Peer()
	if d, ok := c.Conn.(interface{ DetectErr() error }); ok && d.DetectErr() != nil {
		return
	}
	c.labels = c.tls.For(p.TLS, p.ID)
	c.detected.Store(true)
}

// label counts the connection under its labels, once the port's policy
// is known or, closing (final), under the one in force.
func (c *inboundConn) label(final bool) {
	l := connLabels{labels: c.labels, addr: c.addr}
	if c.policy != nil {
		var known bool
		if l.server, known = c.policy.ConnLabels(c.local); !known && !final {
			return // its bytes are counted aside meanwhile
		}
	}
	s := c.m.conns(l)
	c.mu.Lock()
	if c.s != nil {
		c.mu.Unlock()
		return // labelled meanwhile by a read or write on another goroutine
	}
	c.s = s
	if !c.isClosed {
		c.counted = true
		s.Opened()
	}
	c.mu.Unlock()
	c.done.Store(true)
	if c.wire != nil {
		c.wire.attach(s)
	}
}

// Peer is the client's identity, as the connection inside knows it.
func (c *inboundConn) Peer() identity.Peer {
	if pc, ok := c.Conn.(peerConn); ok {
		return pc.Peer()
	}
	return identity.Peer{}
}

func (c *inboundConn) Read(b []byte) (int, error) {
	c.resolve()
	return c.Conn.Read(b)
}

func (c *inboundConn) Write(b []byte) (int, error) {
	c.resolve()
	return c.Conn.Write(b)
}

func (c *inboundConn) Close() error {
	if !c.done.Load() && c.detected.Load() {
		c.label(true) // closed while its port's policy was pending
	}
	c.mu.Lock()
	if !c.isClosed {
		c.isClosed = true
		if c.counted {
			c.s.Closed()
		}
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// loopbackTLS are the tls labels of the connections an outbound listener
// accepts from its application, as Linkerd's proxy writes them.
var loopbackTLS = classify.NewLabels("", map[string]string{"tls": "no_identity", "no_tls_reason": "loopback"})

// countAccepted wraps a listener of the application's own connections
// (those a proxy's outbound stack serves).
func (m *connMetrics) countAccepted(ln net.Listener) net.Listener {
	return &acceptedListener{Listener: ln, m: m}
}

type acceptedListener struct {
	net.Listener
	m *connMetrics
}

func (l *acceptedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	s := l.m.conns(connLabels{labels: loopbackTLS, addr: localAddr(c)})
	s.Opened()
	return &countedConn{Conn: c, s: s}, nil
}

// localAddr is the address c was accepted on, in one spelling (an
// IPv4-mapped IPv6 address as IPv4).
func localAddr(c net.Conn) string {
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
	}
	return c.LocalAddr().String()
}

// targetAddr is the address a connection was dialled to, in one spelling
// (authority.Normalize's): on the default route it is a client's Host,
// spelled as the client likes (a port with leading zeros, a name in
// capitals). It is not the socket's address, which a dial function through
// a tunnel or a proxy would make the same for every connection.
func targetAddr(addr string) string {
	if n, err := authority.Normalize(addr); err == nil {
		return n
	}
	return addr
}
