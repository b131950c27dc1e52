package meshgrpc

import (
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"
)

// identityKey is the key of an endpoint's TLS identity in its
// resolver.Address attributes: the resolver sets it from discovery, the
// transport credentials read it (credentials.ClientHandshakeInfo.Attributes)
// to verify the server.
type identityKey struct{}

// endpointTLS is an endpoint's identity and the TLS server name to send
// when it differs (discovery's server_name).
type endpointTLS struct{ id, serverName string }

// withEndpointIdentity returns addr carrying id as its endpoint's identity
// and serverName as its TLS server name ("": id).
func withEndpointIdentity(addr resolver.Address, id, serverName string) resolver.Address {
	if id == "" {
		return addr
	}
	addr.Attributes = addr.Attributes.WithValue(identityKey{}, endpointTLS{id: id, serverName: serverName})
	return addr
}

// endpointIdentity is the identity and server name withEndpointIdentity
// put in attrs, or empty ones.
func endpointIdentity(attrs *attributes.Attributes) (id, serverName string) {
	e, _ := attrs.Value(identityKey{}).(endpointTLS)
	return e.id, e.serverName
}
