package meshgrpc

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/inmesh/inmesh/identity"
)

// clientCreds are the transport credentials of a mesh client: mTLS to an
// endpoint that discovery gave an identity, plaintext to one it gave none.
//
// The expected identity is the endpoint's, from its address attributes
// (credentials.ClientHandshakeInfo), not the authority argument: SNI is
// the identity, as Linkerd's proxy sends it (a meshed server terminates
// TLS only for its own name), while the channel's authority stays the
// :authority of the calls. The server's chain must lead to the local
// identity's trust anchors and its leaf carry the identity; the local
// certificate is presented. TLS 1.3, no ALPN, as between Linkerd proxies
// (grpc-go's own TLS credentials insist on ALPN h2, which a Linkerd
// proxy's server never selects). A failed handshake fails the connection
// attempt; grpc-go answers the calls waiting for it with UNAVAILABLE and
// the identity error as the reason, and tries again with backoff.
type clientCreds struct {
	local *identity.Local
}

func newClientCreds(local *identity.Local) credentials.TransportCredentials {
	return &clientCreds{local: local}
}

// MeshTLSInfo is the AuthInfo of a connection that a mesh client's
// credentials ([WithIdentity]) made over mTLS, as grpc.Peer gives it: the
// TLS state, in which the server proved the endpoint's identity. Unlike
// credentials.TLSInfo it accepts any :authority a call carries (an
// endpoint's authority override, grpc.CallAuthority): the endpoint is
// verified by its identity, not by the authority, which names the service
// behind it, as between Linkerd's proxies (a multicluster gateway's
// endpoint names the remote service so).
type MeshTLSInfo struct{ credentials.TLSInfo }

// ValidateAuthority accepts every authority (see [MeshTLSInfo]).
func (MeshTLSInfo) ValidateAuthority(string) error { return nil }

// plainInfo is the AuthInfo of a plaintext connection; like grpc-go's
// insecure credentials, it accepts any :authority.
type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "insecure" }

func (plainInfo) ValidateAuthority(string) error { return nil }

var (
	_ credentials.AuthorityValidator = MeshTLSInfo{}
	_ credentials.AuthorityValidator = plainInfo{}
)

func (c *clientCreds) ClientHandshake(ctx context.Context, _ string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	id, serverName := endpointIdentity(credentials.ClientHandshakeInfoFromContext(ctx).Attributes)
	if id == "" || c.local == nil {
		return raw, plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	if err := c.local.Wait(ctx); err != nil {
		raw.Close()
		return nil, nil, &identity.IdentityError{Expected: id, Err: err}
	}
	conn := tls.Client(raw, c.local.ClientConfigFor(id, serverName))
	if err := conn.HandshakeContext(ctx); err != nil {
		conn.Close()
		var ie *identity.IdentityError
		if !errors.As(err, &ie) {
			err = &identity.IdentityError{Expected: id, Err: err}
		}
		return nil, nil, err
	}
	return conn, MeshTLSInfo{credentials.TLSInfo{State: conn.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}}, nil
}

func (c *clientCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("meshgrpc: the client credentials do not serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c *clientCreds) Clone() credentials.TransportCredentials { return &clientCreds{local: c.local} }

// OverrideServerName is unused by grpc-go (deprecated); the server name is
// each endpoint's identity.
func (c *clientCreds) OverrideServerName(string) error { return nil }
