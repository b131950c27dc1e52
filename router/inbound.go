package router

import "net/http"

// Handler returns the inbound side of the router around next: each
// request for one of the server's own authorities ([WithLocalAuthorities])
// is routed by its ServiceProfile; every other request takes the default
// route, labelled dst="other" ([OtherAuthority]), and never makes the
// router watch its Host. The route goes into the request's context
// ([ProfileRouteFromContext]), where classify finds its response classes,
// and the request is recorded in the route_* metrics with
// direction="inbound". Inbound routes are neither retried nor timed out,
// and outbound policies play no part.
//
// HTTP/1 requests are served full duplex ([http.ResponseController.EnableFullDuplex]):
// the application may answer, or stream its answer, while the request body
// still arrives, where Go's HTTP/1 server would otherwise wait for the whole
// body before it writes a response.
func (r *Router) Handler(next http.Handler) http.Handler { return r.prof.Handler(next) }
