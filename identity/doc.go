// Package identity gives a Go process a Linkerd workload identity and the
// mutual TLS that goes with it.
//
// A [Local] is the process's own identity: a DNS-like name such as
// books.default.serviceaccount.identity.linkerd.cluster.local, an ECDSA
// P-256 key made in the process (it never leaves it) and a certificate
// signing request naming exactly that identity, as Linkerd's proxy makes
// them. A certificate is installed only after its chain to the trust
// anchors and its name verify; until the first one arrives the identity
// is not ready ([Local.Ready]).
//
// A [Certifier] obtains and renews the certificate from an Identity
// service (Linkerd's identity controller, or inmesh's embedded issuer)
// through its Certify API: the token is read from its file for every
// request, since projected tokens rotate; renewal comes at 70% of the
// certificate's life, within a minimum and maximum refresh interval; a
// failed renewal keeps the current certificate in use until it expires,
// and a failed certification is tried again after a backoff from 100ms up
// to the minimum refresh interval. A certificate that has expired ends
// meshed connections both ways (see [Local.ClientConfig]) until renewed.
//
// [Local.ClientConfig] and [Local.ServerConfig] build the tls.Configs of
// both sides of a meshed connection. They pick the current certificate
// per handshake, so a renewal needs no restart and drops no connection.
// The client sends the server's identity as SNI and accepts only a chain
// to the anchors whose leaf carries that identity; the server asks for a
// client certificate, verifies one against the anchors when given, and
// admits a client without one. Both speak TLS 1.3 only and offer no ALPN,
// as Linkerd's proxies do between meshed HTTP peers.
//
// [Start] is a workload's bootstrap in one call: from a [Config] naming
// the identity, the trust anchors, the token file and the Identity
// service, it makes the Local, certifies it and keeps it renewed until
// [Session.Close]; [Session.Local] goes to mesh.WithIdentity and
// meshgrpc.WithIdentity.
//
// The verified identity of a peer travels in a request's context
// ([WithPeer], [PeerFromContext]).
package identity
