package classify

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A gRPC call whose response ends without any grpc-status (headers and
// data, no trailers) is what Linkerd's classifier makes it: Eos::GrpcOpen
// ends as Grpc(Ok(Unknown)) (linkerd2-proxy linkerd/app/core/src/classify.rs,
// grpc_response_trailer_missing), which response_total writes as
// classification="success", grpc_status="2", error=""
// (linkerd/app/core/src/metrics.rs, FmtLabels for Class). Never an empty
// grpc_status, which Linkerd writes only for HTTP classes and errors. The
// call is the first of a fresh stack, inbound and outbound.
func TestGRPCWithoutStatusHasResponseTotalAsLinkerd(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		m, host, trailer := grpcCallThrough(t, mode, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			_, _ = io.WriteString(w, "\x00\x00\x00\x00\x00")
			w.(http.Flusher).Flush() // the stream ends after its data, without trailers
		})
		require.Empty(t, trailer.Get("Grpc-Status"), "no status at all")
		for _, dir := range []string{"inbound", "outbound"} {
			sel := []string{`authority="` + host + `"`, `direction="` + dir + `"`}
			lines, n := m.Select(t, "response_total", sel...)
			require.Equal(t, 1.0, n, "%s: %v", dir, lines)
			_, n = m.Select(t, "response_total", append(sel, `status_code="200"`, `classification="success"`, `grpc_status="2"`, `error=""`)...)
			assert.Equal(t, 1.0, n, "%s: %v", dir, lines)
			// The success rate `linkerd viz stat` reads.
			_, failures := m.Select(t, "response_total", append(sel, `classification="failure"`)...)
			assert.Zero(t, failures, dir)
		}
	})
}

// A grpc-status past the 17 codes gRPC defines is what Linkerd's
// classifier makes it: Unknown (classify.rs grpc_code, tonic's
// Code::from_i32), a failure written grpc_status="2". A server cannot give
// the label values of its own, nor have a failing call counted as a
// success.
func TestGRPCStatusPastTheCodesHasResponseTotalAsLinkerd(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		m, host, trailer := grpcCallThrough(t, mode, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Trailer", "Grpc-Status")
			_, _ = io.WriteString(w, "\x00\x00\x00\x00\x00")
			w.Header().Set("Grpc-Status", "99")
		})
		require.Equal(t, "99", trailer.Get("Grpc-Status"), "the application's status reaches the client as sent")
		for _, dir := range []string{"inbound", "outbound"} {
			sel := []string{`authority="` + host + `"`, `direction="` + dir + `"`}
			lines, n := m.Select(t, "response_total", sel...)
			require.Equal(t, 1.0, n, "%s: %v", dir, lines)
			_, n = m.Select(t, "response_total", append(sel, `classification="failure"`, `grpc_status="2"`)...)
			assert.Equal(t, 1.0, n, "%s: %v", dir, lines)
		}
	})
}

// grpcCallThrough makes one gRPC call, in mode, through a Transport to a
// Handler in front of answer, both counting in the returned metrics; it
// returns the server's authority and the response trailers.
func grpcCallThrough(t *testing.T, mode testutil.Mode, answer func(http.ResponseWriter)) (*testutil.Metrics, string, http.Header) {
	t.Helper()
	m := testutil.NewMetrics(t)
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { answer(w) })
	srv := testutil.NewServer(t, NewHandler(app, WithMeterProvider(m.Provider)))
	client := &http.Client{Transport: NewTransport(testutil.NewTransport(t, mode), WithMeterProvider(m.Provider))}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/pkg.Svc/Call", nil)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return m, strings.TrimPrefix(srv.URL, "http://"), resp.Trailer
}
