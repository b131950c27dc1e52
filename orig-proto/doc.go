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
// again. CONNECT, protocol upgrades (except h2c, which is stripped) and
// requests that are already HTTP/2 pass through untouched.
//
// The header's values are exactly those of Linkerd: "HTTP/1.1", "HTTP/1.0",
// each optionally followed by "; absolute-form". Anything else is a 400.
// l5d-* request headers from peers that are not trusted are removed.
//
// Import it with an explicit name, as the directory is orig-proto:
//
//	import origproto "github.com/inmesh/inmesh/orig-proto"
package origproto
