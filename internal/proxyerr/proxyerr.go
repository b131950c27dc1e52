// Package proxyerr makes the responses that inmesh's transports and
// handlers answer themselves (a timeout, no endpoints), marked as
// Linkerd's proxy marks them with l5d-proxy-error, and in gRPC's form when
// the request is gRPC, as Linkerd's proxy answers gRPC requests.
package proxyerr

import (
	"net/http"
	"strconv"
	"strings"
)

// Header is the response header that carries the reason.
const Header = "L5d-Proxy-Error"

// Response returns an empty response with status code and reason msg, for
// the request req. To a gRPC request ([IsGRPC], or gRPC-Web over HTTP/2)
// an error status (3xx and up) is answered as gRPC does, trailers-only: HTTP 200 with content-type
// application/grpc, grpc-status mapped from code ([GRPCCode]) and
// grpc-message msg, so that a gRPC client reads the reason rather than an
// HTTP status it cannot interpret.
func Response(req *http.Request, code int, msg string) *http.Response {
	resp := &http.Response{
		Status:     strconv.Itoa(code) + " " + http.StatusText(code),
		StatusCode: code,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{Header: {msg}, "Content-Type": {"text/plain; charset=utf-8"}},
		Body:    http.NoBody,
		Request: req,
	}
	if code >= 300 && req != nil && answersGRPC(req) {
		resp.Status, resp.StatusCode = "200 OK", http.StatusOK
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/2.0", 2, 0
		resp.Header["Content-Type"] = grpcContentType
		resp.Header["Grpc-Status"] = grpcStatusValues[GRPCCode(code)]
		resp.Header["Grpc-Message"] = []string{encodeGRPCMessage(msg)}
	}
	return resp
}

// Write answers r on w with status code and reason msg, as [Response]
// makes it: for handlers that answer an error themselves, such as a
// reverse proxy's error handler.
func Write(w http.ResponseWriter, r *http.Request, code int, msg string) {
	resp := Response(r, code, msg)
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(resp.StatusCode)
}

var (
	grpcContentType = []string{"application/grpc"}
	nosniff         = []string{"nosniff"}
)

// IsGRPC reports whether r is a gRPC request: its content-type is
// application/grpc, alone or with a +suffix or parameters. gRPC-Web
// (application/grpc-web), which runs over HTTP/1 too, is not.
func IsGRPC(r *http.Request) bool {
	ct := r.Header["Content-Type"]
	if len(ct) == 0 {
		return false
	}
	rest, ok := strings.CutPrefix(ct[0], "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// answersGRPC reports whether a proxy-made answer to r takes gRPC's form:
// a gRPC request, or any application/grpc* one over HTTP/2 (gRPC-Web
// included), as Linkerd's proxy decides.
func answersGRPC(r *http.Request) bool {
	if IsGRPC(r) {
		return true
	}
	ct := r.Header["Content-Type"]
	return r.ProtoMajor == 2 && len(ct) > 0 && strings.HasPrefix(ct[0], "application/grpc")
}

// The gRPC status codes that proxy-made answers use.
const (
	codeDeadlineExceeded   = 4
	codeNotFound           = 5
	codePermissionDenied   = 7
	codeResourceExhausted  = 8
	codeFailedPrecondition = 9
	codeAborted            = 10
	codeInternal           = 13
	codeUnavailable        = 14
)

// GRPCCode is the gRPC status with which Linkerd's proxy answers a gRPC
// request for which it would answer an HTTP request with status code
// (linkerd2-proxy, linkerd/app/core/src/errors/respond.rs): 504 is
// DEADLINE_EXCEEDED; 502 and 503 UNAVAILABLE; 500 INTERNAL; 403
// PERMISSION_DENIED; 404 and a redirect NOT_FOUND; 429 RESOURCE_EXHAUSTED;
// 508 ABORTED; any other status FAILED_PRECONDITION.
func GRPCCode(code int) int {
	switch {
	case code == http.StatusGatewayTimeout:
		return codeDeadlineExceeded
	case code == http.StatusBadGateway, code == http.StatusServiceUnavailable:
		return codeUnavailable
	case code == http.StatusInternalServerError:
		return codeInternal
	case code == http.StatusForbidden:
		return codePermissionDenied
	case code == http.StatusNotFound, code >= 300 && code < 400:
		return codeNotFound
	case code == http.StatusTooManyRequests:
		return codeResourceExhausted
	case code == http.StatusLoopDetected:
		return codeAborted
	}
	return codeFailedPrecondition
}

// grpcStatusValues holds the grpc-status header value of each code, never
// modified.
var grpcStatusValues = func() (v [17][]string) {
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()

// encodeGRPCMessage percent-encodes msg as gRPC's grpc-message carries it:
// every byte outside printable ASCII, and '%' itself.
func encodeGRPCMessage(msg string) string {
	i := 0
	for i < len(msg) && msg[i] >= ' ' && msg[i] <= '~' && msg[i] != '%' {
		i++
	}
	if i == len(msg) {
		return msg
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(msg) + 8)
	b.WriteString(msg[:i])
	for ; i < len(msg); i++ {
		if c := msg[i]; c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
