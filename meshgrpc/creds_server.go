package meshgrpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/inmesh/inmesh/identity"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

// InboundAuthInfo is what a server's transport credentials
// ([ServerOptions] with [WithIdentity]) say of a client's connection, in
// peer.FromContext(ctx).AuthInfo: its mesh TLS and verified identity
// (Peer; zero for plaintext) and, for TLS, the connection's state.
type InboundAuthInfo struct {
	credentials.CommonAuthInfo
	// Peer is the client as the TLS handshake verified it: TLS true for
	// meshed TLS, ID its identity (empty when it showed no certificate).
	Peer identity.Peer
	// State is the TLS connection state; the zero value for plaintext.
	State tls.ConnectionState
}

// AuthType returns "tls" for meshed TLS and "insecure" for plaintext.
func (a InboundAuthInfo) AuthType() string {
	if a.Peer.TLS {
		return "tls"
	}
	return "insecure"
}

// tlsRecordHandshake is the first byte of a TLS connection: the content
// type of the record that carries the ClientHello.
const tlsRecordHandshake = 0x16

// errClientOnly is the error of ClientHandshake on server credentials.
var errClientOnly = errors.New("meshgrpc: server credentials cannot dial")

// serverCreds serve meshed mTLS and plaintext on one port, as the HTTP
// stack's listener does (origproto.MeshTLSListener): a connection that
// opens with a TLS handshake record is a TLS client, terminated with the
// listener's configuration (origproto.MeshTLSConfig: the ClientHello must
// name the local identity as SNI, the client's certificate is asked for
// and verified against the anchors when it shows one, and it may show
// none); any other connection is served as plaintext HTTP/2. What a
// client may then call is the inbound policy's to decide, per call.
//
// The server offers ALPN "h2" beside what ServerConfig sets: grpc-go
// clients offer h2 and refuse a server that selects nothing, while
// Linkerd's proxies offer no ALPN, which the handshake accepts as well.
type serverCreds struct {
	cfg  *tls.Config
	info credentials.ProtocolInfo
}

func newServerCreds(local *identity.Local) *serverCreds {
	cfg := origproto.MeshTLSConfig(local)
	cfg.NextProtos = []string{"h2"}
	return &serverCreds{cfg: cfg, info: credentials.ProtocolInfo{SecurityProtocol: "tls"}}
}

var _ credentials.TransportCredentials = (*serverCreds)(nil)

// ServerHandshake reads the connection's first byte to tell TLS from
// plaintext; grpc-go's connection timeout (grpc.ConnectionTimeout) bounds
// it and the TLS handshake.
func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pc := &prefixConn{Conn: raw}
	if _, err := io.ReadFull(raw, pc.first[:]); err != nil {
		return nil, nil, err
	}
	pc.rest = pc.first[:]
	if pc.first[0] != tlsRecordHandshake {
		return pc, InboundAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	conn := tls.Server(pc, c.cfg)
	if err := conn.Handshake(); err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("meshgrpc: meshed TLS handshake failed: %w", err)
	}
	cs := conn.ConnectionState()
	return conn, InboundAuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		Peer:           identity.PeerFromState(&cs),
		State:          cs,
	}, nil
}

// ClientHandshake fails: these credentials only serve.
func (c *serverCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errClientOnly
}

func (c *serverCreds) Info() credentials.ProtocolInfo { return c.info }

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{cfg: c.cfg.Clone(), info: c.info}
}

// OverrideServerName does nothing; gRPC no longer calls it.
func (c *serverCreds) OverrideServerName(string) error { return nil }

// prefixConn reads the byte read to tell TLS from plaintext before the
// rest of its connection.
type prefixConn struct {
	net.Conn
	first [1]byte
	rest  []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.rest) > 0 {
		n := copy(b, c.rest)
		c.rest = c.rest[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
