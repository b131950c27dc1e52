package metrics

import (
	"net/netip"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// TCP is the families of Linkerd's proxy for its connections:
// tcp_open_total, tcp_close_total, tcp_open_connections,
// tcp_read_bytes_total and tcp_write_bytes_total (as
// linkerd/transport-metrics names them; its tcp_connection_duration_ms is
// gone), which `linkerd viz edges` and the TCP columns of `linkerd viz
// stat` read. It is safe for concurrent use.
type TCP struct {
	open, close, now, read, write *Sum
}

// NewTCP creates the families on meter. Errors go to otel.Handle.
func NewTCP(meter metric.Meter) *TCP {
	return &TCP{
		open:  NewSum(meter, "tcp_open_total", "Total count of opened connections"),
		close: NewSum(meter, "tcp_close_total", "Total count of closed connections"),
		now:   NewGauge(meter, "tcp_open_connections", "Number of currently-open connections"),
		read:  NewSum(meter, "tcp_read_bytes_total", "Total count of bytes read from peers"),
		write: NewSum(meter, "tcp_write_bytes_total", "Total count of bytes written to peers"),
	}
}

// Conns are the series of one label set of [TCP]: the connections of one
// direction, peer and TLS state (and endpoint, on the outbound side).
type Conns struct {
	open, close, now, read, write *Series
}

// Conns returns the series of the labels kvs (closes add errno="", as
// Linkerd's do for a connection that ended without an error).
func (t *TCP) Conns(kvs ...attribute.KeyValue) *Conns {
	set := attribute.NewSet(slices.Clone(kvs)...)
	closed := attribute.NewSet(append(slices.Clone(kvs), attribute.String("errno", ""))...)
	return &Conns{open: t.open.Series(set), now: t.now.Series(set), read: t.read.Series(set), write: t.write.Series(set),
		close: t.close.Series(closed)}
}

// Opened counts a connection opened.
func (c *Conns) Opened() {
	c.open.Add()
	c.now.AddN(1)
}

// Closed counts a connection closed.
func (c *Conns) Closed() {
	c.close.Add()
	c.now.AddN(-1)
}

// Read counts n bytes read.
func (c *Conns) Read(n int) { c.read.AddN(int64(n)) }

// Wrote counts n bytes written.
func (c *Conns) Wrote(n int) { c.write.AddN(int64(n)) }

// TargetLabels are target_addr, target_ip and target_port of addr, as
// Linkerd's proxy writes an address on its endpoint and connection
// families (linkerd/app/core transport/labels.rs, TargetAddr): the address,
// its IP (an IPv6 one without brackets) and its port.
func TargetLabels(addr netip.AddrPort) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("target_addr", addr.String()),
		attribute.String("target_ip", addr.Addr().String()),
		attribute.String("target_port", strconv.Itoa(int(addr.Port()))),
	}
}

// TCPRoutes is the outbound_tcp_route_open_total and
// outbound_tcp_route_close_total families of Linkerd's proxy
// (linkerd/app/outbound/src/metrics/transport.rs): the connections of an
// opaque route, and how each ended (error "" or forbidden,
// invalid_backend, invalid_policy, unexpected). inmesh sends no TCP of
// its own, so only one kind is counted: a request refused because its
// target's opaque route forbids the connection, which is the connection
// Linkerd's proxy opens on that route and closes with error="forbidden".
// It is safe for concurrent use.
type TCPRoutes struct {
	open, close *Sum
}

// NewTCPRoutes creates the families on meter. Errors go to otel.Handle.
func NewTCPRoutes(meter metric.Meter) *TCPRoutes {
	return &TCPRoutes{
		open:  NewSum(meter, "outbound_tcp_route_open_total", "The number of connections opened"),
		close: NewSum(meter, "outbound_tcp_route_close_total", "The number of connections closed"),
	}
}

// Forbidden returns the series of a forbidden route's connections, whose
// labels are kvs (the parent, route and target labels): opens, and closes
// with error="forbidden".
func (t *TCPRoutes) Forbidden(kvs ...attribute.KeyValue) *ForbiddenConns {
	return &ForbiddenConns{
		open:  t.open.Series(attribute.NewSet(slices.Clone(kvs)...)),
		close: t.close.Series(attribute.NewSet(append(slices.Clone(kvs), attribute.String("error", "forbidden"))...)),
	}
}

// ForbiddenConns are the series of one forbidden route; see
// [TCPRoutes.Forbidden].
type ForbiddenConns struct {
	open, close *Series
}

// Refused counts a connection opened on the route and closed as
// forbidden. A nil c counts nothing.
func (c *ForbiddenConns) Refused() {
	if c == nil {
		return
	}
	c.open.Add()
	c.close.Add()
}
