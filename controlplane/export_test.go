package controlplane

import (
	"maps"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"

	"google.golang.org/grpc"
)

// SetBoundHook makes f run in each registration's handler after it
// subscribed to its binding; the returned function removes it.
func SetBoundHook(f func()) (restore func()) {
	boundHook.Store(&f)
	return func() { boundHook.Store(nil) }
}

// Fresh returns a new Store given s's state as it is now (endpoint sets,
// registrations, manifests, inbound options, profiles) in one go, as a
// control plane started with that state would hold it.
func (s *Store) Fresh() *Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := NewStore()
	f.SetEndpoints(s.files)
	for id, sets := range s.registered {
		f.PutRegistered(id, sets)
	}
	f.SetManifests(s.manifests)
	f.SetInboundOptions(s.inbound)
	for _, sp := range s.profiles {
		f.PutServiceProfile(sp)
	}
	return f
}

// ServeGRPC serves g on a loopback port until the test ends and returns
// its address.
func ServeGRPC(t testing.TB, g *grpc.Server) string { return serveGRPC(t, g) }

// EndpointSets returns the endpoint sets the store serves, by authority.
func (s *Store) EndpointSets() map[string][]endpoint.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.endpoints)
}
