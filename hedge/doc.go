// Package hedge is the model and the bookkeeping of hedged requests, in the
// manner of Finagle's backup requests: when a request of a route has had no
// answer after a delay (fixed, or a percentile of the route's own observed
// latency), a second copy goes to a different endpoint, the first answer
// wins and the other is cancelled. Only requests that are safe to send
// twice are hedged (idempotent methods, or a route marked idempotent), and
// the copies are bounded by a share of extra load.
//
// [Policy] is plain data (the route models carry it); [State] is one
// route's running state: the latency it learnt and the share of extra load
// left. Which endpoint a hedge goes to is the balancer's choice (it
// excludes the endpoints the request already tried); when and whether to
// hedge is the router's and meshgrpc's, through a State.
package hedge
