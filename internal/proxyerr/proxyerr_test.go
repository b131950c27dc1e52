package proxyerr

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The gRPC status of each proxy-made answer, as linkerd2-proxy's
// SyntheticHttpResponse pairs them (linkerd/app/core/src/errors/respond.rs:
// internal_error, bad_gateway, gateway_timeout, unavailable,
// permission_denied, rate_limited, loop_detected, not_found, redirect,
// response).
func TestGRPCCode(t *testing.T) {
	for _, tc := range []struct {
		http, grpc int
	}{
		{500, 13}, {502, 14}, {504, 4}, {503, 14}, {403, 7}, {429, 8}, {508, 10}, {404, 5},
		{301, 5}, {302, 5}, {307, 5}, {308, 5}, {400, 9}, {418, 9},
	} {
		assert.Equal(t, tc.grpc, GRPCCode(tc.http), "HTTP %d", tc.http)
	}
}

func TestResponseToGRPCRequestIsTrailersOnly(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/pkg.Svc/M", nil)
	req.Header.Set("Content-Type", "application/grpc+proto")
	resp := Response(req, http.StatusGatewayTimeout, "request timed out after 1s: 100% of it")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "application/grpc", resp.Header.Get("Content-Type"))
	assert.Equal(t, "4", resp.Header.Get("Grpc-Status"))
	assert.Equal(t, "request timed out after 1s: 100%25 of it", resp.Header.Get("Grpc-Message"), "percent-encoded")
	assert.Equal(t, "request timed out after 1s: 100% of it", resp.Header.Get(Header))
	assert.Empty(t, resp.Trailer)

	// gRPC-Web over HTTP/2 is answered as gRPC, as Linkerd's proxy does.
	req.Header.Set("Content-Type", "application/grpc-web+proto")
	req.ProtoMajor = 2
	assert.Equal(t, "14", Response(req, http.StatusServiceUnavailable, "no endpoints").Header.Get("Grpc-Status"))
	req.ProtoMajor = 1

	// gRPC-Web over HTTP/1 and plain HTTP get the HTTP status.
	for _, ct := range []string{"application/grpc-web", "text/plain", ""} {
		req.Header.Set("Content-Type", ct)
		resp = Response(req, http.StatusServiceUnavailable, "no endpoints")
		assert.Equal(t, 503, resp.StatusCode, ct)
		assert.Empty(t, resp.Header.Get("Grpc-Status"), ct)
	}
}

func TestWrite(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/pkg.Svc/M", nil)
	req.Header.Set("Content-Type", "application/grpc")
	w := httptest.NewRecorder()
	Write(w, req, http.StatusBadGateway, "upstream request failed: dial")
	assert.Equal(t, 200, w.Code)
	assert.Equal(t, "14", w.Header().Get("Grpc-Status"))
	assert.Equal(t, "upstream request failed: dial", w.Header().Get(Header))

	req.Header.Del("Content-Type")
	w = httptest.NewRecorder()
	Write(w, req, http.StatusBadGateway, "upstream request failed: dial")
	assert.Equal(t, 502, w.Code)
	assert.Empty(t, w.Header().Get("Grpc-Status"))
}

func TestEncodeGRPCMessage(t *testing.T) {
	for in, want := range map[string]string{
		"":               "",
		"plain text":     "plain text",
		"tab\there":      "tab%09here",
		"50%":            "50%25",
		"caf\xc3\xa9":    "caf%C3%A9",
		"line\r\nbreaks": "line%0D%0Abreaks",
	} {
		assert.Equal(t, want, encodeGRPCMessage(in), "%q", in)
	}
}
