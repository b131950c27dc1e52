// Package balancer sends each request to one endpoint of its authority:
// power of two choices over a peak-EWMA load estimate, as Linkerd and
// Finagle balance.
//
// A [Balancer] learns the endpoints of each authority from a [Source]: the
// destination client's Get stream (destination.Client is a Source), or a
// [StaticSource] for a program without a control plane. With a
// profiles.Source ([WithProfiles]) it also applies the traffic split of
// each authority's profile (its dst overrides, a [Split]).
//
// Each endpoint's load is its round-trip-time estimate times the number of
// its requests in flight plus one. A new endpoint starts at a default RTT
// (30 ms); a response head slower than the estimate raises it at once, a
// faster one pulls it down by an exponential average with a 10 s time
// constant, and the estimate decays while the endpoint is idle. A request
// stays in flight until its response body ends, fails or is closed. A
// request that fails without a response (connection refused or reset)
// counts as a penalty RTT (5 s), not as a fast answer. Two endpoints are
// drawn at random by weight; the second wins only when its load is clearly
// lower (by a quarter), so that endpoints of about equal load share traffic
// by weight while a real difference in load decides otherwise.
//
// Everything a request reads (the split, the endpoint set and its weights)
// is one immutable snapshot behind an atomic pointer; updates build a new
// snapshot and never block requests. Load statistics are kept across
// updates for the endpoints that stay.
package balancer
