package authz

// Source delivers the Servers of ports. Watch calls update with the
// current Server of port, and again on each change, until stop is called;
// update may be called from Watch itself. update(nil) says that the source
// has no Server for the port and will not have one soon (no such port, a
// watch the control plane refused): the Handler's default applies at once,
// or the last Server delivered stays. Until the first call, the port's
// requests wait ([WithPolicyWait]). Updates of one port must not be
// delivered concurrently.
type Source interface {
	Watch(port uint16, update func(*Server)) (stop func())
}

// PendingCause is an interface a [Source] may also implement, to say why
// the first answer for a port has not come: the last error met on the way
// to the control plane (a refused connection, a failed TLS handshake, a
// stream that broke), or nil when it knows of none. When the wait for a
// port's first answer ends without one ([WithPolicyWait]), the Handler's
// warning names it. PendingCause must not block.
type PendingCause interface {
	Pending(port uint16) error
}

// StaticSource is a Source of fixed Servers by port; other ports get the
// Handler's default at once.
type StaticSource map[uint16]*Server

// Watch delivers port's Server, or nil when it has none, at once.
func (s StaticSource) Watch(port uint16, update func(*Server)) func() {
	update(s[port])
	return func() {}
}
