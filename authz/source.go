package authz

// Source delivers the Servers of ports. Watch calls update with the
// current Server of port, if it has one, and again on each change, until
// stop is called; update may be called from Watch itself. Updates of one
// port must not be delivered concurrently.
type Source interface {
	Watch(port uint16, update func(*Server)) (stop func())
}

// StaticSource is a Source of fixed Servers by port; other ports keep the
// Handler's default.
type StaticSource map[uint16]*Server

// Watch delivers port's Server, if any, at once.
func (s StaticSource) Watch(port uint16, update func(*Server)) func() {
	if srv := s[port]; srv != nil {
		update(srv)
	}
	return func() {}
}
