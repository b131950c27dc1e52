// Package classify decides whether an HTTP exchange succeeded, with
// Linkerd's rules, and records the request and response metrics that the
// decision labels.
//
// A [Classifier] works in two phases: at the response head (status and
// headers) and, when the head did not settle it, at the end of the stream
// (trailers, so that a grpc-status trailer counts). Its zero value applies
// the defaults: a route's response classes when it has them, then gRPC
// status (failure for codes 2, 4, 7, 13, 14 and 15), then failure exactly
// for 5xx. Without a route's classes, a gRPC call is classified by its
// gRPC status alone (none is a success) and a plain HTTP request by its
// status alone. Errors are failures labelled timeout, h2(REASON) or
// unclassified.
//
// [NewHandler] and [NewTransport] record request_total, response_total
// (with status_code, classification, grpc_status and error) and
// response_latency_ms (Linkerd's buckets, in milliseconds) through the
// OpenTelemetry metric API; nothing is recorded until the application
// installs a MeterProvider. A request its caller gave up on before any
// response head ([Abandoned]: the client went away, the application
// cancelled) is counted in request_total and has no response, as in
// Linkerd's proxy.
package classify
