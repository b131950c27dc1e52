package meshgrpc

import (
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"
)

// identityKey is the key of an endpoint's identity in its resolver.Address
// attributes: the resolver sets it from discovery, the transport credentials
// read it (credentials.ClientHandshakeInfo.Attributes) to verify the server.
type identityKey struct{}

// withEndpointIdentity returns addr carrying id as its endpoint's identity.
func withEndpointIdentity(addr resolver.Address, id string) resolver.Address {
	if id == "" {
		return addr
	}
	addr.Attributes = addr.Attributes.WithValue(identityKey{}, id)
	return addr
}

// endpointIdentity is the identity withEndpointIdentity put in attrs, or "".
func endpointIdentity(attrs *attributes.Attributes) string {
	id, _ := attrs.Value(identityKey{}).(string)
	return id
}
