// Package proxyerr makes the responses that inmesh's transports answer
// themselves (a timeout, no endpoints), marked as Linkerd's proxy marks
// them with l5d-proxy-error.
package proxyerr

import (
	"net/http"
	"strconv"
)

// Header is the response header that carries the reason.
const Header = "L5d-Proxy-Error"

// Response returns an empty response with status code and reason msg, for
// the request req.
func Response(req *http.Request, code int, msg string) *http.Response {
	return &http.Response{
		Status:     strconv.Itoa(code) + " " + http.StatusText(code),
		StatusCode: code,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{Header: {msg}, "Content-Type": {"text/plain; charset=utf-8"}},
		Body:    http.NoBody,
		Request: req,
	}
}
