// Package origproto carries HTTP/1 requests between mesh peers over one
// multiplexed HTTP/2 connection, the way Linkerd's proxies do, and turns
// them back into HTTP/1 before the application sees them.
//
// The sending side, [Transport], takes an eligible HTTP/1.0 or HTTP/1.1
// request for a peer that is itself a mesh proxy (discovery's h2 protocol
// hint, see [WithPeer] and [WithHint]), strips its hop-by-hop headers, adds
// l5d-orig-proto with the original protocol and sends it as HTTP/2. The
// receiving side, [NewHandler], restores the HTTP/1 request from a trusted
// peer and echoes the header on the response, which the sender removes
// again. CONNECT and protocol upgrades (except h2c, which is stripped)
// pass through untouched. A request that is already HTTP/2, or is gRPC,
// stays HTTP/2 on every hop: the Transport sends it over HTTP/2 to any
// endpoint, peer or not, without l5d-orig-proto, and the Handler passes it
// on as it came, trailers, streaming and cancellation intact.
//
// The Transport also honours l5d-require-id ([RequireIDHeader]) as
// Linkerd's outbound proxy does: the request is sent, without the header,
// only when its endpoint proves that identity over mTLS
// ([WithClientIdentity], [WithServerIdentity]), and is answered 502
// otherwise.
//
// The header's values are exactly those of Linkerd: "HTTP/1.1", "HTTP/1.0",
// each optionally followed by "; absolute-form". Anything else is a 400.
// l5d-* request headers from peers that are not trusted are removed.
//
// [NewServer] serves HTTP/1 and HTTP/2 with prior knowledge on one port.
// Serve it on [GuardListener], which refuses HTTP/1 requests whose framing
// two parsers could read differently (Content-Length with
// Transfer-Encoding, obs-fold, bare LF) with 400 and a closed connection,
// and closes HTTP/2 connections whose header blocks are not finished in
// time or are split into a flood of CONTINUATION frames. The guard fits
// any net/http server; [CheckHTTP2Request] is the check of HTTP/2 request
// pseudo-headers that NewServer and [NewHandler] apply.
//
// Import it with an explicit name, as the directory is orig-proto:
//
//	import origproto "github.com/inmesh/inmesh/orig-proto"
package origproto
